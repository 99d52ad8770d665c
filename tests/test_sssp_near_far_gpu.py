"""The in-core GPU SSSP's distances in near-far order (worklist.cuh's keyed rounds, issue 31): tiles
passed on from round to round still reach scipy's Dijkstra distances and the tie rule's codes, for
every weight model, and the order relaxes a tile far fewer times than rounds of every queued tile.
Run on a GPU machine with ``pytest -m gpu``."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io import worklist
from terrain_io.weights import steps_of
from terrain_io.grid.sssp.incore import ringed, solve_block
from references import KINDS, reference, rule_predecessors, terraced

pytestmark = pytest.mark.gpu


def gpu_solve(block, kind, sources, reach, monkeypatch, steps=None):
    from terrain_io.grid.sssp import _incore_gpu

    monkeypatch.setattr(worklist.KeyedWorkLists, "reach", reach)
    d, lv, p = solve_block(block, kind, steps_of(2.0, 3.0) if steps is None else steps, sources, device="gpu")
    return d.get(), lv.get(), p.get(), _incore_gpu.solve_block_gpu.visits, _incore_gpu.solve_block_gpu.passed


@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
@pytest.mark.parametrize("reach", [2, 16])
def test_near_far_rounds_equal_scipy_and_the_tie_rule(kind, reach, monkeypatch):
    v = terraced((200, 230), 11, step=15.0)  # exact ties and zero-weight plateaus over 8 x 8 tiles
    v[np.random.default_rng(5).random(v.shape) < 0.04] = np.nan
    if kind == "cell":
        v = np.where(np.isnan(v), np.nan, np.abs(v) + 0.5).astype(np.float32)
    ok = np.argwhere(~np.isnan(v))
    sources = [tuple(ok[0]), tuple(ok[len(ok) // 3])]
    d, _, p, _, passed = gpu_solve(ringed(v), KINDS[kind], sources, reach, monkeypatch)
    assert passed > 0  # tiles did wait: the keyed order was exercised
    ref = reference(v.astype(np.float64), sources, kind, 2.0, 3.0)
    inner = d[1:-1, 1:-1].copy()
    inner[np.isnan(v)] = np.nan
    np.testing.assert_array_equal(inner, ref)
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, sources, kind, 2.0, 3.0))


@pytest.mark.parametrize("kind", [4, 5])  # walk, walk with friction: directed; the CPU's Dijkstra
def test_near_far_walk_equals_cpu(kind, monkeypatch):
    from terrain_io.weights import pack_walk_friction

    v = terraced((150, 170), 12, step=6.0)
    v[np.random.default_rng(6).random(v.shape) < 0.03] = np.nan
    if kind == 5:
        friction = np.random.default_rng(7).uniform(0.5, 3.0, v.shape).astype(np.float32)
        v = pack_walk_friction(v, friction)
    steps = steps_of(10.0, 10.0)
    sources = [tuple(np.argwhere(~np.isnan(v))[40])]
    cpu = solve_block(ringed(v), kind, steps, sources)
    d, lv, p, _, passed = gpu_solve(ringed(v), kind, sources, 4, monkeypatch, steps)
    assert passed > 0
    np.testing.assert_array_equal(d, cpu[0])
    np.testing.assert_array_equal(lv, cpu[1])
    np.testing.assert_array_equal(p, cpu[2])


def test_near_far_relaxes_a_tile_fewer_times(monkeypatch):
    """Terrain with long winding shortest paths: rounds of every queued tile (a reach wider than
    the grid: the step never narrows) relax each tile many times; near-far order a few times,
    the same bytes."""
    from terrain_io.synth import synth_array

    v = synth_array(1024, 1024, seed=1, period=256.0)
    src = [(512, 512)]
    every = gpu_solve(ringed(v), 1, src, 1 << 30, monkeypatch)
    near_far = gpu_solve(ringed(v), 1, src, 64, monkeypatch)
    for a, b in zip(every[:3], near_far[:3]):
        np.testing.assert_array_equal(a, b)
    tiles = (1024 // worklist.TILE) ** 2
    print(f"relaxations a tile: every queued tile {every[3] / tiles:.1f}, near-far {near_far[3] / tiles:.1f}")
    assert every[4] == 0 < near_far[4]
    assert near_far[3] * 3 < every[3] * 2  # measured on the H100: 14.4 and 6.1 relaxations a tile
