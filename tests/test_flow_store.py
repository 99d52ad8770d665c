"""``terrain flow`` on stores: the references of test_flow (D8 written here, Barnes 2014 from the paper,
a topological sum), identical bytes for every tile size in core and out of core, conditioning,
weights, the ESRI convention and bad input (one line, exit 1, nothing written)."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import holed, jacksboro, priority_flood, reference_directions, topological_sum, utm_store
from terrain_io.grid.flow.codes import NODATA
from terrain_io.grid.flow.pipeline import flow, read_flow
from terrain_io.store import TerrainStore

_register()
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def dem():
    """A part of the sample DEM with nodata holes and a filled lake wider than a 16-cell tile."""
    z = jacksboro()[:120, :150].astype(np.float32)
    z[40:46, 60:70] = np.nan
    z[100:, :5] = np.nan
    return z


def test_store_directions_and_accumulation_equal_the_references(tmp_path):
    z = dem()
    valid = ~np.isnan(z)
    filled = np.where(valid, priority_flood(np.nan_to_num(z), valid), np.nan).astype(np.float32)
    st = utm_store(tmp_path / "a.zarr", filled, tile=16, shard=2)
    res = flow(st, condition="none", progress=False)
    out = read_flow(st)
    expected, _, _ = reference_directions(filled, valid, 30.0, 30.0, "edge+nodata")
    assert np.array_equal(out["direction"], expected)
    assert np.array_equal(out["accumulation"], topological_sum(expected).astype(np.uint64))
    assert res.method == "incore" and res.valid == int(valid.sum())
    assert res.flat_cells > 256  # flats wider than a tile


@pytest.mark.parametrize("tile", [8, 16, 32])
def test_same_bytes_for_every_tile_size_in_core_and_out_of_core(tmp_path, tile):
    z, valid = holed()
    z = np.concatenate([z, np.fliplr(z)], axis=1).astype(np.float32)  # 32 x 64: flats across windows
    z[10:20, 30:34] = 7.0  # a plateau crossing the tile edge at column 32
    valid = ~np.isnan(z)
    expected, _, _ = reference_directions(z, valid, 1.0, 1.0, "edge")
    acc = topological_sum(expected).astype(np.uint64)
    st = TerrainStore.from_array(tmp_path / "a.zarr", z, tile=tile, shard=2)
    for window_tiles, sweeps in ((None, None), (1, False), (2, False), (1, True), (2, True)):
        res = flow(st, condition="none", outlets="edge", window_tiles=window_tiles, flat_sweeps=sweeps,
                   progress=False)
        out = read_flow(st)
        assert np.array_equal(out["direction"], expected), (window_tiles, sweeps)
        assert np.array_equal(out["accumulation"], acc), (window_tiles, sweeps)
        assert ("flat_sweeps" in res.timings) == bool(sweeps)


def test_flats_larger_than_the_budget_are_swept(tmp_path):
    """A filled lake across many windows whose flat cells do not fit the list: window sweeps, the
    same codes as the Barnes 2014 reference."""
    z = dem()
    valid = ~np.isnan(z)
    filled = np.where(valid, priority_flood(np.nan_to_num(z), valid), np.nan).astype(np.float32)
    st = TerrainStore.from_array(tmp_path / "a.zarr", filled, tile=16, shard=4)
    res = flow(st, condition="none", memory="300KB", progress=False)  # in core ~560 KB; windows ~280 KB, the flat list 30 KB
    assert res.method == "tiled" and res.timings["flat_sweeps"] >= 2
    expected, _, _ = reference_directions(filled, valid, 1.0, 1.0, "edge+nodata")
    assert np.array_equal(read_flow(st)["direction"], expected)


def test_weights_exclude_self_and_tiles(tmp_path):
    z, valid = holed()
    z = z.astype(np.float32)
    w = np.random.default_rng(2).random(z.shape)
    st = TerrainStore.from_array(tmp_path / "a.zarr", z, tile=8, shard=2)
    code = None
    for window_tiles in (None, 1):
        flow(st, condition="none", weights=w, include_self=False, window_tiles=window_tiles, progress=False)
        out = read_flow(st)
        code = out["direction"]
        assert out["accumulation"].dtype == np.float64
        expected = topological_sum(code, w) - np.where(code != NODATA, w, 0.0)
        np.testing.assert_allclose(out["accumulation"], expected.astype(np.float64), rtol=1e-13, atol=1e-13)


def test_condition_fill_uses_or_runs_fill(tmp_path):
    z = dem()
    valid = ~np.isnan(z)
    st = utm_store(tmp_path / "a.zarr", z, tile=32, shard=2)
    res = flow(st, progress=False)
    assert res.filled_now and "fill/elevation" in TerrainStore.open(st.path).group
    filled = np.where(valid, priority_flood(np.nan_to_num(z), valid), np.nan)
    expected, _, _ = reference_directions(filled, valid, 30.0, 30.0, "edge+nodata")
    assert np.array_equal(read_flow(st)["direction"], expected)
    again = flow(st, progress=False)
    assert not again.filled_now  # the stored fill is used


def test_cli_summary_and_results(tmp_path):
    z, _ = holed()
    st = TerrainStore.from_array(tmp_path / "a.zarr", z.astype(np.float32), tile=8, shard=2)
    r = run("flow", st.path, "--condition", "none", "--memory", "1GB")
    assert r.exit_code == 0, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("flow: ") and "Mcells/s" in r.output
    got = TerrainStore.open(st.path).group
    assert got["flow/direction"].dtype == np.uint8 and got["flow/accumulation"].dtype == np.uint64


@pytest.mark.parametrize("case", ["shape", "negative", "nan", "all-nodata", "missing"])
def test_bad_input_one_line_exit_1_nothing_written(tmp_path, case):
    import rasterio

    z, valid = holed()
    if case == "all-nodata":
        z = np.full(z.shape, np.nan)
    st = TerrainStore.from_array(tmp_path / "a.zarr", z.astype(np.float32), tile=8, shard=2)
    w = np.ones(z.shape, np.float32)
    if case == "shape":
        w = np.ones((z.shape[0], z.shape[1] + 1), np.float32)
    if case == "negative":
        w[np.argwhere(valid)[5][0], np.argwhere(valid)[5][1]] = -1
    if case == "nan":
        w[np.argwhere(valid)[-3][0], np.argwhere(valid)[-3][1]] = np.nan
    path = tmp_path / "w.tif"
    with rasterio.open(path, "w", driver="GTiff", width=w.shape[1], height=w.shape[0], count=1, dtype="float32") as f:
        f.write(w, 1)
    args = ["flow", st.path, "--condition", "none"]
    if case != "all-nodata":
        args += ["--weights", path if case != "missing" else tmp_path / "nope.tif"]
    r = run(*args)
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: error: "), r.output
    assert not (st.path / "flow").exists()
    assert [p.name for p in st.path.iterdir() if p.name.startswith(".") and "partial" in p.name] == []


def test_weights_file_and_store_array(tmp_path):
    import rasterio

    z, valid = holed()
    st = TerrainStore.from_array(tmp_path / "a.zarr", z.astype(np.float32), tile=8, shard=2)
    w = np.where(valid, np.arange(z.size).reshape(z.shape) % 7, np.nan).astype(np.float32)
    path = tmp_path / "w.tif"
    with rasterio.open(path, "w", driver="GTiff", width=w.shape[1], height=w.shape[0], count=1,
                       dtype="float32") as f:
        f.write(w, 1)
    r = run("-q", "flow", st.path, "--condition", "none", "--weights", path)
    assert r.exit_code == 0, r.output
    out = read_flow(st)
    expected = topological_sum(out["direction"], np.nan_to_num(w).astype(np.float64))
    np.testing.assert_allclose(out["accumulation"], expected.astype(np.float64), rtol=1e-13)
    r = run("-q", "flow", st.path, "--condition", "none", "--weights", "flow/accumulation", "--exclude-self")
    assert r.exit_code == 0, r.output  # an array of the store as weights
