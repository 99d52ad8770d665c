"""Shards written from frames made elsewhere (issue 31): ``store.write_frames``, which the GPU's
zstd (nvCOMP, ``terrain_io.nvzstd``) writes through. On any machine: given zstd frames of the
chunks, it writes zarr-python's own file byte for byte (the reference: zarr writes the same array).
On a GPU machine with nvCOMP (``pytest -m gpu``): the GPU's frames decode, through plain zarr and
xarray, to the values; the store verifies clean and damage is found; a GPU fill and SSSP written so
equal the CPU's way cell for cell."""
import numpy as np
import pytest
import zarr

from terrain_io import integrity
from terrain_io import store as store_mod
from terrain_io.store import TerrainStore, shard_chunks, write_frames
from test_store_write_path import SHAPE, assert_zarrs_own_files, shard_files, values_of

def cpu_frames(arr, values, sr, sc):
    """The chunks' zstd frames as zarr makes them (numcodecs, the array's level), None where all fill."""
    from numcodecs import Zstd

    t0, t1 = arr.chunks
    out = []
    for i, j in shard_chunks(arr, sr, sc):
        r, c = sr * arr.shards[0] + i * t0, sc * arr.shards[1] + j * t1
        chunk = np.full((t0, t1), arr.fill_value, arr.dtype)
        part = values[r : r + t0, c : c + t1]
        chunk[: part.shape[0], : part.shape[1]] = part
        fill = np.isnan(chunk).all() if arr.dtype.kind == "f" else (chunk == arr.fill_value).all()
        out.append(None if fill else Zstd(level=1).encode(chunk))
    return out


def result_store(tmp_path, dtype):
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    return store, store_mod.fill_value_for(dtype, None)


def packed(frames):
    """The frames as views of one buffer, as nvzstd gives them (checksummed in one call)."""
    buffer = np.frombuffer(b"".join(f for f in frames if f is not None), np.uint8)
    out, at = [], 0
    for f in frames:
        out.append(None if f is None else buffer[at : at + len(f)])
        at += 0 if f is None else len(f)
    return out


@pytest.mark.parametrize("views", [False, True], ids=["bytes", "views"])
@pytest.mark.parametrize("dtype", ["float32", "uint8", "uint32"])
def test_write_frames_writes_zarrs_own_file(tmp_path, dtype, views, chunk_codec):
    values = values_of(dtype)
    store, fill = result_store(tmp_path, dtype)
    with store.write_result("r") as writer:
        arr = writer.create_array("v", dtype, fill)
        for win in store.shards():
            sr, sc = win.r0 // arr.shards[0], win.c0 // arr.shards[1]
            frames = cpu_frames(arr, values, sr, sc)
            write_frames(arr, sr, sc, packed(frames) if views else frames)
    assert_zarrs_own_files(tmp_path, values)
    assert not integrity.verify(tmp_path / "s.zarr").problems


def test_write_frames_refuses_a_wrong_count(tmp_path):
    store, fill = result_store(tmp_path, "float32")
    with pytest.raises(ValueError, match="chunks"), store.write_result("r") as writer:
        arr = writer.create_array("v", "float32", fill)
        write_frames(arr, 0, 0, [None])


