"""The GPU store route at scale (issue 29): the accumulation finished a band of rows at a time equals a
topological-order sum written here (Kahn) and the CPU's bytes; the flats' BFS with its rounds
launched in batches (the list lengths kept on the GPU) gives the Barnes 2014 reference's codes on a
lake spanning many tiles (tests/references.py); when the exits' tour does not fit the GPU the store
route falls back to the CPU with one note and the same bytes. Run with ``pytest -m gpu``."""
from __future__ import annotations

import numpy as np
import pytest
from references import FLAT, fill_test_dem, priority_flood, reference_directions, topological_sum

pytestmark = pytest.mark.gpu


def _lake(n=600, radius=270):
    """A rough cone around a wide flat lake (a filled disc) with a channel out of it to the east."""
    rng = np.random.default_rng(4)
    r, c = np.mgrid[:n, :n].astype(np.float64)
    z = 10 + 0.05 * np.hypot(r - n / 2, c - n / 2) + rng.random((n, n))
    z[np.hypot(r - n / 2, c - n / 2) < radius] = 5.0
    z[n // 2, n // 2 + radius - 2:] = np.linspace(4.9, 4.0, n - n // 2 - radius + 2)
    return z.astype(np.float32)


def test_bands_equal_a_topological_sum():
    import cupy as cp

    from terrain_io.grid.flow import _cpu, _gpu

    z = fill_test_dem("nodata-holed", 200, 131, seed=3).astype(np.float32)
    valid = ~np.isnan(z)
    code = _cpu.directions(np.where(valid, priority_flood(np.nan_to_num(z), valid), np.nan), valid, 1.0, 1.0)
    w = np.random.default_rng(1).random(code.shape)
    for weights, self_ in ((None, True), (None, False), (w, True)):
        want = topological_sum(code, weights)
        if weights is None:
            want = want.astype(np.uint64) - (0 if self_ else (code != 255))
        parts = [(r0, r1, b.get()) for r0, r1, b in _gpu.accumulation_bands(cp.asarray(code),
                                                                           None if weights is None else cp.asarray(w),
                                                                           self_, band_rows=32)]
        assert [p[:2] for p in parts] == [(r, min(r + 32, 200)) for r in range(0, 200, 32)]
        got = np.concatenate([p[2] for p in parts])
        whole = _gpu.accumulation(cp.asarray(code), None if weights is None else cp.asarray(w), self_).get()
        assert got.tobytes() == whole.tobytes()
        if weights is None:
            assert got.dtype == np.uint64 and np.array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12)


def test_batched_bfs_rounds_lake_over_many_tiles():
    import cupy as cp

    from terrain_io.grid.flow import _gpu

    z = _lake()
    valid = np.ones(z.shape, bool)
    want, d8, _ = reference_directions(z, valid, 1.0, 1.0, "edge+nodata")
    code, unresolved = _gpu.routed(cp.asarray(z), cp.asarray(valid), 1.0, 1.0)
    assert np.array_equal(code.get(), want)
    assert unresolved == int(np.count_nonzero(d8 == FLAT)) > 200_000
    assert max(_gpu.directions.rounds) > _gpu.ROUNDS_UNCHECKED  # more than one batch of rounds


def test_store_route_bands_and_memory_fallback(tmp_path, monkeypatch):
    from terrain_io.errors import TerrainNote
    from terrain_io.grid.flow import _gpu
    from terrain_io.grid.flow.pipeline import flow, read_flow
    from terrain_io.store import TerrainStore

    z = _lake(150, 60)
    z[60:64, 20:30] = np.nan
    out = {}
    for device in ("cpu", "gpu", "short"):  # tile 8, shards of 2: bands of 32 rows (two shard rows)
        st = TerrainStore.from_array(tmp_path / f"{device}.zarr", z, tile=8, shard=2)
        if device == "short":
            monkeypatch.setattr(_gpu, "TOUR_BYTES", 1 << 50)
            with pytest.warns(TerrainNote, match="Euler tour"):
                res = flow(st, condition="fill", device="gpu", progress=False)
        else:
            res = flow(st, condition="fill", device=device, progress=False)
        out[device] = res, read_flow(st)
    assert out["gpu"][0].device == "gpu" and out["short"][0].device == "cpu"
    for device in ("gpu", "short"):
        for name in ("direction", "accumulation"):
            assert out[device][1][name].tobytes() == out["cpu"][1][name].tobytes(), (device, name)
        a, b = out[device][0], out["cpu"][0]
        assert (a.valid, a.flat_cells, a.sinks, a.outlet_cells, a.max_accumulation) == \
            (b.valid, b.flat_cells, b.sinks, b.outlet_cells, b.max_accumulation)
