"""The GPU boundary phase (CuPy kernel) against the CPU one (bit for bit), and the whole pipeline on the GPU
against scipy's Dijkstra; run on a GPU machine with ``pytest -m gpu``."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.grid.sssp import _pipeline_cpu as K
from terrain_io.grid.sssp import sssp
from terrain_io.weights import steps_of
from references import check_predecessors, make_store, random_dem, reference


pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("c", [4, 8, 16])
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_gpu_boundary_blocks_equal_cpu(c, kind):
    from terrain_io.grid.sssp._pipeline_gpu import boundary_phase_gpu

    vals = random_dem((75, 90), seed=c + kind, holes=0.1).astype(np.float64)
    steps = steps_of(2.0, 3.0)
    mr, mc, B = -(-75 // c), -(-90 // c), 4 * c - 4
    cpu_d = np.full((mr, mc, B, B), np.inf, np.float32)
    cpu_v = np.full((mr, mc, B), np.nan)
    K.boundary_phase(vals, c, kind, steps, cpu_d, cpu_v)
    gpu_d, gpu_v = boundary_phase_gpu(vals, c, kind, steps)
    np.testing.assert_array_equal(gpu_d.get(), cpu_d)  # bit for bit
    np.testing.assert_array_equal(gpu_v.get(), cpu_v)


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
@pytest.mark.parametrize("cluster", [8, 16])
def test_gpu_pipeline_matches_scipy(tmp_path, kind, cluster):
    vals = random_dem((70, 83), seed=cluster, holes=0.07)
    vals[32, 32] = vals[5, 70] = 1.0
    sources = [(32, 32), (5, 70)]
    st = make_store(tmp_path, vals, tile=32, dx=2.0, dy=2.0)
    r = sssp(st, sources, weight=kind, cell=True, progress=False, device="gpu", cluster=cluster, method="index")
    assert st.group["index/" + kind].attrs["device"] == "gpu"
    d = st.group[f"sssp/{r.name}/distance"][:].astype(np.float64)
    p = st.group[f"sssp/{r.name}/predecessor"][:]
    ref = reference(vals.astype(np.float64), sources, kind, 2.0, 2.0)
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-4, equal_nan=True)
    check_predecessors(d, p, vals, sources, kind, 2.0, 2.0)


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
@pytest.mark.parametrize("cluster", [4, 8, 16])
def test_gpu_pipeline_bit_identical_to_cpu(tmp_path, kind, cluster):
    """Phases 1 and 3 on the GPU give the CPU's index, distances and predecessor codes byte for byte
    (plateaus with exact ties, nodata, partial clusters and tiles, sources on several tiles)."""
    vals = random_dem((90, 77), seed=10 + cluster, holes=0.08)
    vals[vals < 6] = 6.0
    sources = [(40, 40), (3, 70), (89, 0)]
    for s in sources:
        vals[s] = 6.0
    out = {}
    for device in ("cpu", "gpu"):
        st = make_store(tmp_path, vals, tile=32, name=f"{device}.zarr", dx=2.0, dy=3.0)
        sssp(st, sources, weight=kind, cell=True, progress=False, device=device, cluster=cluster, name="x", method="index")
        g = st.group
        out[device] = [g[f"index/{kind}/d"][:], g["sssp/x/distance"][:].view(np.uint32), g["sssp/x/predecessor"][:]]
    for a, b in zip(out["cpu"], out["gpu"]):
        np.testing.assert_array_equal(a, b)


def test_gpu_phases_on_dask_workers_equal_local_cpu(tmp_path):
    """The MST tile phase and SSSP phases 1 and 3 as Dask shard tasks on GPU workers (two worker
    processes sharing this GPU, as dask-cuda's workers would each take one): the local CPU run's bytes."""
    distributed = pytest.importorskip("distributed")
    from terrain_io.grid.mst import mst

    vals = random_dem((150, 130), seed=3, holes=0.05)
    sources = [(70, 60), (5, 120)]
    out = {}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl:
        for tag, device, scheduler in (("cpu", "cpu", "local"), ("dask", "gpu", cl.scheduler_address)):
            st = make_store(tmp_path, vals, tile=32, shard=2, name=f"{tag}.zarr")
            for weight in ("max", "absdiff"):
                r = mst(st, weight=weight, device=device, progress=False, scheduler=scheduler)
                out[tag, weight] = (st.group["mst/edges"][:], r.total_weight_exact, r.trees)
            sssp(st, sources, cell=True, progress=False, device=device, cluster=8, name="x", scheduler=scheduler)
            g = st.group
            out[tag] = [g["index/absdiff/d"][:], g["sssp/x/distance"][:].view(np.uint32), g["sssp/x/predecessor"][:]]
            if tag == "dask":
                assert g["index/absdiff"].attrs["device"] == "gpu"
    for weight in ("max", "absdiff"):
        np.testing.assert_array_equal(out["cpu", weight][0], out["dask", weight][0])
        assert out["cpu", weight][1:] == out["dask", weight][1:]
    for a, b in zip(out["cpu"], out["dask"]):
        np.testing.assert_array_equal(a, b)
