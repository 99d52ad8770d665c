"""``pinned.write_bands`` with several bands of shard rows a call of the GPU's encoder (issue 31: nvCOMP's
zstd nears its rate on 2048 chunks a call, a band of the in-core SSSP's distances holds 1024). On any
machine: nvCOMP's compress stands replaced by numcodecs' zstd on the host, everything else is the
encoder's own (the chunks cut from a band of several shard rows, each array's frames given back per
shard in the files' order); the reference is zarr reading the stored arrays back: the values written,
every fill chunk left out, the store verified clean (each chunk's crc32c, computed by the writers:
``store.write_frames``) -- for one band a call, two (the last call one band), and all of them in one
call, on a grid cut inside a chunk at its edges."""
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from terrain_io import chunkcodec, integrity, nvzstd, pinned
from terrain_io.store import TerrainStore, fill_value_for

SHAPE = (203, 150)  # tile 16, shard 2: 7 shard rows, 5 shard columns, the last of each cut inside a chunk


class HostEncoder(nvzstd.BandEncoder):
    """nvzstd's encoder with its one GPU step, the batched compress, done by numcodecs on the host."""

    def __init__(self):
        self.calls = []

    def encode_many(self, bands, arrs, shards, host):
        self.calls.append(sorted({sr for sr, _ in shards}))
        return super().encode_many(bands, arrs, shards, host)

    def _compress(self, chunks, kept):
        from numcodecs import Zstd

        frames = [Zstd(level=1).encode(np.ascontiguousarray(c[i])) for c, x in zip(chunks, kept) for i in x]
        return np.array([len(f) for f in frames], np.uint64), np.frombuffer(b"".join(frames), np.uint8)

    @staticmethod
    def _to_host(packed, out):
        out[...] = packed


class HostSets:
    """``PinnedBands``' frames buffers in host memory (no GPU)."""

    sets, pin_seconds = 2, 0.0

    def __init__(self):
        self.buffers = {}

    def buffer(self, band, name, shape, dtype):
        buf = self.buffers.get((band % self.sets, name))
        if buf is None or buf.size < np.prod(shape):
            buf = self.buffers[(band % self.sets, name)] = np.empty(shape, dtype)
        return buf.reshape(-1)[: int(np.prod(shape))].reshape(shape)


def values():
    rng = np.random.default_rng(5)
    dist = rng.random(SHAPE, np.float32) * 100
    dist[rng.random(SHAPE) < 0.05] = np.nan
    dist[32:64, :48] = np.nan  # whole chunks of fill value: left out of the files
    codes = rng.integers(0, 8, SHAPE, dtype=np.uint8)
    codes[96:128, 16:32] = 255
    return dist, codes


@pytest.mark.parametrize("per_call, checksums", [(1, "one call"), (2, "one call"), (7, "one call"), (2, "python")])
def test_bands_a_call_store_the_values(tmp_path, monkeypatch, per_call, checksums):
    """``checksums``: a shard's frames' crc32c in one GIL-free call (chunkcodec), or chunk by chunk where
    it cannot be called so."""
    dist, codes = values()
    enc = HostEncoder()
    monkeypatch.setattr(nvzstd, "encoder", lambda: enc)
    if checksums == "python":
        monkeypatch.setattr(chunkcodec, "functions", lambda: None)
    st = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, np.float32), tile=16, shard=2)
    nsr, nsc = st.shard_grid
    bands = [[st.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    with st.write_result("r") as writer:
        arrays = [writer.create_array("distance", "float32", fill_value_for("float32", None)),
                  writer.create_array("predecessor", "uint8", 255)]
        with ThreadPoolExecutor(4) as pool:
            pinned.write_bands(arrays, bands, lambda r0, r1: [dist[r0:r1], codes[r0:r1]], HostSets(), pool,
                               bands_per_call=per_call)
    assert enc.calls == [list(range(a, min(a + per_call, nsr))) for a in range(0, nsr, per_call)]
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    np.testing.assert_array_equal(group["r/distance"][:], dist)
    np.testing.assert_array_equal(group["r/predecessor"][:], codes)
    assert not integrity.verify(tmp_path / "s.zarr").problems


def test_frame_plan_fills_a_call_within_the_budget():
    Store = namedtuple("Store", "shape tile_size shard_size shard_grid")
    big = Store((32768, 32768), 256, 8, (16, 16))  # a band: 1024 chunks of an array
    raw = 2048 * 32768 * 5
    assert pinned.frame_plan(big, [4, 1], 64 << 30) == 2
    assert pinned.frame_plan(big, [4, 1], 3 * raw) == 1  # two sets of two bands' frames: more than the budget
    assert pinned.frame_plan(big, [4, 1], 0) == 1
    small = Store(SHAPE, 16, 2, (7, 5))  # 20 chunks a band: every band in one call
    assert pinned.frame_plan(small, [4, 1], 64 << 30) == 7
