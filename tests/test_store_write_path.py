"""The store's own shard writer (issue 31): chunks encoded in a pool of threads, each shard written
with one call. Its files are checked against zarr-python's own writer of the same array (the
reference: byte for byte), read by plain zarr and xarray, and verified by the integrity check."""
import numpy as np
import pytest
import zarr

from terrain_io import integrity
from terrain_io import store as store_mod
from terrain_io.store import TerrainStore, overwrite_file, write_shard

SHAPE = (300, 170)  # 2 x 2 shards of 128^2 (32^2 tiles), the last ones partial


def values_of(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    z = (np.add.outer(np.arange(SHAPE[0]), 2 * np.arange(SHAPE[1])) + rng.normal(0, 0.3, SHAPE)).astype("float64")
    if dtype.startswith("float"):
        z[:40, :70] = np.nan  # whole chunks of fill value: left out of the shard, as zarr does
        z[200, 5] = np.nan
        return z.astype(dtype)
    v = (z % 251).astype(dtype)
    v[:64, :] = 0  # fill value 0
    return v


def shard_files(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("c/*/*")) if p.is_file()}


def assert_zarrs_own_files(tmp_path, values):
    """The shard files of result ``r/v`` in ``tmp_path/s.zarr`` are those zarr-python writes itself for
    ``values`` in an array of the same metadata (the reference), byte for byte."""
    meta = zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r").metadata.to_dict()
    ref = zarr.create_array(tmp_path / "ref.zarr", shape=SHAPE, dtype=values.dtype, chunks=(32, 32),
                            shards=(128, 128), fill_value=meta["fill_value"],
                            compressors=[store_mod._COMPRESSOR, store_mod._CHECKSUM])
    ref[...] = values
    ours = shard_files(tmp_path / "s.zarr" / "r" / "v")
    assert ours and ours == shard_files(tmp_path / "ref.zarr")


@pytest.fixture(params=[False, True], ids=["caller-thread", "encode-pool"])
def pool(request, monkeypatch, chunk_codec):
    """Both ways of encoding a shard: in its caller's thread, and in the pool (runs of chunks or
    chunk by chunk: ``chunk_codec``)."""
    monkeypatch.setattr(store_mod, "_PARALLEL_SHARD_BYTES", 0 if request.param else 1 << 62)
    if request.param:  # a run a chunk: the runs shared between the writer and the pool
        monkeypatch.setattr(store_mod, "_CODEC_RUN_BYTES", 1)
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "float64", "uint8", "uint32"])
def test_shards_are_byte_identical_to_zarrs_own_writer_and_read_by_zarr_and_xarray(tmp_path, dtype, pool):
    xr = pytest.importorskip("xarray")
    values = values_of(dtype)
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    with store.write_result("r") as writer:
        arr = writer.create_array("v", dtype, store_mod.fill_value_for(dtype, None))
        for win in store.shards():
            sh = arr.shards
            write_shard(arr, win.r0 // sh[0], win.c0 // sh[1], values[win.slices])  # strided views
    assert_zarrs_own_files(tmp_path, values)
    plain = zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r")[...]
    assert plain.dtype == values.dtype and plain.tobytes() == values.tobytes()
    ds = xr.open_zarr(tmp_path / "s.zarr" / "r", consolidated=False, mask_and_scale=False)
    assert ds["v"].values.tobytes() == values.tobytes()
    report = integrity.verify(tmp_path / "s.zarr")
    assert not report.problems and report.chunks > 0, report
    assert TerrainStore.open(tmp_path / "s.zarr", mode="r").read(store.shard_window(1, 1), "r/v").tobytes() \
        == values[128:256, 128:].tobytes()


def test_all_fill_shard_leaves_no_file_and_an_old_one_goes(tmp_path, pool):
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros((64, 64), "float32"), tile=8, shard=8)
    arr = zarr.open_array(tmp_path / "s.zarr" / "elevation", mode="r+")
    path = tmp_path / "s.zarr" / "elevation" / "c" / "0" / "0"
    write_shard(arr, 0, 0, np.ones((64, 64), "float32"))
    assert path.is_file()
    write_shard(arr, 0, 0, np.full((64, 64), np.nan, "float32"))
    assert not path.exists() and np.isnan(arr[...]).all()
    del store


def test_overwrite_file_gathers_many_parts_and_cuts_a_longer_old_file(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "_IOV_MAX", 3)  # several pwritev calls
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    parts = [b"ab", np.arange(5, dtype="<u4"), b"", memoryview(b"cdef"), bytearray(b"g")]
    overwrite_file(path, parts)
    assert path.read_bytes() == b"ab" + np.arange(5, dtype="<u4").tobytes() + b"cdefg"


def test_shared_runs_keep_order_use_both_sides_and_raise_the_first_error(monkeypatch):
    """The caller takes runs while it waits, the pool the others; results come in order; a failing run's
    error is raised when its turn comes, after the runs before it."""
    import threading
    import time

    monkeypatch.setattr(store_mod.os, "cpu_count", lambda: 4)  # (a lone writer: helped by the pool)

    seen = []

    def work(k):
        seen.append(threading.current_thread().name)
        time.sleep(0.002 * (k % 3))  # out of order finishing
        if k == 30:
            raise ValueError("run 30")
        return k * k

    got = []
    with pytest.raises(ValueError, match="run 30"):
        for value in store_mod._shared_runs(work, list(range(40))):
            got.append(value)
    assert got == [k * k for k in range(30)]
    assert threading.current_thread().name in seen
    assert any(name.startswith(store_mod._POOL_THREADS) for name in seen)


def test_shared_runs_free_each_result_once_taken_and_stop_the_pool_when_the_caller_stops(monkeypatch):
    """A run's encoded bytes are not held until the shard's last run (a writer's memory would grow to a
    shard's encoded size beside its block); a caller that stops midway (an error in its write) leaves the
    pool's helpers no more runs, and the count of writers goes back down."""
    import gc
    import threading
    import time
    import weakref

    monkeypatch.setattr(store_mod.os, "cpu_count", lambda: 4)

    class Encoded:
        pass

    done = []
    lock = threading.Lock()

    def work(k):
        time.sleep(0.01)
        with lock:
            done.append(k)
        return Encoded()

    runs = store_mod._shared_runs(work, list(range(40)))
    first = weakref.ref(next(runs))
    next(runs)
    gc.collect()
    assert first() is None
    runs.close()
    assert store_mod._WRITERS[0] == 0
    time.sleep(0.3)  # (the helpers finish the runs they took)
    assert len(done) < 40


@pytest.mark.parametrize("given", ["int32", "float64"])
def test_a_block_of_another_dtype_is_stored_cast_as_zarr_casts_it(tmp_path, given, pool):
    """write_shard stores a block of another dtype cast to the array's (as ``arr[...] = block`` does): the
    runs of chunks code the block's own bits, so such a block goes chunk by chunk (a float64 block was
    stored as frames that do not decode, an int32 one as its bits read as float32)."""
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros((64, 64), "float32"), tile=16, shard=4)
    arr = zarr.open_array(tmp_path / "s.zarr" / "elevation", mode="r+")
    block = np.arange(64 * 64).reshape(64, 64).astype(given)
    write_shard(arr, 0, 0, block)
    assert zarr.open_array(tmp_path / "s.zarr" / "elevation", mode="r")[...].tobytes() \
        == block.astype("float32").tobytes()
    del store
