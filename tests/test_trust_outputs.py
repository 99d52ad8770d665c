"""Outputs (issue 27, "Never delete or overwrite what the tool did not write"): the tool removes only
what it made (a terrain store, by its attributes; the demo's own files; files replaced under
--overwrite); `path -o` writes the format its suffix names; a failed result leaves the store as it
was; a read-only place is one line naming the user's path, and a writable store in a read-only
folder takes results (staged inside the store)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import make_read_only, make_writable
from terrain_io.store import TerrainStore

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_error_line(result, *words):
    """The run failed with exit 1 and one line ``terrain: error: ...`` holding ``words``, naming no
    internal temporary and showing no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: error:"), result.output
    assert ".partial-" not in lines[0] and "%2F" not in lines[0] and "Traceback" not in result.output
    for w in words:
        assert w in lines[0], result.output
    return lines[0]


def listing(folder: Path) -> dict[str, bytes]:
    """Every file and folder under ``folder`` (hidden ones too), with the files' bytes."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        found.update({os.path.join(rel, d) + "/": b"" for d in dirnames})
        found.update({os.path.join(rel, f): Path(dirpath, f).read_bytes() for f in filenames})
    return found


def small_store(path: Path, wall: bool = False) -> TerrainStore:
    """A 40 x 50 random DEM in UTM (with ``wall``: a column of nodata cutting off its right part)."""
    values = np.random.default_rng(0).random((40, 50), dtype=np.float32) * 100
    if wall:
        values[:, 30] = np.nan
    return TerrainStore.from_array(path, values, tile=16, shard=2,
                                   attrs={"transform": [500000.0, 10.0, 0.0, 4000000.0, 0.0, -10.0],
                                          "cell_size": [10.0, 10.0], "crs": "EPSG:32633"})


# -- only what the tool made is removed -----------------------------------------------------------
@pytest.mark.parametrize("command", ["convert", "synth"])
def test_overwrite_replaces_a_store_but_refuses_any_other_folder_or_file(tmp_path, sample_data, command):
    make = {"convert": ["convert", sample_data / "jacksboro_fault_dem.asc", "--tile", "64", "--shard", "2"],
            "synth": ["synth", "--size", "40", "--tile", "16", "--shard", "2"]}[command]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("the user's")
    note = tmp_path / "note.zarr"
    note.write_text("a file, not a store")
    for target in (mine, note):
        one_error_line(run(*make, "-o", target, "--overwrite"), str(target), "not a terrain store")
    assert (mine / "keep.txt").read_text() == "the user's" and note.read_text() == "a file, not a store"
    store = tmp_path / "s.zarr"
    assert run(*make, "-o", store).exit_code == 0
    one_error_line(run(*make, "-o", store), "already exists", "--overwrite")
    result = run(*make, "-o", store, "--overwrite")  # a store of this tool: replaced
    assert result.exit_code == 0, result.output
    assert TerrainStore.open(store).attrs["format"] == "terrain"


def test_demo_writes_into_an_existing_folder_and_replaces_only_its_own_outputs(tmp_path, monkeypatch):
    """`cd somedir; terrain demo -o .` keeps the folder's files (it used to empty the folder); a file of
    the user's under one of the demo's names is refused before any work and kept."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("the user's")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a")
    result = run("demo", "-o", ".")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "keep.txt").read_text() == "the user's" and (tmp_path / "notes" / "a.txt").read_text() == "a"
    assert (tmp_path / "jacksboro.zarr" / "zarr.json").is_file() and (tmp_path / "depth.png").stat().st_size > 1000
    (tmp_path / "depth.png").write_bytes(b"the user's picture")  # no longer the demo's file
    before = listing(tmp_path)
    one_error_line(run("demo", "-o", "."), "depth.png", "not written by 'terrain demo'")
    assert listing(tmp_path) == before


def test_demo_refuses_a_foreign_folder_under_its_store_name(tmp_path):
    out = tmp_path / "d"
    (out / "jacksboro.zarr").mkdir(parents=True)
    (out / "jacksboro.zarr" / "data.bin").write_bytes(b"x")
    (out / "keep.txt").write_text("k")
    before = listing(out)
    one_error_line(run("demo", "-o", out), "jacksboro.zarr", "not written by 'terrain demo'")
    assert listing(out) == before


# -- path -o: the format the suffix names -------------------------------------------------------
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A store with an SSSP result and the GeoJSON route's paths to three targets, one unreachable."""
    root = tmp_path_factory.mktemp("paths")
    store = small_store(root / "p.zarr", wall=True)  # the target right of the wall is not reached
    assert run("-q", "sssp", store.path, "--cell", "--source", "5,5", "--name", "a", "--device", "cpu").exit_code == 0
    targets = ["--to", "30,20", "--to", "2,3", "--to", "10,40"]
    result = run("path", store.path, "--cell", *targets, "-o", root / "p.geojson")
    assert result.exit_code == 0, result.output
    return store.path, targets, json.loads((root / "p.geojson").read_text())


