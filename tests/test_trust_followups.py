"""Issue 27 follow-ups: integer results whose 0 is a value export with only the DEM's nodata cells as
nodata (read back by rasterio's masked reads and an Esri ASCII parser written from the format); the
cost models refuse distances beyond float32; notes reach the user during ``export``; ``info`` names
weights as the CLI does; ``-q demo`` is quiet."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.errors import InputError, TerrainNote
from terrain_io.export import export
from terrain_io.grid import sssp
from terrain_io.grid.depressions import depressions
from terrain_io.grid.fill import fill
from terrain_io.store import TerrainStore

from references import ROOT, UTM33, parse_esri_ascii, utm_store

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# -- 1. ids whose 0 means something: only the DEM's nodata cells are nodata -----------------------
def test_id_results_export_only_the_dems_nodata_cells_as_nodata(tmp_path):
    rng = np.random.default_rng(5)
    v = (rng.random((35, 43)) * 20).astype(np.float32)  # rough: many pits, lakes and basins
    v[rng.random(v.shape) < 0.1] = np.nan
    v[17, 21] = 3.0
    valid = ~np.isnan(v)
    st = utm_store(tmp_path / "dem.zarr", v, tile=8)
    fill(st, progress=False)
    depressions(st, progress=False)
    sssp(st, [(17, 21), (3, 3)], cell=True, name="a", allocation=True, max_cost=60.0, progress=False,
         method="incore", skip_invalid=True)
    for name in ("fill/depression", "depressions/basin", "sssp/a/source"):
        ids = st.group[name][:]
        assert (ids[valid] == 0).any() and (ids[valid] > 0).any(), name  # 0 is a value of valid cells
        tif, asc = tmp_path / f"{name.replace('/', '_')}.tif", tmp_path / f"{name.replace('/', '_')}.asc"
        export(st.path, name, tif)
        export(st.path, name, asc)
        with rasterio.open(tif) as ds:
            m = ds.read(1, masked=True)
            np.testing.assert_array_equal(m.mask, ~valid, err_msg=name)
            np.testing.assert_array_equal(m.data[valid], ids[valid], err_msg=name)
        header, got = parse_esri_ascii(asc)
        assert float(header["nodata_value"]) > ids.max(), name
        np.testing.assert_array_equal(np.isnan(got), ~valid, err_msg=name)
        np.testing.assert_array_equal(got[valid], ids[valid], err_msg=name)


def test_an_id_equal_to_the_marker_is_refused_not_written_as_nodata(tmp_path, monkeypatch):
    import terrain_io.export as ex

    v = np.ones((9, 10), np.float32)
    v[0, 0] = np.nan
    st = utm_store(tmp_path / "dem.zarr", v, tile=8)
    fill(st, progress=False)  # a flat DEM: no lakes, every valid cell holds id 0
    monkeypatch.setattr(ex, "_elevation_marker", lambda name, arr: 0)  # as if the ids reached the marker
    with pytest.raises(InputError, match="holds 0, the value that marks nodata"):
        export(st.path, "fill/depression", tmp_path / "d.tif")
    assert not (tmp_path / "d.tif").exists()


# -- 2. cost models: distances beyond float32 are refused before the solve ------------------------
def _tif(path, values):
    from rasterio.transform import Affine

    with rasterio.open(path, "w", driver="GTiff", width=values.shape[1], height=values.shape[0], count=1,
                       dtype=str(values.dtype), crs=UTM33,
                       transform=Affine.from_gdal(500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0)) as ds:
        ds.write(values, 1)
    return path


@pytest.mark.parametrize("weight", ["cell", "walk"])
def test_costs_whose_distances_pass_float32_are_refused_in_one_line(tmp_path, weight):
    v = np.random.default_rng(4).random((20, 24)).astype(np.float32)
    st = utm_store(tmp_path / "dem.zarr", v, tile=8)
    # a 30 m step costs 3e38 (cell) or about 21 s x 1e37 (walk): the far corner lies beyond float32's 3.4e38
    huge = _tif(tmp_path / "huge.tif", np.full(v.shape, 1e37, np.float32))
    with pytest.raises(InputError, match=r"costs up to 1e\+37 over 480 cells: .*float32's range"):
        sssp(st, (0, 0), cell=True, weight=weight, cost=str(huge), progress=False, method="incore")
    r = run("sssp", st.path, "--cell", "--source", "0,0", "--weight", weight, "--cost", huge)
    assert r.exit_code == 1 and r.output.strip().count("\n") == 0, r.output
    assert r.output.startswith("terrain: error: ") and "float32's range" in r.output
    assert "sssp" not in st.group  # nothing written
    # costs whose bound fits: every valid cell reached, finite (the +inf of an overflow would read "unreached")
    fits = _tif(tmp_path / "fits.tif", np.full(v.shape, 1e30, np.float32))
    sssp(st, (0, 0), cell=True, weight=weight, cost=str(fits), progress=False, method="incore", name="ok")
    assert np.isfinite(st.group["sssp/ok/distance"][:]).all()


# -- 3. export lets notes through -----------------------------------------------------------------
def test_export_passes_notes_to_the_user_and_silences_only_gdals_georeferencing_warning(tmp_path, monkeypatch):
    import functools

    import zarr
    from zarr.codecs import ZstdCodec

    from cli.main import _show_warning

    # terrain's hook (cli.main.main installs it): notes as one line
    monkeypatch.setattr(warnings, "showwarning", functools.partial(_show_warning, _default=warnings.showwarning))
    path = tmp_path / "old.zarr"  # a format-1 store (no checksums; no transform): opening it is a note
    g = zarr.open_group(str(path), mode="w")
    g.attrs.update({"format": "terrain", "format_version": 1, "tile_size": 32, "shard_size": 2, "nodata": None})
    a = g.create_array("elevation", shape=(40, 50), chunks=(32, 32), shards=(64, 64), dtype="float32",
                       fill_value=float("nan"), compressors=ZstdCodec(level=1), dimension_names=("y", "x"))
    a[...] = np.random.default_rng(0).random((40, 50)).astype(np.float32)
    r = CliRunner().invoke(cli, ["export", str(path), "-o", str(tmp_path / "e.tif")])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if line.startswith("terrain: note: ")]
    assert len(notes) == 1 and "format_version 1" in notes[0] and "no checksums" in notes[0], r.stderr
    for out in ("e.png", "e.asc"):  # no transform: GDAL's NotGeoreferencedWarning stays silent
        r = CliRunner().invoke(cli, ["export", str(path), "-o", str(tmp_path / out)])
        assert r.exit_code == 0 and "Warning" not in r.stderr, r.stderr


# -- 4. info names the weight as the CLI does ------------------------------------------------------
def test_info_names_walk_with_friction_as_the_cli_does(tmp_path):
    import json

    v = np.random.default_rng(6).random((12, 14)).astype(np.float32)
    st = utm_store(tmp_path / "dem.zarr", v, tile=8)
    friction = _tif(tmp_path / "f.tif", np.full(v.shape, 2.0, np.float32))
    r = run("-q", "sssp", st.path, "--cell", "--source", "1,1", "--weight", "walk", "--cost", friction,
            "--name", "w")
    assert r.exit_code == 0, r.output
    r = run("info", st.path)
    line = next(x for x in r.output.splitlines() if x.strip().startswith("sssp/w:"))
    assert "weight=walk," in line and "walk_friction" not in r.output, r.output
    assert re.search(r"max_distance=[0-9.]+ s\b", line), line  # walking time: seconds
    r = run("info", st.path, "--json")
    assert json.loads(r.output)["results"]["sssp/w"]["weight"] == "walk" and "walk_friction" not in r.output
    assert TerrainStore.open(st.path, mode="r").group["sssp/w"].attrs["weight"] == "walk_friction"  # as stored


# -- 5. -q demo is quiet, errors still speak -------------------------------------------------------
def test_quiet_demo_prints_nothing_but_errors(tmp_path):
    r = CliRunner().invoke(cli, ["-q", "demo", "-o", str(tmp_path / "d")])
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and r.stderr == "", r.output
    assert (tmp_path / "d" / "depressions.png").is_file() and (tmp_path / "d" / "path.geojson").is_file()
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "elevation.png").write_text("mine")  # not the demo's: refused
    r = CliRunner().invoke(cli, ["-q", "demo", "-o", str(tmp_path / "e")])
    assert r.exit_code == 1 and r.stdout == "", r.output
    assert r.stderr.startswith("terrain: error: ") and "elevation.png" in r.stderr, r.stderr


# -- found in review ---------------------------------------------------------------------------------
def test_a_store_given_as_dot_takes_its_result(tmp_path):
    """`terrain mst .` inside the store: the commit's lock is on the store's real parent folder (the
    lock of '.'.parent, '.', was the store itself, which the rename locks too: the run waited on
    itself forever)."""
    import os
    import subprocess
    import sys

    v = np.random.default_rng(7).random((20, 24)).astype(np.float32)
    st = utm_store(tmp_path / "dem.zarr", v, tile=8)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "cli", "-q", "mst", ".", "--device", "cpu"], cwd=st.path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    edges = TerrainStore.open(st.path, mode="r").group["mst/edges"][:]
    assert sum(bin(int(x)).count("1") for x in edges.ravel()) == v.size - 1  # a spanning tree of the grid


def test_ascii_export_leaves_a_prj_it_did_not_write(tmp_path):
    """A store without a CRS exported beside a user's own dem.prj (no dem.asc there): the .prj stays."""
    st = utm_store(tmp_path / "dem.zarr", np.ones((6, 7), np.float32), crs=None, tile=8)
    (tmp_path / "dem.prj").write_text("mine")
    export(st.path, "elevation", tmp_path / "dem.asc")
    assert (tmp_path / "dem.prj").read_text() == "mine"
