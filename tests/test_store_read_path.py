"""The store's shard read (issue 31): one preadv per shard, its chunks checked and decoded in the codec
pool, in runs of chunks a GIL-free call or chunk by chunk (``chunk_codec``). Reference: zarr-python's own read of the same files (and the values written); damage in a
shard read on the parallel path is refused as on the serial one (DamagedStoreError naming the chunk)."""
from __future__ import annotations

import numpy as np
import pytest
import zarr

import terrain_io.store as store_mod
from terrain_io.errors import DamagedStoreError
from terrain_io.store import TerrainStore, Window, read_shard


@pytest.fixture(params=["serial", "pool", "reader thread"])
def path_kind(request, monkeypatch, chunk_codec):
    if request.param != "serial":  # every shard through the pool, however small (but in a reader thread)
        monkeypatch.setattr(store_mod, "_PARALLEL_SHARD_BYTES", 0)
    return request.param


def _in(path_kind, fn, *args):
    """``fn(*args)`` here, or in a reader thread (which decodes in its own thread)."""
    if path_kind != "reader thread":
        return fn(*args)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


@pytest.mark.parametrize("dtype", ["float32", "float64", "uint8", "uint32"])
def test_shard_reads_equal_zarrs(tmp_path, dtype, path_kind):
    rng = np.random.default_rng(3)
    v = (rng.random((45, 70)) * 200).astype(dtype)
    if v.dtype.kind == "f":
        v[rng.random(v.shape) < 0.1] = np.nan
        v[:16, 32:48] = np.nan  # an all-fill chunk: absent from its shard's index
    st = TerrainStore.from_array(tmp_path / "a.zarr", v, tile=8, shard=4, nodata=None if v.dtype.kind == "f" else 0)
    plain = zarr.open_array(str(tmp_path / "a.zarr" / "elevation"), mode="r")  # zarr-python alone
    ref = plain[...]
    np.testing.assert_array_equal(ref, v)
    arr = st.elevation
    for sr in range(2):
        for sc in range(3):
            r0, c0 = sr * 32, sc * 32
            got = _in(path_kind, read_shard, arr, sr, sc)
            assert got.tobytes() == ref[r0 : r0 + 32, c0 : c0 + 32].tobytes()
    for win in (Window(3, 29, 5, 31), Window(32, 45, 64, 70), Window(40, 41, 33, 60)):  # parts of one shard
        got = _in(path_kind, st.read, win)
        assert got.tobytes() == ref[win.slices].tobytes()


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_damage_refused_on_either_path(tmp_path, damage, path_kind):
    v = np.random.default_rng(4).random((32, 32)).astype(np.float32)
    st = TerrainStore.from_array(tmp_path / "a.zarr", v, tile=8, shard=4)
    shard = next(p for p in (tmp_path / "a.zarr" / "elevation").rglob("*") if p.is_file() and p.name != "zarr.json"
                 and p.name != "terrain-manifest.json")
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[40] ^= 0xFF  # inside the first chunk's frame
        shard.write_bytes(bytes(data))
        with pytest.raises(DamagedStoreError, match=r"chunk \(\d+, \d+\).*checksum"):
            _in(path_kind, read_shard, TerrainStore.open(st.path).elevation, 0, 0)
    else:
        shard.write_bytes(bytes(data[: len(data) // 2]))
        with pytest.raises(DamagedStoreError):
            _in(path_kind, read_shard, TerrainStore.open(st.path).elevation, 0, 0)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_bands_through_pinned_buffers_give_the_cpu_bytes(tmp_path):
    """Bands large enough that a copy to or from the GPU takes a while (4096^2, bands of 1024 rows, 16 MB):
    the in-core GPU fill and SSSP read their bands through one reused pinned buffer and write through
    pinned sets; their results equal the CPU pipelines' byte for byte (which the references hold)."""
    pytest.importorskip("cupy")
    from terrain_io.grid.fill import fill, read_fill
    from terrain_io.grid.sssp import sssp
    from terrain_io.synth import synthesize

    path = tmp_path / "s.zarr"
    synthesize(path, 4096, seed=3, tile=256, shard=4)
    st = TerrainStore.open(path)
    fill(st, device="cpu", progress=False)
    want = read_fill(st)
    for _ in range(2):  # (a race shows as runs that differ)
        assert fill(st, device="gpu", progress=False).device == "gpu"
        got = read_fill(st)
        for name in want:
            assert got[name].tobytes() == want[name].tobytes(), name
    for device in ("cpu", "gpu"):
        sssp(st, [(2000, 2100)], name=device, weight="absdiff", cell=True, progress=False, method="incore",
             device=device)
    for name in ("distance", "predecessor"):
        assert st.group[f"sssp/gpu/{name}"][...].tobytes() == st.group[f"sssp/cpu/{name}"][...].tobytes(), name


@pytest.mark.parametrize("reader", ["main thread", "reader thread"])
def test_a_read_is_decoded_in_small_runs(tmp_path, monkeypatch, reader):
    """A shard or a window of it is decoded in runs of at most ``_READ_RUN_BYTES`` of cells (a window's
    chunks come as one piece, a shard's as each piece read holds: cut, idle cores share them), from
    the main thread or a reader thread; the cells are zarr's."""
    from terrain_io import chunkcodec

    if chunkcodec.functions() is None:
        pytest.skip("zstd or crc32c not callable here")
    monkeypatch.setattr(store_mod, "_codec_runs", lambda nbytes: chunkcodec)
    monkeypatch.setattr(store_mod, "_PARALLEL_SHARD_BYTES", 0)
    monkeypatch.setattr(store_mod, "_READ_RUN_BYTES", 2 * 8 * 8 * 4)  # two chunks a run
    monkeypatch.setattr(store_mod, "_READ_PIECE", 1000)  # several pieces a shard
    v = (np.random.default_rng(4).random((64, 64)) * 200).astype("float32")
    TerrainStore.from_array(tmp_path / "s.zarr", v, tile=8, shard=8)
    arr = zarr.open_array(tmp_path / "s.zarr" / "elevation", mode="r")
    calls = []
    decode_run = chunkcodec.decode_run
    monkeypatch.setattr(chunkcodec, "decode_run", lambda raw, jobs, *a: calls.append(len(jobs)) or decode_run(raw, jobs, *a))
    for part in (Window(3, 45, 5, 60), None):
        calls.clear()
        got = _in("reader thread" if reader == "reader thread" else "serial", read_shard, arr, 0, 0, part)
        want = v if part is None else v[part.slices]
        assert got.tobytes() == want.tobytes()
        assert max(calls) <= 2 and sum(calls) == (6 * 8 if part is not None else 64), calls


@pytest.mark.parametrize("damaged", [False, True])
def test_parallel_readers_share_the_decoding(tmp_path, monkeypatch, damaged):
    """Many reader threads, each reading shards into its place of one array, their runs decoded by
    whichever thread is free (the process's queue of ready runs): the cells are zarr's; a damaged shard
    fails its own reader only (the chunk named), the others' cells are still zarr's."""
    import concurrent.futures

    from terrain_io import chunkcodec

    if chunkcodec.functions() is None:
        pytest.skip("zstd or crc32c not callable here")
    monkeypatch.setattr(store_mod, "_codec_runs", lambda nbytes: chunkcodec)
    monkeypatch.setattr(store_mod, "_PARALLEL_SHARD_BYTES", 0)
    monkeypatch.setattr(store_mod, "_READ_RUN_BYTES", 8 * 8 * 4)  # a chunk a run
    monkeypatch.setattr(store_mod, "_READ_PIECE", 600)
    rng = np.random.default_rng(5)
    v = (rng.random((96, 128)) * 500).astype("float32")
    st = TerrainStore.from_array(tmp_path / "s.zarr", v, tile=8, shard=4)  # 3 x 4 shards of 4 x 4 chunks
    bad = (1, 2)
    if damaged:
        shard = tmp_path / "s.zarr" / "elevation" / "c" / str(bad[0]) / str(bad[1])
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF
        shard.write_bytes(bytes(data))
    ref = zarr.open_array(str(tmp_path / "s.zarr" / "elevation"), mode="r")
    arr = TerrainStore.open(st.path).elevation
    out = np.full(v.shape, -1, np.float32)

    def one(shard):
        sr, sc = shard
        read_shard(arr, sr, sc, out=out[sr * 32 : sr * 32 + 32, sc * 32 : sc * 32 + 32])

    shards = [(sr, sc) for sr in range(3) for sc in range(4)]
    for _ in range(3):  # (a race shows as reads that differ)
        out[...] = -1
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = {s: pool.submit(one, s) for s in shards}
        for (sr, sc), future in futures.items():
            if damaged and (sr, sc) == bad:
                with pytest.raises(DamagedStoreError, match=r"chunk \(\d+, \d+\).*checksum"):
                    future.result()
                continue
            future.result()
            cells = (slice(sr * 32, sr * 32 + 32), slice(sc * 32, sc * 32 + 32))
            assert out[cells].tobytes() == (v[cells] if damaged else ref[cells]).tobytes()
        if not damaged:
            assert out.tobytes() == ref[...].tobytes() == v.tobytes()


def test_a_read_beside_numbas_import_codes_chunk_by_chunk(tmp_path, monkeypatch):
    """numba's registry module half made (another thread importing numba: the kernels' loader, or a CPU
    pipeline's first kernel, beside the readers): a read codes chunk by chunk, and gives zarr's cells
    (it raised AttributeError: the 2-core VM's CPU SSSP, one run in six, session 21)."""
    import sys
    import types

    values = np.random.default_rng(3).random((256, 256)).astype(np.float32)
    store = TerrainStore.from_array(tmp_path / "s.zarr", values, tile=32, shard=8)
    monkeypatch.setattr(store_mod, "_PARALLEL_SHARD_BYTES", 0)
    monkeypatch.setattr(store_mod, "_load_codec_runs", lambda: None)  # (the loader not started here)
    monkeypatch.setitem(sys.modules, "numba.core.registry", types.ModuleType("numba.core.registry"))
    assert store_mod._codec_runs(1 << 30) is None
    got = store.read(Window(0, 256, 0, 256))
    assert np.array_equal(got, zarr.open_array(str(tmp_path / "s.zarr" / "elevation"), mode="r")[:])