def _linestring(wkb: bytes) -> np.ndarray:
    """Points of an ISO/extended WKB LineString (the format's definition, either byte order)."""
    order = "<" if wkb[0] == 1 else ">"
    kind = int(np.frombuffer(wkb[1:5], order + "u4")[0])
    assert kind == 2, kind  # a 2-D LineString
    n = int(np.frombuffer(wkb[5:9], order + "u4")[0])
    return np.frombuffer(wkb[9:9 + 16 * n], order + "f8").reshape(n, 2)


@pytest.mark.parametrize("suffix", [".gpkg", ".shp", ".fgb"])
def test_path_writes_the_format_its_suffix_names_with_the_geojson_routes_features(traced, tmp_path, suffix):
    pyogrio = pytest.importorskip("pyogrio")
    from pyogrio import raw

    store, targets, geojson = traced
    out = tmp_path / f"paths{suffix}"
    result = run("path", store, "--cell", *targets, "-o", out)
    assert result.exit_code == 0, result.output
    driver = {".gpkg": "GPKG", ".shp": "ESRI Shapefile", ".fgb": "FlatGeobuf"}[suffix]
    info = pyogrio.read_info(out)
    assert info["driver"] == driver and info["geometry_type"] == "LineString" and info["features"] == 3
    meta, _, geometry, fields = raw.read(out)
    assert pyogrio.read_info(out)["crs"] == "EPSG:32633"
    rows = [dict(zip(meta["fields"], (f[i] for f in fields))) for i in range(len(geometry))]
    for feature, row, wkb in zip(geojson["features"], rows, geometry):
        p = feature["properties"]
        assert row["target"] == p["target"] and [row["target_row"], row["target_col"]] == p["target_cell"]
        assert row["cells"] == p["cells"] and row["sssp"] == p["sssp"] and row["weight"] == p["weight"]
        if feature["geometry"] is None:  # not reached: null geometry and cost, as in GeoJSON
            assert wkb is None and (p["cost"] is None and np.isnan(row["cost"]))
            continue
        assert row["cost"] == p["cost"] and [row["source_row"], row["source_col"]] == p["source_cell"]
        np.testing.assert_array_equal(_linestring(wkb), np.array(feature["geometry"]["coordinates"]))
    assert sum(f["geometry"] is None for f in geojson["features"]) == 1


def test_path_output_follows_the_overwrite_rule_and_refuses_an_unknown_suffix(traced, tmp_path, monkeypatch):
    pytest.importorskip("pyogrio")
    store, targets, _ = traced
    for name in ("old.geojson", "old.gpkg"):
        (tmp_path / name).write_text("the user's")
        one_error_line(run("path", store, "--cell", *targets, "-o", tmp_path / name), "already exists", "--overwrite")
        assert (tmp_path / name).read_text() == "the user's"
        assert run("path", store, "--cell", *targets, "-o", tmp_path / name, "--overwrite").exit_code == 0
    one_error_line(run("path", store, "--cell", *targets, "-o", tmp_path / "x.kmz"), "unknown output type '.kmz'")
    monkeypatch.setitem(sys.modules, "pyogrio", None)  # not installed
    one_error_line(run("path", store, "--cell", *targets, "-o", tmp_path / "x.shp"), "needs pyogrio")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.geojson", "old.gpkg"]


def test_shapefile_replaced_whole(traced, tmp_path):
    """A Shapefile replaced under --overwrite loses the side files the new one does not have (a stale
    .prj would give it the old CRS); side files of no Shapefile being replaced stay."""
    pytest.importorskip("pyogrio")
    store, targets, _ = traced
    out = tmp_path / "p.shp"
    (tmp_path / "q.prj").write_text("the user's")
    assert run("path", store, "--cell", *targets, "-o", out).exit_code == 0
    assert {".shp", ".shx", ".dbf", ".prj"} <= {p.suffix for p in tmp_path.glob("p.*")}
    (tmp_path / "p.qix").write_text("not a suffix the driver writes: kept")
    assert run("path", store, "--cell", *targets, "-o", out, "--overwrite").exit_code == 0
    assert (tmp_path / "q.prj").read_text() == "the user's" and (tmp_path / "p.qix").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- a failed result leaves nothing -----------------------------------------------------------------
def test_failed_result_leaves_the_store_exactly_as_it_was(tmp_path):
    store = small_store(tmp_path / "s.zarr")
    before = listing(store.path)
    with pytest.raises(RuntimeError):
        with store.write_result("sssp/a") as w:
            w.create_array("distance", "float32", np.nan)[:] = 1.0
            raise RuntimeError("failed")
    assert listing(store.path) == before
    assert "sssp" not in TerrainStore.open(store.path).group


def test_interrupt_at_the_rename_removes_the_parent_group_made_for_the_result(tmp_path, monkeypatch):
    """The parent group (``sssp``) is made just before the rename; a Ctrl-C there takes it away again,
    but never a parent group that holds another result."""
    import terrain_io.atomic as atomic

    store = small_store(tmp_path / "s.zarr")
    before = listing(store.path)

    def interrupted(tmp, final):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "replace", interrupted)
    for expected in (before, None):
        with pytest.raises(KeyboardInterrupt):
            with store.write_result("sssp/b") as w:
                w.create_array("distance", "float32", np.nan)[:] = 2.0
        if expected is not None:
            assert listing(store.path) == expected
            monkeypatch.undo()
            with store.write_result("sssp/a") as w:  # another result in the group
                w.create_array("distance", "float32", np.nan)[:] = 1.0
            monkeypatch.setattr(atomic, "replace", interrupted)
    assert (TerrainStore.open(store.path).group["sssp/a/distance"][:] == 1.0).all()
    assert "sssp/b" not in TerrainStore.open(store.path).group


