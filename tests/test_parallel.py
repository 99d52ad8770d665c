"""Shard tasks on Dask: every scheduler gives the same store, byte for byte; a killed worker is survived."""
import os
import signal
import threading

import numpy as np
import pytest

from terrain_io.errors import TerrainError
from terrain_io.parallel import check_scheduler, close_clusters
from terrain_io.store import TerrainStore
from terrain_io.synth import synthesize

distributed = pytest.importorskip("distributed")

ARGS = dict(cols=700, seed=9, nodata_fraction=0.2, tile=32, shard=2)


def same_store(a: TerrainStore, b: TerrainStore):
    np.testing.assert_array_equal(a.elevation[:], b.elevation[:])
    drop = {"created", "seconds", "source", "generation"}  # generation: a random id per store
    assert {k: v for k, v in a.attrs.items() if k not in drop} == {k: v for k, v in b.attrs.items() if k not in drop}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("ref") / "ref.zarr", 500, **ARGS)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        yield c
        close_clusters()  # the client the pipelines kept for it


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_dask_local_schedulers_give_the_same_store(tmp_path, reference, scheduler):
    same_store(synthesize(tmp_path / "s.zarr", 500, scheduler=scheduler, **ARGS), reference)


def test_distributed_cluster_gives_the_same_store(tmp_path, reference, cluster):
    said = []
    st = synthesize(tmp_path / "c.zarr", 500, scheduler=cluster.scheduler_address, announce=said.append, **ARGS)
    same_store(st, reference)
    assert said and said[0].startswith("dask dashboard:")


def test_killed_worker_is_survived(tmp_path, reference, cluster):
    """SIGKILL one worker process while the shards are being made: its tasks run again elsewhere."""
    client = distributed.Client(cluster.scheduler_address)
    try:
        pids = list(client.run(os.getpid).values())
    finally:
        client.close()
    killer = threading.Timer(0.3, lambda: os.kill(pids[0], signal.SIGKILL))
    killer.start()
    try:
        st = synthesize(tmp_path / "k.zarr", 500, scheduler=cluster.scheduler_address, **ARGS)
    finally:
        killer.cancel()
    same_store(st, reference)
    assert not list(tmp_path.rglob(".*partial*"))
    assert not killer.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # the worker really was killed during the run


@pytest.mark.parametrize("where", ["processes", "cluster"])
def test_raster_conversion_on_dask_gives_the_same_store(tmp_path, reference, cluster, where):
    from terrain_io.convert import convert
    from terrain_io.export import export

    tif = export(reference.path, "elevation", tmp_path / "r.tif")
    local = TerrainStore.open(convert(tif, tmp_path / "local.zarr", tile=32, shard=2).path)
    scheduler = cluster.scheduler_address if where == "cluster" else where
    remote = TerrainStore.open(convert(tif, tmp_path / "dask.zarr", tile=32, shard=2, scheduler=scheduler).path)
    same_store(remote, local)
    with pytest.raises(TerrainError, match="ASCII grid is parsed as one stream"):
        convert(export(reference.path, "elevation", tmp_path / "r.asc"), tmp_path / "a.zarr", scheduler="threads")


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_mst_tile_phase_on_dask_gives_the_same_forest(tmp_path, reference, cluster, where):
    """The MST tile phase as one task per shard (merges on the client): identical mst/edges and totals."""
    from terrain_io.grid.mst import mst

    local_store = TerrainStore.from_array(tmp_path / "l.zarr", reference.elevation[:], tile=32, shard=2)
    dask_store = TerrainStore.from_array(tmp_path / "d.zarr", reference.elevation[:], tile=32, shard=2)
    local = mst(local_store, device="cpu", progress=False)
    scheduler = cluster.scheduler_address if where == "cluster" else where
    remote = mst(dask_store, device="cpu", progress=False, scheduler=scheduler)
    np.testing.assert_array_equal(TerrainStore.open(dask_store.path).group["mst/edges"][:],
                                  TerrainStore.open(local_store.path).group["mst/edges"][:])
    assert (remote.edges, remote.trees, remote.total_weight_exact) == (local.edges, local.trees,
                                                                        local.total_weight_exact)


