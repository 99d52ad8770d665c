"""Runs of chunks encoded and decoded in one GIL-free call (terrain_io.chunkcodec, issue 31). Reference:
numcodecs' Zstd and google-crc32c called from Python on each chunk (what zarr's codecs store), and numpy's
``==`` / ``isnan`` for which chunks are all fill value (as zarr and the GPU encoder leave them out)."""
from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
from numcodecs import Zstd

from terrain_io import chunkcodec
from terrain_io.zorder import morton_order

pytestmark = pytest.mark.skipif(chunkcodec.functions() is None, reason="zstd or crc32c not callable here")

TILE = (16, 24)
CASES = [("float32", np.nan), ("float64", -9999.0), ("uint8", 255), ("uint32", 0), ("int16", -32768),
         ("float32", 0.0), ("uint64", 7), ("float16", np.nan)]


def _values(dtype, fill) -> np.ndarray:
    """5 x 4 chunks clipped at both edges: random cells, one chunk all fill value, one all fill value
    in another spelling (the other zero, another NaN), one with a single cell that differs."""
    rng = np.random.default_rng(5)
    v = (rng.random((70, 90)) * 100).astype(dtype)
    v[:16, :24] = fill
    if np.dtype(dtype).kind == "f":
        v[16:32, 24:48] = -np.array(fill, dtype) if fill == 0 else np.array(np.nan, dtype).view(
            f"u{np.dtype(dtype).itemsize}").__or__(1).view(dtype)  # -0.0, or a NaN with a payload
    v[32:48, 48:72] = fill
    v[40, 50] = 1
    return v


def _chunk(values, fill, i, j):
    t0, t1 = TILE
    part = np.full(TILE, fill, values.dtype)
    cut = values[i * t0 : (i + 1) * t0, j * t1 : (j + 1) * t1]
    part[: cut.shape[0], : cut.shape[1]] = cut
    return part


def _all_fill(part, fill) -> bool:
    if part.dtype.kind == "f" and np.isnan(fill):
        return bool(np.isnan(part).all())
    return bool((part == np.array(fill, part.dtype)).all())


@pytest.mark.parametrize("level", [1, -5, 3, None])
@pytest.mark.parametrize("dtype,fill", CASES)
def test_runs_store_numcodecs_frames_and_leave_out_the_chunks_numpy_calls_fill(dtype, fill, level):
    inner = _values(dtype, fill)
    values = np.empty((70, 95), dtype)[:, 5:]  # rows contiguous, the block not: a view as the writers give
    values[...] = inner
    cells = np.array(morton_order(5, 4), np.int64)
    data, entries = chunkcodec.encode_run(values, TILE, fill, cells, level, True)
    left_out = 0
    for (i, j), (off, nb) in zip(cells.tolist(), entries.tolist()):
        part = _chunk(values, fill, i, j)
        if off == chunkcodec.NO_CHUNK:
            assert _all_fill(part, fill), (i, j)
            left_out += 1
            continue
        assert not _all_fill(part, fill), (i, j)
        frame = Zstd(level=level).encode(part) if level is not None else part.tobytes()
        crc = np.uint32(google_crc32c.value(bytes(frame))).astype("<u4").tobytes()
        assert bytes(data[off : off + nb]) == bytes(frame) + crc, (i, j)
    assert left_out == (2 if values.dtype.kind == "f" and (fill == 0 or np.isnan(fill)) else 1)

    stored = np.array([(i, j, off, nb) for (i, j), (off, nb) in zip(cells.tolist(), entries.tolist())
                       if off != chunkcodec.NO_CHUNK], np.int64)
    for first, shape in (((0, 0), values.shape), ((20, 7), (33, 40)), ((69, 84), (1, 1))):
        out = np.full(shape, fill, values.dtype)
        status = chunkcodec.decode_run(data, stored, TILE, first, out, level, True)
        assert not status.any()
        want = values[first[0] : first[0] + shape[0], first[1] : first[1] + shape[1]]
        expect = want.copy()
        for i, j in cells.tolist():  # a chunk left out is the fill value when read
            if _all_fill(_chunk(values, fill, i, j), fill):
                r0, c0 = i * TILE[0] - first[0], j * TILE[1] - first[1]
                expect[max(r0, 0) : max(r0 + TILE[0], 0), max(c0, 0) : max(c0 + TILE[1], 0)] = fill
        assert out.tobytes() == expect.tobytes()


