"""Results held on the GPU leave it one way (issue 31): ``write_held`` hands CuPy arrays to
``pinned.write_device`` -> ``write_bands`` (pinned bands; zstd on the GPU where nvCOMP is installed),
as the GPU fill and SSSP do. On a GPU machine (``pytest -m gpu``), with nvCOMP's frames and with the
CPU's encoders (``TERRAIN_NVCOMP=0``): plain zarr reads back the values written, the store verifies
clean, and ``terrain flow`` and the hydrology commands on the GPU store the CPU pipelines' cells."""
import numpy as np
import pytest
import zarr

from terrain_io import integrity
from terrain_io.store import TerrainStore, fill_value_for
from test_io_gpu_zstd import pitted_dem

pytestmark = pytest.mark.gpu

WAYS = {"nvcomp": "1", "encoders": "0"}


def nvcomp_or_skip(way):
    from terrain_io import nvzstd

    if way == "nvcomp" and nvzstd.encoder() is None:
        pytest.skip("nvCOMP (pip nvidia-libnvcomp-cu13) is not installed")


@pytest.mark.parametrize("way", WAYS)
def test_write_held_stores_device_arrays_through_the_pinned_bands(tmp_path, monkeypatch, way):
    """Every result dtype, an array edge inside a chunk, shards all of fill value: plain zarr reads the
    values back, ``verify`` is clean, and the arrays went through ``write_bands`` (spied), not the host
    threads' ``write_window``."""
    import cupy as cp

    from terrain_io import pinned
    from terrain_io import store as store_module

    monkeypatch.setenv("TERRAIN_NVCOMP", WAYS[way])
    nvcomp_or_skip(way)
    shape = (203, 150)  # tile 16, shard 2: 7 x 5 shards, the last row and column cut inside a chunk
    rng = np.random.default_rng(3)
    values = {"f4": rng.normal(size=shape).astype(np.float32), "f8": rng.normal(size=shape) * 1e9,
              "u1": rng.integers(0, 9, shape, dtype=np.uint8), "u4": rng.integers(0, 2**32, shape, dtype=np.uint32),
              "u8": rng.integers(0, 2**63, shape, dtype=np.uint64)}
    values["f4"][rng.random(shape) < 0.1] = np.nan
    values["f4"][:64, :64] = np.nan  # whole shards of fill value: no file, as zarr keeps none
    values["u4"][64:, :40] = 0
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(shape, np.float32), tile=16, shard=2)
    calls, bands = [], pinned.write_bands
    monkeypatch.setattr(pinned, "write_bands", lambda *a, **k: calls.append(len(a[0])) or bands(*a, **k))
    monkeypatch.setattr(store_module, "write_window", lambda *a: pytest.fail("a device array went to the host threads"))
    with store.write_result("r") as writer:
        arrays = {k: writer.create_array(k, v.dtype, fill_value_for(v.dtype, None)) for k, v in values.items()}
        pinned.write_held(store, *((arrays[k], cp.asarray(v)) for k, v in values.items()))
    assert calls == [len(values)]
    for k, v in values.items():
        got = zarr.open_array(tmp_path / "s.zarr" / "r" / k, mode="r")[...]
        assert got.dtype == v.dtype and got.tobytes() == v.tobytes(), k
    assert not (tmp_path / "s.zarr" / "r" / "f4" / "c" / "0" / "0").exists()
    assert not integrity.verify(tmp_path / "s.zarr").problems


@pytest.mark.parametrize("tile, shard", [(64, 4), (8, 2)])  # (8, 2): bands of accumulation span 2 shard rows
def test_flow_and_hydrology_on_the_gpu_store_the_cpus_cells(tmp_path, monkeypatch, tile, shard):
    """``flow``, ``basins``, ``streams`` and ``hand`` on the GPU, written with nvCOMP's frames (where
    installed) and with the CPU's encoders, against the CPU pipelines: every stored cell equal, every
    store verified clean; with nvCOMP the flow's bands were compressed on the GPU."""
    from terrain_io import nvzstd
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.grid.hydro.pipeline import basins, hand, streams

    h = pitted_dem(300, 257, 7)
    names = ("flow/direction", "flow/accumulation", "basins/label", "streams/order", "streams/magnitude",
             "streams/link", "hand/height", "hand/drainage")
    ways = [("cpu", "1", "cpu"), ("encoders", "0", "gpu")] + ([("nvcomp", "1", "gpu")] if nvzstd._lib() else [])
    got = {}
    for way, env, device in ways:
        monkeypatch.setenv("TERRAIN_NVCOMP", env)
        st = TerrainStore.from_array(tmp_path / f"{way}.zarr", h, tile=tile, shard=shard)
        res = flow(st, condition="fill", device=device, progress=False)
        assert res.device == device
        assert ("write_gpu_encode" in res.timings) == (way == "nvcomp")
        for run in (basins(st, device=device, progress=False), streams(st, 20, device=device, progress=False),
                    hand(st, 20, device=device, progress=False)):
            assert f"({device}, incore)" in run.line, run.line
        grp = zarr.open_group(tmp_path / f"{way}.zarr", mode="r")
        got[way] = {n: grp[n][...] for n in names}
        assert not integrity.verify(tmp_path / f"{way}.zarr").problems
    for way, _, _ in ways[1:]:
        for n in names:
            assert got[way][n].dtype == got["cpu"][n].dtype and got[way][n].tobytes() == got["cpu"][n].tobytes(), \
                (way, n)
