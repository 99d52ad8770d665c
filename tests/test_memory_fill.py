"""fill under a memory budget: where nothing would run in parallel -- batches of one tile -- the
tiled pipeline starts no thread pool (:func:`terrain_io.jit.in_threads` takes one thread for one
tile). On a cold numba cache the parallel builds it once had were compiled inside an out-of-core
run, and their compiler grew it by ~70 MiB past its budget
(``tests/test_grid_fill.py::test_memory_budget_out_of_core``, slow: +96.5 MiB under 40 MB at
4096^2 before, +25.6 MiB after); no numba parallel build is left. Results against the
Priority-Flood and lake references."""
from __future__ import annotations

import numba
import pytest

from references import check_against_references, fill_test_dem
from terrain_io.store import TerrainStore


@pytest.mark.parametrize("batch_tiles", [1, 2])
def test_fill_of_one_tile_batches_runs_on_one_thread(tmp_path, monkeypatch, batch_tiles):
    from terrain_io.grid.fill import _cpu as K
    from terrain_io.grid.fill import pipeline

    monkeypatch.setattr(pipeline, "SERIAL_BELOW", 1)  # the DEM counts as large: threaded entries by default
    chunks = []  # the chunk of every piece of work in_threads ran: 0 only, one thread
    in_threads = K.in_threads

    def spy(n, run, threads=None):
        return in_threads(n, lambda c, lo, hi: chunks.append(c) or run(c, lo, hi), threads)

    monkeypatch.setattr(K, "in_threads", spy)
    h = fill_test_dem("terraced", 40, 56, 3)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2)
    res, _ = check_against_references(st, batch_tiles=batch_tiles, held=False)
    assert res.method == "tiled" and res.batch_tiles == batch_tiles
    assert chunks  # (the spy saw the batches)
    if batch_tiles == 1:
        assert set(chunks) == {0}
    elif numba.get_num_threads() > 1:  # 2 x 2 tiles a batch on several threads: chunks in parallel
        assert max(chunks) > 0