@pytest.mark.parametrize("level", [1, None])
def test_damage_is_named_per_chunk_and_the_others_still_decode(level):
    values = _values("float32", np.nan)
    cells = np.array(morton_order(5, 4), np.int64)
    data, entries = chunkcodec.encode_run(values, TILE, np.nan, cells, level, True)
    jobs = np.array([(i, j, off, nb) for (i, j), (off, nb) in zip(cells.tolist(), entries.tolist())
                     if off != chunkcodec.NO_CHUNK], np.int64)
    bad = data.copy()
    bad[jobs[2, 2] + 5] ^= 1  # inside the third stored chunk
    out = np.full(values.shape, np.nan, np.float32)
    status = chunkcodec.decode_run(bad, jobs, TILE, (0, 0), out, level, True)
    assert status.tolist() == [0, 0, chunkcodec.CHECKSUM_FAILED] + [0] * (len(jobs) - 3)
    i, j = jobs[3, :2]
    np.testing.assert_array_equal(out[i * 16 : i * 16 + 16, j * 24 : j * 24 + 24], _chunk(values, np.nan, i, j)[
        : min(16, 70 - i * 16), : min(24, 90 - j * 24)])
    if level is not None:  # without a checksum the frame itself is refused (or decodes to another size)
        status = chunkcodec.decode_run(bad, jobs, TILE, (0, 0), out, level, False)
        assert status[2] in (0, chunkcodec.UNDECODABLE, chunkcodec.WRONG_SIZE)
        short = jobs.copy()
        short[:, 3] -= 10  # frames cut short: none decodes
        status = chunkcodec.decode_run(data, short, TILE, (0, 0), out, level, True)
        assert (status == chunkcodec.CHECKSUM_FAILED).all()
        status = chunkcodec.decode_run(data, short, TILE, (0, 0), out, level, False)
        assert (status == chunkcodec.UNDECODABLE).all()


def test_the_store_waits_for_numba_to_start_and_starts_it_for_large_shards_only():
    """A process where no numba kernel has run codes chunk by chunk (numba's start costs ~0.25 s); a large
    shard starts the kernels' load in the background, a small read does not, and once loaded the runs are
    used for large shards (a small one is coded chunk by chunk: no kernel compiled for it)."""
    import subprocess
    import sys

    code = """
import threading
from terrain_io import store
assert store._codec_runs(1000) is None
assert not [t for t in threading.enumerate() if t.name == "terrain-codec-load"]
assert store._codec_runs(64 << 20) is None
for t in threading.enumerate():
    if t.name == "terrain-codec-load":
        t.join()
assert store._codec_runs(1000) is None  # (small: chunk by chunk, no kernel compiled for it)
assert store._codec_runs(64 << 20) is not None
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_runs_outside_their_buffers_are_refused_before_the_kernel():
    """The kernels have addresses, not bounds: a chunk outside the block, a job past the bytes read, or a
    read-only window is refused in Python."""
    values = _values("float32", np.nan)
    with pytest.raises(ValueError, match="inside"):
        chunkcodec.encode_run(values, TILE, np.nan, np.array([[5, 0]]), 1, True)  # row 80 of 70
    with pytest.raises(ValueError, match="inside"):
        chunkcodec.encode_run(values, TILE, np.nan, np.array([[0, -1]]), 1, True)
    data, entries = chunkcodec.encode_run(values, TILE, np.nan, np.array([[1, 0]]), 1, True)
    job = np.array([[1, 0, 0, entries[0, 1]]])
    out = np.empty((16, 24), np.float32)
    with pytest.raises(ValueError, match="outside"):
        chunkcodec.decode_run(data[:-1], job, TILE, (16, 0), out, 1, True)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        chunkcodec.decode_run(data, job, TILE, (16, 0), out, 1, True)


def test_a_failed_load_makes_the_store_code_chunk_by_chunk(monkeypatch):
    from terrain_io import store

    monkeypatch.setattr(chunkcodec, "_LOAD_FAILED", [False])
    monkeypatch.setattr(chunkcodec, "checksums", lambda frames: 1 / 0)  # (a numba that cannot type the kernels)
    chunkcodec.load()
    assert not chunkcodec.usable()
    assert store._codec_runs(64 << 20) is None


def test_calls_past_the_dispatcher_take_each_kind_of_argument_to_its_own_build():
    """After a first call, a kernel is called through the entry point numba compiled for those kinds of
    arguments: frames read from a read-only buffer (another build than a writable one's) and rows of a
    strided window still decode to numcodecs' cells, and each kind of argument has its own entry."""
    v = (np.random.default_rng(6).random((32, 48)) * 50).astype("float32")
    cells = np.array([(0, 0), (0, 1), (1, 0), (1, 1)], np.int64)
    data, entries = chunkcodec.encode_run(v, TILE, 0.0, cells, 3, True)
    jobs = np.array([(i, j, int(a), int(b)) for (i, j), (a, b) in zip(cells, entries)], np.int64)
    zstd = Zstd(level=3)
    frames = [zstd.decode(data[int(a) : int(a) + int(b) - 4].tobytes()) for a, b in entries]
    want = np.empty((32, 48), np.float32)
    for (i, j), frame in zip(cells, frames):
        want[i * 16 : i * 16 + 16, j * 24 : j * 24 + 24] = np.frombuffer(frame, np.float32).reshape(TILE)
    for raw in (data, np.frombuffer(data.tobytes(), np.uint8), data, np.frombuffer(data.tobytes(), np.uint8)):
        big = np.zeros((40, 100), np.float32)
        out = big[4:36, 2:98:2]  # (rows contiguous? no: every other column -- refused by as_bits)
        assert chunkcodec.as_bits(out) is None
        out = big[4:36, 10:58]
        assert not chunkcodec.decode_run(raw, jobs, TILE, (0, 0), out, 3, True).any()
        assert out.tobytes() == want.tobytes()
        assert not big[:4].any() and not big[36:].any() and not big[:, :10].any() and not big[:, 58:].any()
    writable = {key[1][4] for key in chunkcodec._ENTRY_POINTS if key[0] is chunkcodec._decode_run}
    assert writable == {True, False}  # (the raw buffer's kind: its own entry each)