def test_failed_sssp_on_a_fresh_store_leaves_no_empty_sssp_group(tmp_path):
    """A real failure mid-write (a file-size limit: the disk is full) in a separate process."""
    store = small_store(tmp_path / "s.zarr")
    before = listing(store.path)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))

    proc = subprocess.run([sys.executable, "-m", "cli", "-q", "sssp", str(store.path), "--cell", "--source", "5,5",
                           "--device", "cpu"], capture_output=True, text=True, preexec_fn=limit)
    assert proc.returncode == 1 and "File too large" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and ".partial-" not in proc.stderr, proc.stderr
    assert listing(store.path) == before


# -- read-only places ------------------------------------------------------------------------------
@pytest.fixture
def read_only_parent(tmp_path):
    """A writable store (with an SSSP result) in a read-only folder."""
    parent = tmp_path / "ro"
    parent.mkdir()
    store = small_store(parent / "s.zarr")
    assert run("-q", "sssp", store.path, "--cell", "--source", "5,5", "--name", "a", "--device", "cpu").exit_code == 0
    make_read_only(parent)
    yield store.path
    make_writable(parent)


def test_a_writable_store_in_a_read_only_folder_takes_results(read_only_parent):
    store = read_only_parent
    parent_before = sorted(os.listdir(store.parent))
    for args in (["sssp", store, "--cell", "--source", "20,20", "--name", "b", "--device", "cpu"],
                 ["sssp", store, "--cell", "--source", "9,9", "--name", "c", "--method", "index"],  # a lock
                 ["sssp", store, "--cell", "--source", "9,9", "--name", "d", "--method", "shards"],  # scratch
                 ["fill", store, "--device", "cpu"]):
        result = run("-q", *args)
        assert result.exit_code == 0, result.output
    results = TerrainStore.open(store, mode="r").results()
    assert {"sssp/b/distance", "sssp/c/distance", "sssp/d/distance", "fill/depth"} <= set(results)
    assert sorted(os.listdir(store.parent)) == parent_before
    assert not [n for n in os.listdir(store) if n.startswith(".") and not n.endswith(".lock")]  # nothing staged
    assert run("verify", store).exit_code == 0


@pytest.mark.parametrize("suffix", [".png", ".tif", ".asc"])
def test_export_into_a_read_only_folder_is_one_line_naming_the_file(read_only_parent, suffix):
    out = read_only_parent.parent / f"x{suffix}"
    line = one_error_line(run("export", read_only_parent, "-o", out), str(out))
    assert "Permission denied" in line or "Operation not permitted" in line or "Read-only" in line
    assert "CPLE" not in line


@pytest.mark.parametrize("suffix", [".geojson", ".gpkg"])
def test_path_into_a_read_only_folder_is_one_line_naming_the_file(read_only_parent, suffix):
    pytest.importorskip("pyogrio")
    out = read_only_parent.parent / f"p{suffix}"
    one_error_line(run("path", read_only_parent, "--cell", "--to", "30,30", "-o", out), str(out))


@pytest.mark.parametrize("method", ["incore", "shards", "index"])
def test_a_read_only_store_is_one_line_naming_the_store(tmp_path, method):
    store = small_store(tmp_path / "s.zarr").path
    before = listing(store)
    make_read_only(store)
    try:
        one_error_line(run("sssp", store, "--cell", "--source", "5,5", "--name", "a", "--device", "cpu",
                           "--method", method), str(store))
    finally:
        make_writable(store)
    assert listing(store) == before


@pytest.mark.parametrize("kind", ["table", "graph"])
def test_tables_and_graph_outputs_follow_the_overwrite_rule(tmp_path, kind):
    """`fill --table` and `graph ... -o` replace an existing file only with --overwrite (they used to
    replace it silently); the refusal comes before any work."""
    out = tmp_path / "out.csv"
    out.write_text("the user's")
    if kind == "table":
        args = ["fill", small_store(tmp_path / "s.zarr").path, "--device", "cpu", "--table", out]
    else:
        (tmp_path / "g.csv").write_text("u,v,w\n0,1,1\n1,2,2\n3,4,1\n")
        args = ["graph", "cc", tmp_path / "g.csv", "-o", out]
    one_error_line(run(*args), str(out), "already exists", "--overwrite")
    assert out.read_text() == "the user's"
    result = run(*args, "--overwrite")
    assert result.exit_code == 0, result.output
    from terrain_io.grid.fill import TABLE_COLUMNS

    assert out.read_text().splitlines()[0] == ("vertex,label" if kind == "graph" else ",".join(TABLE_COLUMNS))
