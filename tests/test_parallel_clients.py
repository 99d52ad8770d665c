"""A cluster's client and tasks (``terrain_io.parallel``): one client a scheduler for the whole run,
closed with it; a cluster task's thread decodes its shards on every core (the store's codec pool)."""
import numpy as np
import pytest

from terrain_io import parallel, store
from terrain_io.synth import synthesize

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    # in this process: the tasks' threads see this module's patches
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as c:
        yield c
    parallel.close_clusters()


def test_one_client_serves_every_map_until_closed(cluster, monkeypatch):
    """The shard method maps a round at a time: each map used to connect a client of its own."""
    made = []

    class Counted(distributed.Client):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(distributed, "Client", Counted)
    parallel.close_clusters()
    address = cluster.scheduler_address
    said = []
    for n in range(4):
        assert parallel.map_shards(np.square, range(n + 2), address, announce=said.append) == [i * i for i in range(n + 2)]
    assert list(parallel.imap_shards(np.negative, range(3), address)) == [0, -1, -2]
    assert parallel.scheduler_threads(address) == 1
    assert len(made) == 1
    assert len(said) == 4 and all(s.startswith("dask dashboard:") for s in said)  # each run still says where
    client = parallel._clients[address]
    parallel.close_clusters()
    assert not parallel._clients and client.status == "closed"
    assert parallel.map_shards(np.square, [3], address) == [9]  # connected again
    assert len(made) == 2
    parallel.close_clusters()


def test_cluster_tasks_decode_in_the_codec_pool(cluster, tmp_path, monkeypatch):
    """A local-cuda worker runs one task at a time: its shard reads must use the cores (the main
    thread's rule), where a pipeline's own reader threads decode in their thread."""
    st = synthesize(tmp_path / "s.zarr", 128, seed=3, tile=32, shard=2)
    seen = []
    run_chunks = store._run_chunks

    def spy(fn, jobs, nbytes, *count):
        seen.append(nbytes)
        return run_chunks(fn, jobs, nbytes, *count)

    monkeypatch.setattr(store, "_run_chunks", spy)
    win = store.Window(0, 64, 0, 64)  # one whole shard

    def read(_):
        return store.TerrainStore.open(st.path).read(win), parallel.owns_cores()

    (on_worker, owned), = parallel.map_shards(read, [0], cluster.scheduler_address)
    assert owned and seen and seen[-1] == 64 * 64 * 4  # handed to the pool
    seen.clear()
    (local, owned), = parallel.map_shards(read, [0], "threads")  # Dask's threads: a reader thread's rule
    assert not owned and seen and seen[-1] == 0
    np.testing.assert_array_equal(on_worker, local)
    assert not parallel.owns_cores() or parallel.threading.current_thread() is parallel.threading.main_thread()
    parallel.close_clusters()
