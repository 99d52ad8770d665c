"""The grid MST's expand begun beside the tile phase (``_EarlyShards``: a shard's own decisions applied
and its chunks encoded once its batch is merged, the chunks that the merges above the shards touch
encoded again at the end) against scipy's minimum spanning forest, and against the shard files of
the pipeline that writes its bits in the tile phase and reads them back (the same bytes)."""
from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from terrain_io.grid.mst import edge_list, mst, read_edges
from terrain_io.store import TerrainStore, valid_mask
from references import islands, scipy_msf, terrain


def _shard_files(store: TerrainStore) -> dict:
    """The bytes of every shard file of ``mst/edges`` by its key."""
    root = Path(store.path) / "mst" / "edges" / "c"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("shape", [(128, 128), (150, 133)])  # whole shards; shards cut by the DEM's edge too
def test_early_encoded_shards_are_the_forest_and_the_same_bytes(tmp_path, monkeypatch, shape):
    mod = sys.modules["terrain_io.grid.mst.pipeline"]
    monkeypatch.setattr(mod, "SERIAL_BELOW", 0)  # full batches merged in one merge_batch call, as a large DEM
    monkeypatch.setattr(mod, "EARLY_EXPAND_CORES", 1)  # (on any machine)
    vals = terrain(*shape, seed=11, levels=30)
    vals[:24, :24] = np.nan  # chunks of nodata only: left out of the shard files
    vals[np.random.default_rng(4).random(shape) < 0.03] = np.nan
    valid = valid_mask(vals, None)
    want, total = scipy_msf(vals, valid)

    def run(name):
        store = TerrainStore.from_array(tmp_path / name, vals, tile=8, shard=2)
        return mst(store, device="cpu", progress=False, batch_tiles=2), store  # (tiled: not in memory)

    res, store = run("early.zarr")
    assert "settle" in res.timings  # the shards were encoded as their batches merged
    u, v = edge_list(read_edges(store))
    assert set(zip(u.tolist(), v.tolist())) == want
    assert Fraction(res.total_weight_exact) == total and res.trees == islands(valid)

    monkeypatch.setattr(mod, "_holds_bits", lambda *a: False)  # bits written by the tile phase, read back
    res_back, store_back = run("back.zarr")
    assert "settle" not in res_back.timings
    assert _shard_files(store) == _shard_files(store_back)
    assert res.merge_decisions == res_back.merge_decisions and res.edges == res_back.edges


def test_a_failed_run_leaves_no_result_and_no_work(tmp_path, monkeypatch):
    """A read that fails mid-way through the tile phase: the error reaches the caller, the store keeps no
    ``mst`` result, and the shards' encodes not started are dropped (the call returns, nothing hangs)."""
    mod = sys.modules["terrain_io.grid.mst.pipeline"]
    monkeypatch.setattr(mod, "SERIAL_BELOW", 0)
    monkeypatch.setattr(mod, "EARLY_EXPAND_CORES", 1)
    store = TerrainStore.from_array(tmp_path / "dem.zarr", terrain(128, 128, seed=2, levels=30), tile=8, shard=2)
    read, calls = TerrainStore.read, []

    def failing(self, win, *args, **kwargs):
        calls.append(win)
        if len(calls) == 40:
            raise OSError("disk gone")
        return read(self, win, *args, **kwargs)

    monkeypatch.setattr(TerrainStore, "read", failing)
    with pytest.raises(OSError, match="disk gone"):
        mst(store, device="cpu", progress=False, batch_tiles=2)
    assert "mst" not in TerrainStore.open(store.path).results()
