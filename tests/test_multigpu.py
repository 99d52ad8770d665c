"""``--scheduler local-cuda``: a Dask worker per GPU gives the bytes of one GPU and of the CPU.

Every test runs twice: on the CPU here (the same cluster spec -- plain ``distributed`` nannies
pinned by ``CUDA_VISIBLE_DEVICES`` -- with two pretended GPUs, tasks on the CPU), and on a host with
two GPUs or more (``pytest -m multigpu``: dask-cuda when it imports, ``--device gpu``), skipped with
a reason elsewhere. References: the local CPU run (itself tested against networkx, scikit-image and
scipy in the pipelines' own tests) and the one-GPU run in this process.
"""
import os
import signal
import sys
import threading

import numpy as np
import pytest

from terrain_io import parallel
from terrain_io.store import TerrainStore
from terrain_io.synth import synthesize

distributed = pytest.importorskip("distributed")


def _gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs 2 or more CUDA GPUs (pytest -m multigpu on such a host)")
DEVICES = [pytest.param("cpu", id="cpu-pretended-gpus"),
           pytest.param("gpu", id="gpus", marks=[pytest.mark.multigpu, two_gpus])]


@pytest.fixture
def local_cuda(request, monkeypatch):
    """``local-cuda`` for the test's device: on the CPU two pretended GPUs without dask-cuda (the
    fallback spec); closed after the test."""
    if request.param == "cpu":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        monkeypatch.setitem(sys.modules, "dask_cuda", None)  # the fallback, whatever is installed
    parallel.close_clusters()
    yield request.param
    parallel.close_clusters()


def store_for(tmp_path, name="dem.zarr", size=200):
    # tile 32, shard 2: 64^2-cell shards, a dozen shard tasks; terraces (exact ties) and nodata
    return synthesize(tmp_path / name, size, cols=size + 40, seed=5, nodata_fraction=0.1, tile=32, shard=2)


def arrays(st: TerrainStore, group: str) -> dict:
    g = TerrainStore.open(st.path).group[group]
    return {k: np.atleast_1d(np.asarray(a[...])).view(np.uint8) for k, a in g.arrays()}


def same(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def run_all(st, device, scheduler) -> dict:
    from terrain_io.grid.fill import fill
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.grid.hydro.pipeline import basins, hand, streams
    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp.engine import sssp

    out = {}
    r = mst(st, device=device, progress=False, scheduler=scheduler)
    out["mst"] = (arrays(st, "mst"), r.total_weight_exact, r.trees)
    sssp(st, [(40, 50), (150, 200)], cell=True, progress=False, device=device, method="shards", unit=64,
         name="s", scheduler=scheduler)
    out["shards"] = arrays(st, "sssp/s")
    sssp(st, [(40, 50)], cell=True, progress=False, device=device, method="index", cluster=8, name="i",
         scheduler=scheduler)
    out["index"] = arrays(st, "sssp/i")
    r = fill(st, device=device, progress=False, scheduler=scheduler)
    out["fill"] = (arrays(st, "fill"), r.depressions, r.filled_cells)
    if device == "gpu" or scheduler == "local":  # flow's Dask task is its whole GPU route
        flow(st, device=device, progress=False, scheduler=scheduler)
        out["flow"] = arrays(st, "flow")
    else:
        flow(st, device=device, progress=False)
    # the hydrology: each command one task on a worker (its GPU)
    basins(st, device=device, progress=False, scheduler=scheduler)
    out["basins"] = arrays(st, "basins")
    streams(st, 30, device=device, progress=False, scheduler=scheduler)
    out["streams"] = arrays(st, "streams")
    hand(st, 30, device=device, progress=False, scheduler=scheduler)
    out["hand"] = arrays(st, "hand")
    return out


def compare(got: dict, want: dict):
    for key in got.keys() & want.keys():
        g, w = got[key], want[key]
        if isinstance(g, tuple):
            same(g[0], w[0])
            assert g[1:] == w[1:], key
        else:
            same(g, w)


@pytest.mark.parametrize("local_cuda", DEVICES, indirect=True)
def test_workers_each_own_one_gpu(local_cuda):
    """One single-threaded worker per GPU, each seeing its own GPU first: no two share a context."""
    said = []
    address = parallel.local_cuda_address(said.append)
    assert said and said[0].startswith("local-cuda: ")
    with distributed.Client(address) as client:
        assert set(client.nthreads().values()) == {1}
        seen = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0])
        assert len(seen) == len(parallel.visible_gpus()) >= 2
        assert len(set(seen.values())) == len(seen)
        if local_cuda == "gpu":
            def bus():
                import cupy

                return cupy.cuda.Device(0).pci_bus_id
            buses = client.run(bus)
            assert len(set(buses.values())) == len(buses)
    parallel.close_clusters()
    assert not parallel._clusters


