"""The shard method (out of core, no G') against independent references: distances bit for bit
equal to scipy's Dijkstra, predecessors equal to the tie rule written from its definition (in
test_grid_sssp_incore), and every method the same bytes -- on random, terraced (exact ties), flat
and nodata-holed DEMs, units of 1 to 4 shards or of single tiles, sources on unit corners."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from terrain_io.errors import InputError
from terrain_io.grid.sssp import sssp
from references import CASES, make_store, random_dem, reference, rule_predecessors, terraced


def result(st, name):
    g = st.group[f"sssp/{name}"]
    return g["distance"][:], g["predecessor"][:]


def same_bytes(a, b):
    np.testing.assert_array_equal(a[0].view(np.uint32), b[0].view(np.uint32))
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["absdiff", "surface"])
@pytest.mark.parametrize("unit", [8, 16])
def test_shards_equal_scipy_and_the_tie_rule(tmp_path, case, kind, unit):
    v = CASES[case]()
    st = make_store(tmp_path, v, tile=8, shard=2, dx=2.0, dy=3.0)
    ok = np.argwhere(~np.isnan(v))
    sources = [tuple(ok[0]), tuple(ok[len(ok) // 2])]
    r = sssp(st, sources, weight=kind, cell=True, progress=False, method="shards", unit=unit, name="s")
    assert r.method == "shards" and r.merge_stats["unit"] == unit
    d, p = result(st, "s")
    ref = reference(v.astype(np.float64), sources, kind, 2.0, 3.0)
    np.testing.assert_array_equal(d, ref.astype(np.float32))
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, sources, kind, 2.0, 3.0))


@pytest.mark.parametrize("shape,tile,shard,unit", [((70, 53), 8, 2, 16), ((64, 64), 8, 1, 8), ((96, 80), 16, 2, 64),
                                                   ((33, 130), 8, 2, 32)])
@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
def test_every_method_gives_the_same_bytes(tmp_path, shape, tile, shard, unit, kind):
    v = terraced(shape, sum(shape), step=6.0)  # terraces: exact ties and zero-weight plateaus
    v[np.random.default_rng(3).random(shape) < 0.05] = np.nan
    st = make_store(tmp_path, v, tile=tile, shard=shard)
    cost = None
    if kind == "cell":
        with st.write_result("costs") as w:
            w.create_array("c", "float32", float("nan"))[...] = np.abs(np.nan_to_num(v, nan=1.0)) % 7 + 0.5
        cost = "costs/c"
    # sources on unit corners (and their diagonal neighbours across the corner)
    corners = [(unit - 1, unit - 1), (unit, unit), (min(2 * unit, shape[0]) - 1, 0)]
    sources = [rc for rc in corners if rc[0] < shape[0] and rc[1] < shape[1] and not np.isnan(v[rc])]
    out = {}
    for method in ("incore", "shards", "index"):
        kw = {"cluster": 4} if method == "index" else {"unit": unit} if method == "shards" else {}
        sssp(st, sources, weight=kind, cost=cost, cell=True, progress=False, method=method, name=method, **kw)
        out[method] = result(st, method)
    same_bytes(out["shards"], out["incore"])
    ref = reference(np.where(np.isnan(v), np.nan, st.group["costs/c"][:] if cost else v).astype(np.float64),
                    sources, kind)
    np.testing.assert_array_equal(out["shards"][0], ref.astype(np.float32))
    np.testing.assert_allclose(out["index"][0], out["shards"][0], rtol=1e-6)  # the index: last bit on ties


def test_flat_dem_levels_cross_units(tmp_path):
    """One plateau over every unit: distances all 0, the plateau levels (hop counts) run across
    unit boundaries many times; the codes follow the tie rule with no cycles."""
    v = np.full((48, 40), 5.0, np.float32)
    v[20:28, 8:36] = np.nan  # a wall to walk around
    st = make_store(tmp_path, v, tile=8, shard=1)
    r = sssp(st, [(47, 0), (0, 39)], cell=True, progress=False, method="shards", unit=8, name="f")
    d, p = result(st, "f")
    ref = reference(v.astype(np.float64), [(47, 0), (0, 39)])
    np.testing.assert_array_equal(d, ref.astype(np.float32))
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, [(47, 0), (0, 39)], "absdiff"))
    assert r.merge_stats["solves"] >= r.merge_stats["units"]


def test_unreached_units_and_schedule_figures(tmp_path):
    v = random_dem((64, 64), 8)
    v[:, 30:34] = np.nan  # the right half is cut off
    st = make_store(tmp_path, v, tile=8, shard=2)
    r = sssp(st, [(5, 5)], cell=True, progress=False, method="shards", unit=16, name="u")
    d, p = result(st, "u")
    assert np.all(np.isinf(d[:, 34:])) and np.all(p[:, 34:] == 255) and np.all(np.isnan(d[:, 30:34]))
    m = r.merge_stats
    assert m["units"] == 16 and m["unreached_units"] == 8 and m["solves"] >= 8 and m["max_solves"] >= 1
    assert m["read_bytes_per_cell"] > 0 and m["written_bytes_per_cell"] > 0
    attrs = st.group["sssp/u"].attrs
    assert attrs["method"] == "shards" and attrs["shards"]["units"] == 16


def test_auto_takes_shards_when_the_grid_does_not_fit(tmp_path):
    v = random_dem((512, 512), 9)
    st = make_store(tmp_path, v, tile=32, shard=2)
    r = sssp(st, [(3, 3)], cell=True, progress=False, memory="4MB", name="a")  # in-core: ~6.6 MB
    assert r.method == "shards" and r.merge_stats["unit"] < 512
    sssp(st, [(3, 3)], cell=True, progress=False, name="whole")
    same_bytes(result(st, "a"), result(st, "whole"))
    with pytest.raises(InputError, match="shard method needs"):
        sssp(st, [(3, 3)], cell=True, progress=False, memory="1KB", method="shards", name="b")
    assert "sssp/b" not in st.results()
    with pytest.raises(InputError, match="multiple of"):
        sssp(st, [(3, 3)], cell=True, progress=False, method="shards", unit=12, name="c")


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_shards_on_dask_equal_local(tmp_path, scheduler):
    pytest.importorskip("dask")
    v = terraced((64, 72), 11, step=5.0)
    st = make_store(tmp_path, v, tile=8, shard=1)
    sssp(st, [(30, 30)], cell=True, progress=False, method="shards", unit=16, name="local")
    r = sssp(st, [(30, 30)], cell=True, progress=False, method="shards", unit=16, name="dask", scheduler=scheduler)
    assert r.merge_stats["rounds"] < r.merge_stats["solves"]  # several units a round
    same_bytes(result(st, "dask"), result(st, "local"))


QUIET_MALLOC = dict(os.environ, MALLOC_ARENA_MAX="2")  # fewer malloc arenas: less allocator noise
PEAK = r"""
import sys
from terrain_io.grid.sssp import sssp
from terrain_io.memory import peak_rss
from terrain_io.store import TerrainStore
small, big, budget = TerrainStore.open(sys.argv[1]), TerrainStore.open(sys.argv[2]), sys.argv[3]
weight = sys.argv[4] if len(sys.argv) > 4 else "surface"
# compile first, with the weight of the run (a run compiles only the queue its weight uses)
sssp(small, (5, 5), cell=True, progress=False, method="shards", memory=budget, weight=weight)
base = peak_rss()
n = big.shape[0]
r = sssp(big, (n // 2, n // 3), cell=True, progress=False, method="shards", memory=budget, weight=weight)
print(base, peak_rss(), r.merge_stats["unit"], r.merge_stats["units"], r.merge_stats["warm_solves"],
      r.merge_stats["kept_solves"])
"""


def test_shards_stay_within_the_budget(tmp_path):
    """A 2048^2 float32 store (16 MiB of cells) under a 5 MiB budget: units of a fraction of it,
    and the run's peak RSS grows by at most the budget, measured in a fresh process."""
    from terrain_io.synth import synthesize

    n, budget = 2048, 5 << 20
    big = synthesize(tmp_path / "big.zarr", n, seed=2, tile=64, shard=1, progress=False)
    small = make_store(tmp_path, random_dem((64, 64), 1), tile=64, shard=1, name="small.zarr")
    out = subprocess.run([sys.executable, "-c", PEAK, str(small.path), str(big.path), str(budget)], env=QUIET_MALLOC,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    base, peak, unit, units, _, _ = map(int, out.stdout.split())
    assert 3 * budget <= n * n * 4 and units >= 64
    assert peak - base <= budget, f"peak RSS grew by {(peak - base) / 2**20:.1f} MiB, budget {budget / 2**20:.0f} MiB"


def test_warm_re_solves_from_disk_stay_within_the_budget(tmp_path):
    """absdiff on terraced ground (flat sea, terraces: units solved ~5 times each) under a budget
    that keeps no unit in memory: the re-solves come warm from the scratch on disk, and peak RSS
    still grows by at most the budget (fresh process)."""
    from terrain_io.synth import synthesize

    n, budget = 1024, 7 << 19  # 3.5 MiB: units of 128^2 (64 of them), none kept
    big = synthesize(tmp_path / "big.zarr", n, seed=2, tile=64, shard=1, progress=False)
    small = make_store(tmp_path, random_dem((64, 64), 1), tile=64, shard=1, name="small.zarr")
    out = subprocess.run([sys.executable, "-c", PEAK, str(small.path), str(big.path), str(budget), "absdiff"],
                         env=QUIET_MALLOC,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    base, peak, unit, units, warm, kept = map(int, out.stdout.split())
    assert units >= 64 and warm - kept > units  # most re-solves from disk
    assert peak - base <= budget, f"peak RSS grew by {(peak - base) / 2**20:.1f} MiB, budget {budget / 2**20:.0f} MiB"
    assert not list(tmp_path.rglob(".*scratch*"))


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
@pytest.mark.parametrize("shape,tile,unit", [((96, 88), 8, 16), ((70, 53), 8, 8)])
def test_re_solves_from_disk_equal_incore_and_scipy(tmp_path, kind, shape, tile, unit):
    """No memory to keep solved units: every re-solve warm from what the unit's last solve left
    on disk (written result, scratch of residuals and levels). Terraces with a flat sea and
    nodata: exact ties, plateaus wound across unit edges; the same bytes as in core, scipy's
    distances, the tie rule's codes; the scratch gone afterwards."""
    v = terraced(shape, sum(shape), step=8.0)
    v[v < np.percentile(v, 30)] = np.float32(np.percentile(v, 30))  # a flat sea
    v[np.random.default_rng(5).random(shape) < 0.04] = np.nan
    st = make_store(tmp_path, v, tile=tile, shard=1, dx=2.0, dy=3.0)
    ok = np.argwhere(~np.isnan(v))
    sources = [tuple(ok[len(ok) // 3]), tuple(ok[-1])]
    r = sssp(st, sources, weight=kind, cell=True, progress=False, method="shards", unit=unit, memory="1KB", name="s")
    m = r.merge_stats
    assert m["kept_solves"] == 0 and m["warm_solves"] == m["solves"] - (m["units"] - m["unreached_units"]) > 0
    assert m["scratch_bytes"] > 0
    sssp(st, sources, weight=kind, cell=True, progress=False, method="incore", name="i")
    same_bytes(result(st, "s"), result(st, "i"))
    ref = reference(v.astype(np.float64), sources, kind, 2.0, 3.0)
    d, p = result(st, "s")
    np.testing.assert_array_equal(d, ref.astype(np.float32))
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, sources, kind, 2.0, 3.0))
    assert not list(tmp_path.rglob(".*scratch*"))


KILLED = r"""
import os, signal, sys, importlib
from terrain_io.grid.sssp import sssp
from terrain_io.store import TerrainStore
shards = importlib.import_module("terrain_io.grid.sssp.shards")
solve, done = shards.solve_unit, []

def dying(task):  # killed outright after a few solves, re-solves from disk among them
    done.append(task)
    if len(done) == 40:
        os.kill(os.getpid(), signal.SIGKILL)
    return solve(task)

shards.solve_unit = dying
sssp(TerrainStore.open(sys.argv[1]), (3, 3), cell=True, progress=False, method="shards", unit=16, memory="1KB")
"""


def test_a_killed_run_leaves_scratch_that_the_next_run_removes(tmp_path):
    v = terraced((64, 64), 3, step=8.0)
    st = make_store(tmp_path / "d", v, tile=8, shard=2)
    out = subprocess.run([sys.executable, "-c", KILLED, str(st.path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr
    left = list(st.path.glob(".sssp-shards.scratch-*"))
    assert len(left) == 1 and any(left[0].iterdir())  # what the killed run had kept
    sssp(st, (3, 3), cell=True, progress=False, method="shards", unit=16, memory="1KB", name="again")
    assert not list(st.path.glob(".*scratch*"))
    sssp(st, (3, 3), cell=True, progress=False, method="incore", name="i")
    same_bytes(result(st, "again"), result(st, "i"))