@pytest.mark.parametrize("weight", ["absdiff", "cell"])
def test_sssp_index_on_dask_gives_the_same_distances(tmp_path, reference, cluster, weight):
    """Phase 1 (the boundary index) as one task per shard, a cost raster file included."""
    from terrain_io.export import export
    from terrain_io.grid.sssp import sssp

    values = reference.elevation[:]
    cost = None
    if weight == "cell":
        cost = str(export(reference.path, "elevation", tmp_path / "cost.tif"))  # elevation as the cost raster
    results = []
    for tag, scheduler in (("local", "local"), ("dask", cluster.scheduler_address)):
        st = TerrainStore.from_array(tmp_path / f"{tag}.zarr", values, tile=32, shard=2,
                                     attrs={"transform": list(reference.transform)})
        valid = np.argwhere(np.isfinite(values))[len(np.argwhere(np.isfinite(values))) // 2]
        r = sssp(st, tuple(int(x) for x in valid), cell=True, weight=weight, cost=cost, progress=False,
                 device="cpu", name="s", scheduler=scheduler, method="index")
        g = TerrainStore.open(st.path).group
        results.append((g["index/" + weight + "/d"][...], g["sssp/s/distance"][:], g["sssp/s/predecessor"][:], r.reached))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_shard_tasks_over_the_memory_budget_are_refused_before_any_work(tmp_path, reference):
    """A worker holds a whole shard: when that needs more than --memory, a one-line error, no index."""
    from click.testing import CliRunner

    from cli.main import _register, cli
    from terrain_io.grid.sssp import sssp

    _register()
    st = TerrainStore.from_array(tmp_path / "m.zarr", reference.elevation[:256, :256], tile=64, shard=4)
    out = CliRunner().invoke(cli, ["index", str(st.path), "--memory", "1MB", "--scheduler", "threads"])
    assert out.exit_code != 0 and "phase 1 needs" in out.output and "raise --memory" in out.output
    assert len(out.output.strip().splitlines()) == 1 and "index" not in TerrainStore.open(st.path).group
    with pytest.raises(TerrainError, match="final phase needs .* more than the memory budget"):
        sssp(st, (100, 100), cell=True, progress=False, device="cpu", memory="1MB", scheduler="threads", method="index")
    assert "index" not in TerrainStore.open(st.path).group and "sssp" not in TerrainStore.open(st.path).group
    out = CliRunner().invoke(cli, ["index", str(st.path), "--memory", "8MB", "--scheduler", "threads"])
    assert out.exit_code == 0, out.output  # enough: the same shards run


def test_unknown_scheduler_is_a_clear_error():
    with pytest.raises(TerrainError, match="unknown scheduler"):
        check_scheduler("mpi")
    with pytest.raises(TerrainError, match="cannot reach the Dask scheduler"):
        from terrain_io.parallel import map_shards

        map_shards(abs, [1], "tcp://127.0.0.1:9")


@pytest.mark.parametrize("where", ["processes", "cluster"])
def test_export_on_dask_writes_the_same_files(tmp_path, reference, cluster, where, monkeypatch):
    """GeoTIFF, ASCII and PNG (downsampled across shard edges), float with NaN and integer with a
    nodata value: the same bytes as the local export; the local path imports no Dask."""
    import subprocess
    import sys

    from terrain_io import export as ex

    monkeypatch.setattr(ex, "PNG_MAX_SIDE", 300)  # factor 3: a stride that does not divide the 64-cell shards
    values = reference.elevation[:]
    ints = np.where(np.isfinite(values), np.nan_to_num(values) * 7, -32768).astype(np.int16)
    istore = TerrainStore.from_array(tmp_path / "i.zarr", ints, tile=32, shard=2, nodata=-32768,
                                     attrs={"transform": list(reference.transform)})
    scheduler = cluster.scheduler_address if where == "cluster" else where
    for src in (reference.path, istore.path):
        for suffix in (".tif", ".asc", ".png"):
            local = ex.export(src, "elevation", tmp_path / f"l{suffix}", overwrite=True)
            remote = ex.export(src, "elevation", tmp_path / f"d{suffix}", overwrite=True, scheduler=scheduler)
            assert local.read_bytes() == remote.read_bytes(), (src, suffix)
    code = (f"import sys; from terrain_io.export import export; export({str(istore.path)!r}, 'elevation', "
            f"{str(tmp_path / 'x.tif')!r}); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('dask', 'distributed')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"



@pytest.mark.parametrize("tile,shard,c,memory", [pytest.param(16, 2, 4, None, marks=pytest.mark.slow), (32, 2, 8, "3MB"),
                                                 (64, 1, 8, None),
                                                 (32, 4, 16, None)])
def test_sssp_final_phase_on_dask_gives_the_same_result(tmp_path, reference, cluster, tile, shard, c, memory):
    """Phase 3 as one task per shard (the tiles' merge results shipped in the task, the worker writing
    its shards): distance and predecessor byte-identical to the local run, with nodata, several
    sources (one on a shard edge), several tile / shard / cluster sizes and a paged merge ("3MB")."""
    from terrain_io.grid.sssp import sssp

    values = reference.elevation[:]
    valid = np.argwhere(np.isfinite(values))
    edge = valid[(valid[:, 0] == tile * shard) | (valid[:, 1] == tile * shard - 1)]
    sources = [tuple(int(x) for x in valid[len(valid) // 3]), tuple(int(x) for x in edge[len(edge) // 2])]
    runs = []
    for tag, scheduler in (("local", "local"), ("dask", cluster.scheduler_address)):
        st = TerrainStore.from_array(tmp_path / f"{tag}.zarr", values, tile=tile, shard=shard,
                                     attrs={"transform": list(reference.transform)})
        r = sssp(st, sources, cell=True, progress=False, device="cpu", name="s", cluster=c, memory=memory,
                 scheduler=scheduler, method="index")
        g = TerrainStore.open(st.path).group
        runs.append((g["sssp/s/distance"][:], g["sssp/s/predecessor"][:], r.reached, r.max_distance))
    (d0, p0, n0, m0), (d1, p1, n1, m1) = runs
    assert d0.tobytes() == d1.tobytes() and p0.tobytes() == p1.tobytes()
    assert (n0, m0) == (n1, m1) and 0 < n0 < values.size and np.isnan(d0[~np.isfinite(values)]).all()
