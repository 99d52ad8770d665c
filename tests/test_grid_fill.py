"""Depression filling (terrain_io.grid.fill) against independent references.

References (tests/references.py): a Priority-Flood written from its definition (Barnes et al. 2014, a heapq over
the outlets), pyflwdir's ``fill_depressions`` (Wang & Liu 2006; given float64 input, so that its
``z + (z0 - z)`` is exact, with ``outlets='edge'`` = our ``edge+nodata`` and ``idxs_pit`` = the
DEM's edge cells for our ``edge``), and scipy.ndimage.label (8-connectivity) for the lakes, whose
areas, volumes, pits, spill cells and targets are summed / searched there from the reference levels.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from terrain_io.grid.fill import fill, read_fill
from terrain_io.store import TerrainStore
from references import check_against_references, convert_dem, fill_references, fill_test_dem, REAL, command_errors, table_command


@pytest.mark.parametrize("kind", ["random", "terraced", "flat-bottomed", "nodata-holed"])
@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
def test_synthetic_dems(tmp_path, kind, outlets):
    h = fill_test_dem(kind, 53, 71, seed=len(kind))
    first = None
    for tile, shard, kw in ((8, 2, {"held": False}), (64, 2, {})):
        st = TerrainStore.from_array(tmp_path / f"{kind}{tile}.zarr", h, tile=tile, shard=shard)
        res, got = check_against_references(st, outlets, **kw)
        if first is None:
            first = got
        for k in got:  # the same bytes for every tile size and budget
            assert got[k].tobytes() == first[k].tobytes(), k


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_dask_schedulers_give_the_same_bytes(tmp_path, scheduler):
    """Phases 1 and 3 as Dask tasks of whole shards: equal to the references and to the local run."""
    h = fill_test_dem("nodata-holed", 90, 77, seed=5)
    local = TerrainStore.from_array(tmp_path / "local.zarr", h, tile=8, shard=2)
    check_against_references(local)
    st = TerrainStore.from_array(tmp_path / "dask.zarr", h, tile=8, shard=2)
    res, got = check_against_references(st, scheduler=scheduler)
    assert res.method == "tiled" and res.batch_tiles == 2
    for k, v in read_fill(local).items():
        assert got[k].tobytes() == v.tobytes(), k
    assert not list(tmp_path.glob("*scratch*")) and not list(tmp_path.rglob(".*scratch*"))


@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
def test_parallel_kernels_equal_their_serial_twins(tmp_path, monkeypatch, outlets):
    """Small DEMs run the serial builds; the parallel ones (large DEMs), forced here, against the
    references and the serial bytes, held and re-flooded."""
    import terrain_io.grid.fill._tiled as tiled_module
    import terrain_io.grid.fill.pipeline as fill_module

    h = fill_test_dem("nodata-holed", 61, 50, seed=4)
    serial = {}
    for held in (True, False):
        st = TerrainStore.from_array(tmp_path / f"s{held}.zarr", h, tile=16, shard=2)
        check_against_references(st, outlets, held=held)
        serial[held] = read_fill(st)
    monkeypatch.setattr(fill_module, "SERIAL_BELOW", 0)
    monkeypatch.setattr(tiled_module, "SERIAL_BELOW", 0)  # the outlets kernel of the blocks read
    for held in (True, False):
        st = TerrainStore.from_array(tmp_path / f"p{held}.zarr", h, tile=16, shard=2)
        check_against_references(st, outlets, held=held)
        got = read_fill(st)
        for k in got:
            assert got[k].tobytes() == serial[held][k].tobytes(), k


def test_edge_outlets_wall_in_islands(tmp_path):
    """Under ``edge`` a nodata ring walls in an island: no way out, it keeps its elevations; under
    ``edge+nodata`` the ring drains it."""
    h = np.full((30, 30), 10.0, np.float32)
    h[5:25, 5:25] = np.nan
    h[8:22, 8:22] = 3.0
    h[14, 14] = 1.0
    st = TerrainStore.from_array(tmp_path / "i.zarr", h, tile=8, shard=2)
    check_against_references(st, "edge")
    assert np.array_equal(read_fill(st)["elevation"][8:22, 8:22], h[8:22, 8:22])
    check_against_references(st, "edge+nodata")


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_dems(tmp_path, path):
    check_against_references(TerrainStore.open(convert_dem(path, tmp_path / "a.zarr", 64)))


@pytest.mark.parametrize("path", [pytest.param(p, marks=[] if "holes" in p.name else [pytest.mark.slow])
                                  for p in REAL], ids=[p.name for p in REAL])
def test_real_dems_out_of_core_same_bytes(tmp_path, path):
    """Re-flooded tile by tile (small tiles, store read twice) = held floods, byte for byte."""
    st = TerrainStore.open(convert_dem(path, tmp_path / "a.zarr", 64))
    res = fill(st, device="cpu", progress=False)
    got = read_fill(st)
    st2 = TerrainStore.open(convert_dem(path, tmp_path / "b.zarr", 16))
    res2 = fill(st2, device="cpu", progress=False, held=False)
    assert res2.method == "tiled"
    got2 = read_fill(st2)
    for k in got:
        assert got2[k].tobytes() == got[k].tobytes(), k
    assert np.array_equal(res2.table.volume_cells, res.table.volume_cells)


def test_integer_dem_and_attrs(tmp_path):
    rng = np.random.default_rng(5)
    h = rng.integers(-50, 50, (40, 33)).astype(np.int16)
    h[3, 4] = -9999
    st = TerrainStore.from_array(tmp_path / "i.zarr", h, tile=8, shard=2, nodata=-9999)
    res, got = check_against_references(st)
    assert got["elevation"].dtype == np.int16 and got["elevation"][3, 4] == -9999
    attrs = TerrainStore.open(st.path).group["fill"].attrs
    assert attrs["depressions"] == res.depressions
    table = attrs["depression_table"]
    assert table["id"] == list(range(1, res.depressions + 1))
    assert table["cells"] == res.table.cells.tolist()


def test_bad_input(tmp_path):
    from terrain_io.errors import InputError

    st = TerrainStore.from_array(tmp_path / "a.zarr", np.zeros((20, 20), np.float32), tile=8, shard=2)
    with pytest.raises(InputError):
        fill(st, outlets="nowhere", progress=False)
    with pytest.raises(InputError, match="too small"):
        fill(st, memory="1KB", progress=False, device="cpu")


def test_cli_fill_table_and_export(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli

    st, output, rows = table_command(tmp_path, "fill")
    vals = np.asarray(st.elevation[...])
    valid = st.valid(vals)
    F, _, lab, table = fill_references(vals, valid, False, 1.0)
    assert f"{len(table['cells']):,} depressions" in output
    assert np.array_equal(read_fill(st)["elevation"][valid], F[valid].astype(np.float32))
    assert [int(r["id"]) for r in rows] == list(range(1, len(rows) + 1))
    assert [int(r["cells"]) for r in rows] == table["cells"].tolist()
    assert [int(r["spill_row"]) * 50 + int(r["spill_col"]) for r in rows] == table["spill"].tolist()
    assert np.allclose([float(r["volume"]) for r in rows], table["volume"], rtol=1e-12)
    for arr in ("fill/depth", "fill/depression", "fill/elevation"):
        png = tmp_path / (arr.replace("/", "_") + ".png")
        out = CliRunner().invoke(cli, ["export", str(st.path), arr, "-o", str(png)])
        assert out.exit_code == 0 and png.stat().st_size > 100, out.output


def test_cli_fill_errors(tmp_path):
    st, (missing, small, sea, table) = command_errors(tmp_path, "fill")
    assert missing.exit_code == 1 and missing.output.startswith("terrain: error:")
    assert small.exit_code == 1 and "too small" in small.output and "Traceback" not in small.output
    assert sea.exit_code == 2
    assert table.exit_code == 2 and "does not exist" in table.output
    assert "fill" not in TerrainStore.open(st.path).results()


_MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    from terrain_io.grid.fill import fill
    from terrain_io.memory import current_rss, peak_rss, reset_peak_rss
    from terrain_io.store import TerrainStore

    fill(TerrainStore.open(sys.argv[2]), device="cpu", progress=False, held=False)  # compile / load kernels
    reset_peak_rss()
    base = current_rss()
    res = fill(TerrainStore.open(sys.argv[1]), device="cpu", progress=False, memory=sys.argv[3])
    print(peak_rss() - base, res.method, res.batch_tiles)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux peak-RSS reset")
@pytest.mark.slow
@pytest.mark.parametrize("size,tile,budget", [(4096, 256, 40), (8192, 512, 96)])
def test_memory_budget_out_of_core(tmp_path, size, tile, budget):
    """A store larger than the budget: filled tile by tile (re-flooded), peak RSS within the budget,
    and the same bytes as the held floods on a copy with other tiles."""
    from terrain_io.synth import synthesize

    synthesize(tmp_path / "big.zarr", size, seed=4, nodata_fraction=0.02, tile=tile, shard=1)
    synthesize(tmp_path / "warm.zarr", tile * 2 + 3, seed=4, tile=tile, shard=1)
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "big.zarr"),
                          str(tmp_path / "warm.zarr"), f"{budget}MB"], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    grown, method, batch = out.stdout.split()
    raw = size * size * 4
    assert method == "tiled" and raw > budget * 2**20
    assert int(grown) <= (budget + 24) * 2**20 and int(grown) < raw, grown
    if size > 4096:
        return
    vals = np.asarray(TerrainStore.open(tmp_path / "big.zarr").elevation[...])
    other = TerrainStore.from_array(tmp_path / "other.zarr", vals, tile=1024, shard=2)
    fill(other, device="cpu", progress=False, held=True)
    a, b = read_fill(tmp_path / "big.zarr"), read_fill(other)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (17, 3)])
def test_small_and_empty_dems(tmp_path, shape):
    rng = np.random.default_rng(sum(shape))
    h = rng.integers(0, 5, shape).astype(np.float32)
    check_against_references(TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2), held=False)
    empty = TerrainStore.from_array(tmp_path / "e.zarr", np.full(shape, np.nan, np.float32), tile=8, shard=2)
    res = fill(empty, device="cpu", progress=False)
    assert res.depressions == 0 and np.isnan(read_fill(empty)["elevation"]).all()