@pytest.mark.parametrize("local_cuda", [pytest.param("cpu", id="cpu-pretended-gpus", marks=pytest.mark.slow),
                                        DEVICES[1]], indirect=True)
def test_pipelines_on_local_cuda_give_the_bytes_of_one_device_and_the_cpu(tmp_path, local_cuda):
    """MST, SSSP (shards and index), fill, flow, basins, streams and HAND with ``--scheduler local-cuda``: the bytes of the
    local run on one device and of the local CPU run."""
    device = local_cuda
    cpu = run_all(store_for(tmp_path, "cpu.zarr"), "cpu", "local")
    on_cluster = run_all(store_for(tmp_path, "cluster.zarr"), device, "local-cuda")
    compare(on_cluster, cpu)
    if device == "gpu":
        assert {"mst", "shards", "index", "fill", "flow", "basins", "streams", "hand"} <= on_cluster.keys()
        compare(run_all(store_for(tmp_path, "one.zarr"), "gpu", "local"), on_cluster)


@pytest.mark.parametrize("local_cuda", DEVICES, indirect=True)
def test_store_commands_on_local_cuda_give_the_bytes_of_local(tmp_path, local_cuda):
    """synth, convert (a GeoTIFF) and export (GeoTIFF, ASCII, PNG) on ``local-cuda``: the store's
    elevation and the exported files byte for byte those of the local run (commands without GPU
    phases: the workers read, write and format the shards)."""
    rasterio = pytest.importorskip("rasterio")
    from terrain_io.convert import convert
    from terrain_io.export import export

    made = {s: synthesize(tmp_path / f"{s}.zarr", 200, cols=240, seed=5, nodata_fraction=0.1, tile=32, shard=2,
                          scheduler=s) for s in ("local", "local-cuda")}
    same(arrays(made["local"], ""), arrays(made["local-cuda"], ""))
    exported = {}
    for s, st in made.items():
        for suffix in ("tif", "asc", "png"):
            export(st.path, "elevation", tmp_path / f"{s}.{suffix}", scheduler=s)
            exported.setdefault(suffix, []).append((tmp_path / f"{s}.{suffix}").read_bytes())
    for suffix, (a, b) in exported.items():
        assert a == b, suffix
    with rasterio.open(tmp_path / "local.tif") as src:  # the GeoTIFF holds the store's cells
        np.testing.assert_array_equal(src.read(1, masked=True).filled(np.nan),
                                      np.asarray(made["local"].group["elevation"][...]))
    converted = {s: convert(tmp_path / "local.tif", tmp_path / f"c-{s}.zarr", tile=32, shard=2, scheduler=s)
                 for s in ("local", "local-cuda")}
    same(arrays(TerrainStore.open(tmp_path / "c-local.zarr"), ""),
         arrays(TerrainStore.open(tmp_path / "c-local-cuda.zarr"), ""))
    assert converted["local"].valid == converted["local-cuda"].valid == int(np.isfinite(
        np.asarray(made["local"].group["elevation"][...])).sum())


@pytest.mark.parametrize("local_cuda", DEVICES, indirect=True)
def test_killed_worker_reruns_to_the_same_bytes(tmp_path, local_cuda):
    """SIGKILL one worker while the SSSP index's shard tasks run: its tasks run again, same bytes."""
    from terrain_io.grid.sssp.engine import sssp

    device = local_cuda
    ref = store_for(tmp_path, "ref.zarr", 300)
    sssp(ref, [(40, 50)], cell=True, progress=False, device="cpu", method="index", cluster=8, name="i")
    st = store_for(tmp_path, "k.zarr", 300)
    with distributed.Client(parallel.local_cuda_address()) as client:
        pids = list(client.run(os.getpid).values())
    killer = threading.Timer(0.5, lambda: os.kill(pids[0], signal.SIGKILL))
    killer.start()
    try:
        sssp(st, [(40, 50)], cell=True, progress=False, device=device, method="index", cluster=8, name="i",
             scheduler="local-cuda")
    finally:
        killer.cancel()
    assert not killer.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # the worker really was killed during the run
    same(arrays(st, "sssp/i"), arrays(ref, "sssp/i"))
    same(arrays(st, "index/absdiff"), arrays(ref, "index/absdiff"))
    assert not list(tmp_path.rglob(".*partial*"))


def test_local_cuda_without_a_gpu_is_one_clear_error(monkeypatch):
    from terrain_io.errors import TerrainError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    parallel.close_clusters()
    with pytest.raises(TerrainError, match="local-cuda: no CUDA GPU"):
        parallel.map_shards(abs, [1], "local-cuda")
    assert parallel.check_scheduler("local-cuda") == "local-cuda"