def gpu_encoder():
    pytest.importorskip("cupy")
    from terrain_io import nvzstd

    enc = nvzstd.encoder()
    if enc is None:
        pytest.skip("nvCOMP (pip nvidia-libnvcomp-cu13) is not installed")
    return enc


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "uint8", "uint32"])
def test_gpu_frames_read_by_plain_zarr_and_xarray_and_verified(tmp_path, dtype):
    import cupy as cp

    enc = gpu_encoder()
    values = values_of(dtype)
    store, fill = result_store(tmp_path, dtype)
    with store.write_result("r") as writer:
        arr = writer.create_array("v", dtype, fill)
        side = arr.shards[0]
        for sr in range(-(-SHAPE[0] // side)):
            shards = [(sr, sc) for sc in range(-(-SHAPE[1] // arr.shards[1]))]
            band = cp.asarray(values[sr * side : (sr + 1) * side])
            for (_, sc), frames in zip(shards, enc.encode(band, arr, shards, lambda n: np.empty(n, np.uint8))):
                write_frames(arr, sr, sc, frames)
    plain = zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r")[...]
    assert plain.dtype == values.dtype and plain.tobytes() == values.tobytes()
    try:
        import xarray as xr
    except ImportError:  # (the GPU machine may lack it; plain zarr above read the same files)
        xr = None
    if xr is not None:
        ds = xr.open_zarr(tmp_path / "s.zarr" / "r", consolidated=False, mask_and_scale=False)
        assert ds["v"].values.tobytes() == values.tobytes()
    assert not integrity.verify(tmp_path / "s.zarr").problems
    shard = sorted((tmp_path / "s.zarr" / "r" / "v" / "c").rglob("*"))[-1]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 3] ^= 0x40
    shard.write_bytes(bytes(raw))
    assert integrity.verify(tmp_path / "s.zarr").problems


@pytest.mark.gpu
def test_gpu_frames_come_with_their_crc32c(tmp_path):
    """The encoder's frames and each one's crc32c made on the GPU (``fetch``), two arrays a call, the
    next call started before this one is fetched: each sum google-crc32c's of its frame (frames of 9 B
    to 260 KB: compressible, incompressible, all one value), each frame the chunk's bytes."""
    import cupy as cp
    from numcodecs import Zstd

    enc = gpu_encoder()
    rng = np.random.default_rng(3)
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros((512, 768), "float32"), tile=256, shard=1)
    noise = rng.random((512, 768), np.float32)
    noise[:256, :256] = 7  # one value: a frame of a few bytes
    noise[256:, 256:512] = np.round(noise[256:, 256:512] * 4)
    codes = rng.integers(0, 8, (512, 768), dtype=np.uint8)
    with store.write_result("r") as writer:
        arrs = [writer.create_array("d", "float32", store_mod.fill_value_for("float32", None)),
                writer.create_array("p", "uint8", 255)]
        calls = [[(sr, sc) for sc in range(3)] for sr in range(2)]
        bands = [[cp.asarray(noise[sr * 256 : (sr + 1) * 256]), cp.asarray(codes[sr * 256 : (sr + 1) * 256])]
                 for sr in range(2)]
        started = [enc.start(bands[0], arrs, calls[0])]
        started.append(enc.start(bands[1], arrs, calls[1]))
        for sr, s in enumerate(started):
            frames, sums = enc.fetch(s, lambda n: np.empty(n, np.uint8))
            for arr, values, per_frames, per_sums in zip(arrs, (noise, codes), frames, sums):
                for sc, (f, crc) in enumerate(zip(per_frames, per_sums)):
                    assert bytes(crc[0]) == integrity.crc32c(f[0])
                    chunk = values[sr * 256 : (sr + 1) * 256, sc * 256 : (sc + 1) * 256]
                    assert Zstd().decode(f[0]) == chunk.tobytes()


def pitted_dem(rows: int, cols: int, seed: int) -> np.ndarray:
    """Smooth terrain with pits, flats and nodata holes (float32, NaN = nodata)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:rows, 0:cols]
    h = 0.02 * (y + x) + 3 * np.sin(x / 23.0) * np.cos(y / 31.0) + rng.normal(0, 0.05, (rows, cols))
    h[rng.random((rows, cols)) < 0.002] -= 4  # single-cell pits
    h[100:140, 200:260] = np.round(h[100:140, 200:260])  # flats
    h[rng.random((rows, cols)) < 0.01] = np.nan
    h[300:360, 50:90] = np.nan
    return h.astype("float32")


@pytest.mark.gpu
def test_gpu_fill_and_sssp_stored_through_nvcomp_equal_the_cpus_cells(tmp_path, monkeypatch):
    """GPU runs whose results are compressed by nvCOMP, by the CPU's encoders (TERRAIN_NVCOMP=0)
    and the CPU pipelines: every output cell equal; the GPU's own frames were stored (the shard files
    differ from the CPU encoders')."""
    gpu_encoder()
    from terrain_io.grid.fill import fill, read_fill
    from terrain_io.grid.sssp import sssp

    h = pitted_dem(700, 650, 5)
    src = [tuple(int(v) for v in np.argwhere(np.isfinite(h))[h.size // 3])]
    got = {}
    for way, env, device in (("nvcomp", "1", "gpu"), ("encoders", "0", "gpu"), ("cpu", "1", "cpu")):
        monkeypatch.setenv("TERRAIN_NVCOMP", env)
        st = TerrainStore.from_array(tmp_path / f"{way}.zarr", h, tile=64, shard=4)
        fill(st, device=device, progress=False)
        sssp(st, src, name="a", device=device, method="incore", progress=False)
        grp = zarr.open_group(tmp_path / f"{way}.zarr", mode="r")
        got[way] = (read_fill(st), {k: grp[f"sssp/a/{k}"][...] for k in ("distance", "predecessor")})
        assert not integrity.verify(tmp_path / f"{way}.zarr").problems
    for way in ("encoders", "cpu"):
        for k, v in got["nvcomp"][0].items():
            assert v.tobytes() == got[way][0][k].tobytes(), (way, k)
        for k, v in got["nvcomp"][1].items():
            assert v.tobytes() == got[way][1][k].tobytes(), (way, k)
    assert shard_files(tmp_path / "nvcomp.zarr" / "fill") != shard_files(tmp_path / "encoders.zarr" / "fill")
