"""The MST on a cluster: each worker runs the one-process tile pipeline on a run of the Morton
order and merges what its run completes; the client merges the blocks that span runs. Reference:
scipy's minimum spanning tree under the same strict edge order (``references.scipy_msf``), for
every number of runs -- cuts inside quadtree blocks of every level included."""
import numpy as np
import pytest

from references import scipy_msf, terrain
from terrain_io.grid.mst import mst, pipeline
from terrain_io.grid.mst.pipeline import edge_list, read_edges
from terrain_io.store import TerrainStore


def dem(rows=150, cols=190, seed=4):
    """Hills rounded to 12 levels (ties), two nodata patches (islands, edges of tiles)."""
    vals = terrain(rows, cols, seed, levels=12)
    vals[40:60, 30:45] = np.nan
    vals[100:150, 120:128] = np.nan
    return vals


def in_process(monkeypatch, runs: int):
    """A pretended cluster of ``runs`` workers: its tasks run here, one after another."""
    monkeypatch.setattr(pipeline, "scheduler_workers", lambda scheduler, announce=None: runs)
    monkeypatch.setattr(pipeline, "map_shards", lambda func, items, *a, **k: [func(item) for item in items])


@pytest.mark.parametrize("weight", ["max", "absdiff"])
@pytest.mark.parametrize("runs", [1, 2, 3, 5, 17, 1000])
def test_runs_merged_on_the_client_give_scipys_forest(tmp_path, monkeypatch, weight, runs):
    vals = dem()
    valid = ~np.isnan(vals)
    st = TerrainStore.from_array(tmp_path / f"{weight}{runs}.zarr", vals, tile=16, shard=2)  # 10 x 12 tiles, 30 batches
    in_process(monkeypatch, runs)
    res = mst(st, weight=weight, device="cpu", progress=False, scheduler="tcp://pretended:8786")
    want, total = scipy_msf(np.nan_to_num(vals), valid, weight)
    u, v = edge_list(read_edges(st))
    assert set(zip(u.tolist(), v.tolist())) == want
    assert res.total_weight_exact == str(total) and res.edges == len(want)


def test_a_run_lost_with_its_worker_runs_again_to_scipys_forest(tmp_path):
    """SIGKILL a worker while the runs are on the workers: its run is retried, the same forest."""
    import os
    import signal
    import threading

    distributed = pytest.importorskip("distributed")
    from terrain_io.parallel import close_clusters

    vals = dem(200, 230, seed=8)
    valid = ~np.isnan(vals)
    st = TerrainStore.from_array(tmp_path / "k.zarr", vals, tile=16, shard=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        with distributed.Client(c.scheduler_address) as client:
            pids = list(client.run(os.getpid).values())
        killer = threading.Timer(0.5, lambda: os.kill(pids[0], signal.SIGKILL))
        killer.start()
        try:
            res = mst(st, device="cpu", progress=False, scheduler=c.scheduler_address)
        finally:
            killer.cancel()
            close_clusters()
        with pytest.raises(ProcessLookupError):
            os.kill(pids[0], 0)  # the worker really was killed during the run
    want, total = scipy_msf(np.nan_to_num(vals), valid)
    u, v = edge_list(read_edges(st))
    assert set(zip(u.tolist(), v.tolist())) == want and res.total_weight_exact == str(total)
