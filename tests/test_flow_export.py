"""``terrain export flow/direction --encoding``: each tool's documented direction values, written
here from their definitions, read back from the GeoTIFF; the log-scaled accumulation picture."""
from __future__ import annotations

import math

import numpy as np
import pytest

from references import DC, DR, holed
import rasterio
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.grid.flow.codes import NODATA, OUTLET, SINK
from terrain_io.grid.flow.pipeline import flow, read_flow
from terrain_io.store import TerrainStore

_register()
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")
NAMES = ("E", "SE", "S", "SW", "W", "NW", "N", "NE")  # our codes 0..7


def grass_value(d):
    """r.watershed drainage: the value times 45 is the direction in degrees counter-clockwise from east."""
    degrees = math.degrees(math.atan2(-DR[d], DC[d])) % 360  # row grows southward: north is -row
    return round(degrees / 45) or 8


DEFINITIONS = {  # each tool's documentation, direction name -> value
    "esri": {"E": 1, "SE": 2, "S": 4, "SW": 8, "W": 16, "NW": 32, "N": 64, "NE": 128},  # ArcGIS Flow Direction
    "taudem": {"E": 1, "NE": 2, "N": 3, "NW": 4, "W": 5, "SW": 6, "S": 7, "SE": 8},  # D8FlowDir
    "grass": {NAMES[d]: grass_value(d) for d in range(8)},
    "whitebox": {"NE": 1, "E": 2, "SE": 4, "S": 8, "SW": 16, "W": 32, "NW": 64, "N": 128},  # D8Pointer
}


def test_grass_definition_reads_as_documented():
    assert DEFINITIONS["grass"] == {"NE": 1, "N": 2, "NW": 3, "W": 4, "SW": 5, "S": 6, "SE": 7, "E": 8}


def test_esri_equals_pyflwdir_d8():
    core_d8 = pytest.importorskip("pyflwdir.core_d8")
    for d in range(8):
        assert core_d8._ds[DR[d] + 1, DC[d] + 1] == DEFINITIONS["esri"][NAMES[d]]


@pytest.mark.parametrize("encoding", ["esri", "taudem", "grass", "whitebox"])
def test_export_encodings(tmp_path, encoding):
    z, valid = holed()
    z = z.astype(np.float32)
    z[3, 3] = -50.0  # a pit: SINK
    st = TerrainStore.from_array(tmp_path / "a.zarr", z, tile=8, shard=2)
    flow(st, condition="none", progress=False)
    code = read_flow(st)["direction"]
    assert {OUTLET, SINK, NODATA} <= set(np.unique(code).tolist())
    out = tmp_path / f"{encoding}.tif"
    r = CliRunner().invoke(cli, ["-q", "export", str(st.path), "flow/direction", "-o", str(out),
                                 "--encoding", encoding])
    assert r.exit_code == 0, r.output
    with rasterio.open(out) as f:
        got, nodata = f.read(1), f.nodata
    table = DEFINITIONS[encoding]
    rows, cols = code.shape
    for r_ in range(rows):
        for c in range(cols):
            k = code[r_, c]
            if k < 8:
                assert got[r_, c] == table[NAMES[k]]
            elif k == NODATA:
                assert got[r_, c] == nodata
            elif k == SINK:
                assert got[r_, c] == (nodata if encoding == "taudem" else 0)
            elif encoding in ("esri", "grass"):  # outlets point out of the DEM (GRASS: negative)
                value = abs(int(got[r_, c]))
                assert (encoding == "grass") == (got[r_, c] < 0)
                d = [NAMES.index(n) for n, v in table.items() if v == value][0]
                rr, cc = r_ + DR[d], c + DC[d]
                assert not (0 <= rr < rows and 0 <= cc < cols) or code[rr, cc] == NODATA
            else:
                assert got[r_, c] == (nodata if encoding == "taudem" else 0)


def test_encoding_refused_for_other_arrays_and_formats(tmp_path):
    z, _ = holed()
    st = TerrainStore.from_array(tmp_path / "a.zarr", z.astype(np.float32), tile=8, shard=2)
    flow(st, condition="none", progress=False)
    for array, name in (("elevation", "e.tif"), ("flow/direction", "d.asc")):
        r = CliRunner().invoke(cli, ["export", str(st.path), array, "-o", str(tmp_path / name), "--encoding", "esri"])
        assert r.exit_code == 1 and r.output.startswith("terrain: error: ") and r.output.count("\n") == 1
        assert not (tmp_path / name).exists()


def test_accumulation_picture_is_log_scaled(tmp_path):
    z, valid = holed()
    st = TerrainStore.from_array(tmp_path / "a.zarr", z.astype(np.float32), tile=8, shard=2)
    flow(st, condition="none", progress=False)
    acc = read_flow(st)["accumulation"].astype(np.float64)
    out = tmp_path / "acc.png"
    r = CliRunner().invoke(cli, ["-q", "export", str(st.path), "flow/accumulation", "-o", str(out)])
    assert r.exit_code == 0, r.output
    with rasterio.open(out) as f:
        img = f.read()
    rows, cols = acc.shape
    blue = img[2, :rows, :cols].astype(np.float64)  # the Blues ramp darkens as the value grows
    red = img[0, :rows, :cols].astype(np.float64)
    assert np.all(img[3, :rows, :cols][~valid] == 0) and np.all(img[3, :rows, :cols][valid] == 255)
    lo, hi = np.unravel_index(np.argmin(np.where(valid, acc, np.inf)), acc.shape), np.unravel_index(
        np.argmax(acc), acc.shape)
    assert red[hi] < red[lo] and blue[hi] < blue[lo]
    # log scale: a cell of value sqrt(max) takes the ramp's middle colour
    mid = np.argmin(np.abs(np.where(valid, np.log10(np.maximum(acc, 1)), np.inf) - np.log10(acc.max()) / 2))
    from terrain_io.export import BLUES, colorize

    expect = colorize(np.array([np.log10(acc.ravel()[mid])]), BLUES, (0.0, np.log10(acc.max())))[0]
    assert np.allclose(img[:3, :rows, :cols].reshape(3, -1)[:, mid], expect, atol=1.0)
