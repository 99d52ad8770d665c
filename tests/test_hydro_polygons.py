"""Issue 30's polygons out of core (``watershed``/``basins -o`` when the label raster does not fit
``--memory``): traced by GDAL's polygonize from a GeoTIFF of the labels written shard by shard, the
same features as the raster traced in memory, and covering exactly their cells (burnt back by GDAL's
rasterize, the format's independent reading of the polygons)."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, utm_store
from terrain_io.store import TerrainStore

_register()
pyogrio = pytest.importorskip("pyogrio")
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")
SHAPE = (120, 150)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    path = tmp_path_factory.mktemp("hydro_polygons") / "a.zarr"
    utm_store(path, hydro_dem(4, shape=SHAPE).astype(np.float32), tile=8, shard=4)
    res = CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    return path


def _features(out):
    meta, _, geometry, values = pyogrio.raw.read(out)
    return meta["crs"], list(geometry), {k: list(v) for k, v in zip(meta["fields"], values)}


def _burnt(geometry, ids, transform, shape):
    """The polygons rasterized at cell centres (GDAL), each by its id."""
    import json

    from affine import Affine
    from rasterio import features

    shapes = []
    for wkb, i in zip(geometry, ids):
        nrings, off, rings = int(np.frombuffer(wkb[5:9], "<u4")[0]), 9, []
        for _ in range(nrings):
            n = int(np.frombuffer(wkb[off: off + 4], "<u4")[0])
            rings.append(np.frombuffer(wkb[off + 4: off + 4 + 16 * n], "<f8").reshape(n, 2).tolist())
            off += 4 + 16 * n
        shapes.append((json.loads(json.dumps({"type": "Polygon", "coordinates": rings})), int(i)))
    return features.rasterize(shapes, out_shape=shape, transform=Affine.from_gdal(*transform), dtype="int32")


@pytest.mark.parametrize("command", [["basins"], ["watershed", "--cell", "60,70", "--cell", "100,40", "--cell", "20,130"]])
def test_polygons_beyond_the_budget_equal_those_traced_in_memory(routed, tmp_path, monkeypatch, command):
    from terrain_io.grid.hydro import pipeline as P

    runs = {}
    for tag in ("held", "disk"):
        if tag == "disk":  # the label raster beyond any budget (before: refused with one line)
            monkeypatch.setattr(P, "POLYGON_BYTES", 2**40)
            written = []
            monkeypatch.setattr(P, "_label_tiffs", lambda *a, f=P._label_tiffs: written.append(a[1]) or f(*a))
        out = tmp_path / f"{tag}.gpkg"
        res = CliRunner().invoke(cli, [command[0], str(routed), *command[1:], "-o", str(out), "--device", "cpu"])
        assert res.exit_code == 0, res.output
        runs[tag] = _features(out)
    assert written == [f"{'basins' if command[0] == 'basins' else 'watershed/default'}/label"]
    assert runs["disk"] == runs["held"]
    st = TerrainStore.open(routed)
    group = "basins" if command[0] == "basins" else "watershed/default"
    label = np.asarray(st.group[f"{group}/label"][...])
    _, geometry, fields = runs["disk"]
    np.testing.assert_array_equal(_burnt(geometry, fields["id"], st.transform, label.shape), label)
    assert sorted(set(fields["id"])) == sorted(set(np.unique(label[label > 0]).tolist()))
    assert not [p for p in routed.iterdir() if "scratch" in p.name]  # the GeoTIFFs went with their folder
