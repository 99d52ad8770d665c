"""``pinned.write_bands`` with several bands of shard rows a call of the GPU's encoder (issue 31: nvCOMP's
zstd nears its rate on 2048 chunks a call, a band of the in-core SSSP's distances holds 1024). On any
machine: nvCOMP's compress and the GPU's crc32c stand replaced by numcodecs' zstd and google-crc32c on
the host, everything else is the encoder's own (the chunks cut from a band of several shard rows, each
array's frames and their crc32c given back per shard in the files' order); the reference is zarr
reading the stored arrays back: the values written, every fill chunk left out, the store verified clean
(each chunk's crc32c, the encoder's, as ``store.write_frames`` stores them) -- for one band a call, two
(the last call one band), and all of them in one call, on a grid cut inside a chunk at its edges; the
order of the pipeline (a call started before the frames of the one before come back, a set of host
buffers filled again only after its writers) and the CPU's way taking over where the GPU's fails."""
import threading
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from terrain_io import chunkcodec, integrity, nvzstd, pinned
from terrain_io.store import TerrainStore, fill_value_for

SHAPE = (203, 150)  # tile 16, shard 2: 7 shard rows, 5 shard columns, the last of each cut inside a chunk


class HostEncoder(nvzstd.BandEncoder):
    """nvzstd's encoder with its GPU steps, the batched compress and the frames' crc32c, done on the
    host (numcodecs' zstd, google-crc32c); ``log``: the calls started and fetched, in order."""

    def __init__(self, fail_at=None):
        self.calls, self.log, self.fail_at = [], [], fail_at

    def start(self, bands, arrs, shards):
        self.calls.append(sorted({sr for sr, _ in shards}))
        self.log.append(("start", len(self.calls) - 1))
        if len(self.calls) - 1 == self.fail_at:
            raise RuntimeError("no GPU here")
        return len(self.calls) - 1, super().start(bands, arrs, shards)

    def fetch(self, started, host):
        self.log.append(("fetch", started[0]))
        return super().fetch(started[1], host)

    @staticmethod
    def has_room(nbytes):
        return True

    def _launch(self, chunks, kept):
        return chunks, kept

    def _frames(self, launched):
        from numcodecs import Zstd

        frames = [Zstd(level=1).encode(np.ascontiguousarray(c[i])) for c, x in zip(*launched) for i in x]
        total = sum(map(len, frames))
        crc_at = -(-total // 8) * 8
        packed = np.zeros(crc_at + 4 * len(frames), np.uint8)
        packed[:total] = np.frombuffer(b"".join(frames), np.uint8)
        packed[crc_at:] = np.frombuffer(b"".join(integrity.crc32c(f) for f in frames), np.uint8)
        return np.array([len(f) for f in frames], np.uint64), packed, crc_at

    def _to_host(self, packed, out):
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


def write(tmp_path, enc, per_call, sets=None, pool_size=4):
    """``values()`` stored through ``write_bands`` with ``enc`` standing in for nvCOMP: the store, and the
    rows each ``band_outputs`` call asked for."""
    dist, codes = values()
    asked = []

    def band_outputs(r0, r1):
        asked.append((r0, r1))
        return [dist[r0:r1], codes[r0:r1]]

    st = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, np.float32), tile=16, shard=2)
    nsr, nsc = st.shard_grid
    bands = [[st.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    with st.write_result("r") as writer:
        arrays = [writer.create_array("distance", "float32", fill_value_for("float32", None)),
                  writer.create_array("predecessor", "uint8", 255)]
        with ThreadPoolExecutor(pool_size) as pool:
            pinned.write_bands(arrays, bands, band_outputs, sets or HostSets(), pool, bands_per_call=per_call)
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    np.testing.assert_array_equal(group["r/distance"][:], dist)
    np.testing.assert_array_equal(group["r/predecessor"][:], codes)
    assert not integrity.verify(tmp_path / "s.zarr").problems  # (each chunk's crc32c: the encoder's)
    return st, asked


@pytest.mark.parametrize("per_call", [1, 2, 7])
def test_bands_a_call_store_the_values(tmp_path, monkeypatch, per_call):
    enc = HostEncoder()
    monkeypatch.setattr(nvzstd, "encoder", lambda: enc)
    monkeypatch.setattr(chunkcodec, "functions", lambda: None)  # (the writers compute no crc32c of their own)
    st, asked = write(tmp_path, enc, per_call)
    nsr = st.shard_grid[0]
    assert enc.calls == [list(range(a, min(a + per_call, nsr))) for a in range(0, nsr, per_call)]
    # each call started before the frames of the one before are fetched; every band's rows asked for once
    n = len(enc.calls)
    assert enc.log == [("start", 0), *[e for i in range(n - 1) for e in [("start", i + 1), ("fetch", i)]],
                       ("fetch", n - 1)]
    assert [r0 for r0, _ in asked] == sorted({r0 for r0, _ in asked})


class CheckedSets(HostSets):
    """Frames buffers that record, each time a set is filled again, whether the writers of the call
    that filled it before are all done (``writing``: those under way, by call)."""

    def __init__(self):
        super().__init__()
        self.writing, self.refilled_early, self.lock = {}, [], threading.Lock()

    def buffer(self, call, name, shape, dtype):
        with self.lock:
            self.refilled_early.append(self.writing.get(call - self.sets, 0))
        return super().buffer(call, name, shape, dtype)


def test_a_set_is_filled_again_after_its_writers(tmp_path, monkeypatch):
    """The call started ahead does not touch the host buffers: call k's frames come into set k % 2 only
    once call k - 2's writers (the first call's held back) are done."""
    from terrain_io import store

    enc, sets, release = HostEncoder(), CheckedSets(), threading.Event()
    real = store.write_frames
    calls_of = {}  # shard row -> its call (one band a call)

    def slow_write(arr, sr, sc, frames, sums):
        with sets.lock:
            sets.writing[calls_of[sr]] = sets.writing.get(calls_of[sr], 0) + 1
        if sr == 0:
            release.wait(0.3)  # the first call's writers still at work while later calls come
        real(arr, sr, sc, frames, sums)
        with sets.lock:
            sets.writing[calls_of[sr]] -= 1

    monkeypatch.setattr(nvzstd, "encoder", lambda: enc)
    monkeypatch.setattr(store, "write_frames", slow_write)
    calls_of.update((sr, sr) for sr in range(7))
    write(tmp_path, enc, 1, sets, pool_size=16)
    assert len(sets.refilled_early) == 7 and not any(sets.refilled_early)


@pytest.mark.parametrize("fail_at", [0, 1, 3])
def test_the_cpu_takes_over_where_the_gpu_fails(tmp_path, monkeypatch, fail_at):
    """nvCOMP failing at a call's start (for 1 and 3, the call started ahead): the calls before the one
    under way written from their frames, that one and the rest by the CPU's encoders from the same
    outputs, each band's asked for once."""
    from terrain_io.errors import TerrainNote

    enc = HostEncoder(fail_at=fail_at)
    monkeypatch.setattr(nvzstd, "encoder", lambda: enc)
    with pytest.warns(TerrainNote, match="GPU's zstd failed"):
        _, asked = write(tmp_path, enc, 1, DownloadSets())
    assert enc.log[-1] == ("start", fail_at) and [e for e in enc.log if e[0] == "fetch"] == \
        [("fetch", i) for i in range(max(0, fail_at - 1))]
    assert [r0 for r0, _ in asked] == sorted({r0 for r0, _ in asked}) and len(asked) == 7


class DownloadSets(HostSets):
    """Host sets with ``PinnedBands.download`` (the CPU's way), without a GPU."""

    def download(self, band, arrays):
        out = []
        for i, a in enumerate(arrays):
            out.append(self.buffer(band, i, a.shape, a.dtype))
            out[-1][...] = a
        return out


def test_frame_plan_fills_a_call_within_the_budget():
    Store = namedtuple("Store", "shape tile_size shard_size shard_grid")
    big = Store((32768, 32768), 256, 8, (16, 16))  # a band: 1024 chunks of an array
    raw = 2048 * 32768 * 5
    assert pinned.frame_plan(big, [4, 1], 64 << 30) == 2
    assert pinned.frame_plan(big, [4, 1], 3 * raw) == 1  # two sets of two bands' frames: more than the budget
    assert pinned.frame_plan(big, [4, 1], 0) == 1
    small = Store(SHAPE, 16, 2, (7, 5))  # 20 chunks a band: every band in one call
    assert pinned.frame_plan(small, [4, 1], 64 << 30) == 7
