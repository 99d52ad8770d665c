"""fill under a memory budget: where nothing would run in parallel -- batches of one tile -- the
tiled pipeline takes the serial builds of its kernels. On a cold numba cache the parallel builds
were compiled inside an out-of-core run, and their compiler grew it by ~70 MiB past its budget
(``tests/test_grid_fill.py::test_memory_budget_out_of_core``, slow: +96.5 MiB under 40 MB at
4096^2 before, +25.6 MiB after). Results against the Priority-Flood and lake references."""
from __future__ import annotations

import numba
import pytest

from references import check_against_references, fill_test_dem
from terrain_io.store import TerrainStore

PARALLEL = ("graph_batch", "final_batch", "relabel", "outlets")


@pytest.mark.parametrize("batch_tiles", [1, 2])
def test_fill_of_one_tile_batches_takes_the_serial_kernels(tmp_path, monkeypatch, batch_tiles):
    from terrain_io.grid.fill import _cpu as K
    from terrain_io.grid.fill import pipeline

    monkeypatch.setattr(pipeline, "SERIAL_BELOW", 1)  # the DEM counts as large: parallel builds by default
    called = []
    for name in PARALLEL:
        def spy(*args, _kernel=getattr(K, name), _name=name, **kw):
            if kw.get("threads") != 1:  # (the serial builds call it with one thread)
                called.append(_name)
            return _kernel(*args, **kw)

        monkeypatch.setattr(K, name, spy)
    h = fill_test_dem("terraced", 40, 56, 3)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2)
    res, _ = check_against_references(st, batch_tiles=batch_tiles, held=False)
    assert res.method == "tiled" and res.batch_tiles == batch_tiles
    if batch_tiles == 1:
        assert called == []
    elif numba.get_num_threads() > 1:  # 2 x 2 tiles a batch on several threads: the parallel builds
        assert {"graph_batch", "final_batch", "relabel"} <= set(called)
