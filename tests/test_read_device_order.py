"""The GPU read's pipeline (``pinned.read_device`` -> ``_decode_bands``) on any machine: the decoder
replaced by one on the host (numcodecs' zstd into NumPy bands, the frames "staged" as copies), the
rest -- reader threads reading, checking and staging each shard's frames, the bands decoded in order
on the calling thread, each staged buffer kept until its band's decode and dropped after it -- the
code the GPU runs. The cells are zarr-python's read of the array; ``each`` sees the bands in order,
covering every row once; damage raises DamagedStoreError from the reader threads. And the pinned
ring the GPU's stage copies through (``nvzstd._through_ring``), its copies made late on purpose."""
import concurrent.futures
import queue
import threading
import time
import weakref

import numpy as np
import pytest
import zarr
from numcodecs import Zstd

from terrain_io import pinned
from terrain_io.errors import DamagedStoreError
from terrain_io.store import TerrainStore, fill_value_for, shard_layout
from terrain_io.timings import Timings

SHAPE = (203, 150)  # tile 16, shard 2: 7 x 5 shards, the last row and column cut inside a chunk
TILE, SHARD = 16, 2


class Staged:
    """A staged shard's frames (a host copy), counted while alive."""

    def __init__(self, frames, live):
        self.frames = frames.copy()
        live.add(id(self))
        weakref.finalize(self, live.discard, id(self))


class HostDecoder:
    """``BandDecoder``'s interface on the host: ``stage`` copies, ``decode`` runs numcodecs' zstd."""

    input_align = 8

    def __init__(self):
        self.stage_threads, self.live, self.most_live, self.decoded = set(), set(), 0, []

    def stage(self, frames):
        self.stage_threads.add(threading.get_ident())
        return Staged(frames, self.live)

    def decode(self, frames, chunks, band, chunk_shape):
        (t0, t1), rows, cols = chunk_shape, *band.shape
        self.most_live = max(self.most_live, len(self.live))
        assert all(id(f) in self.live for f in frames)
        self.decoded.append(len(frames))
        for part, at, nb, r, c in chunks.tolist():
            assert at % self.input_align == 0
            raw = Zstd().decode(frames[part].frames[at : at + nb].tobytes())
            chunk = np.frombuffer(raw, band.dtype).reshape(t0, t1)
            band[r : r + t0, c : c + t1] = chunk[: rows - r, : cols - c]
        return np.zeros(0, np.int64)


def stored(tmp_path, dtype=np.float32):
    rng = np.random.default_rng(5)
    values = (rng.normal(size=SHAPE) * 100).astype(dtype)
    fill = fill_value_for(values.dtype, None)
    values[:32, :32] = fill  # a whole shard of fill value: no file
    values[40:56, 64:96] = fill  # two chunks of fill value: left out of their shard
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, np.float32), tile=TILE, shard=SHARD)
    with store.write_result("r") as writer:
        writer.create_array("v", values.dtype, fill)[...] = values
    ref = zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r")[...]
    return TerrainStore.open(tmp_path / "s.zarr"), ref


def read(store, threads, dec, convert=None, each=None, timings=None):
    arr = store.array("r/v")
    return pinned._decode_bands(arr, shard_layout(arr)[0], dec, threads, convert, each, timings, np)


@pytest.mark.parametrize("threads", [1, 5, 16])
def test_bands_decode_to_zarrs_cells_in_order(tmp_path, threads):
    store, ref = stored(tmp_path)
    dec, timings = HostDecoder(), Timings()
    got = read(store, threads, dec, timings=timings)
    assert got.tobytes() == ref.tobytes()
    assert threading.get_ident() not in dec.stage_threads  # (staged by the readers, beside the decode)
    assert {"read_wait", "read_stage", "read_decode"} <= set(timings)
    side = TILE * SHARD
    band_shards = max(1, threads // 5) * 5  # shard rows a band x 5 shard columns
    assert dec.most_live <= 3 * band_shards  # the band decoding and the two read ahead, no more
    assert not dec.live  # every staged buffer dropped once decoded
    seen = []
    got_each = read(store, threads, HostDecoder(), each=lambda r0, r1, cells: seen.append((r0, r1, cells.copy())))
    assert got_each is True
    assert [r0 for r0, _, _ in seen] == list(range(0, SHAPE[0], side * max(1, threads // 5)))
    assert seen[-1][1] == SHAPE[0] and all(a[1] == b[0] for a, b in zip(seen, seen[1:]))
    assert np.concatenate([c for _, _, c in seen]).tobytes() == ref.tobytes()
    narrow = read(store, threads, HostDecoder(), convert=(np.int16, lambda b: np.nan_to_num(b).astype(np.int16)))
    assert narrow.tobytes() == np.nan_to_num(ref).astype(np.int16).tobytes()


def test_damage_raises_from_the_readers(tmp_path):
    store, _ = stored(tmp_path)
    path = store.path / "r" / "v" / "c" / "1" / "1"
    data = bytearray(path.read_bytes())
    data[20] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedStoreError, match="checksum"):
        read(TerrainStore.open(store.path), 4, HostDecoder())


def test_a_refused_frame_is_the_decoders_failure(tmp_path):
    store, _ = stored(tmp_path)
    dec = HostDecoder()
    dec.decode = lambda *_: np.array([0])
    with pytest.raises(RuntimeError, match="did not decode chunk"):
        read(store, 4, dec)


class DeferredCopy:
    """An asynchronous copy's event: the copy itself happens only when synchronized (after some
    sleep), so a slot refilled before its copy completed sends the wrong bytes."""

    def __init__(self, dst, at, piece):
        self.dst, self.at, self.piece = dst, at, piece
        self.done = False

    def synchronize(self):
        if not self.done:
            time.sleep(0.0005)
            self.dst[self.at : self.at + len(self.piece)] = self.piece
            self.done = True


@pytest.mark.parametrize("slots", [1, 2, 5])
def test_the_pinned_ring_sends_every_piece_and_reuses_a_slot_only_once_copied(slots):
    """``nvzstd._through_ring`` from 12 threads at once through ``slots`` slots of 64 bytes: each
    thread's bytes arrive whole (a slot refilled before its copy completed would corrupt them), none
    waits forever, and every slot is back in the ring afterwards."""
    from terrain_io import nvzstd

    ring = queue.Queue()
    for _ in range(slots):
        ring.put(np.zeros(64, np.uint8))
    rng = np.random.default_rng(3)
    sources = [rng.integers(0, 256, int(rng.integers(1, 700)), dtype=np.uint8) for _ in range(12)]

    def send_all(src):
        dst = np.zeros_like(src)
        nvzstd._through_ring(src, ring, lambda at, piece: DeferredCopy(dst, at, piece), slot_bytes=64)
        return dst

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(send_all, sources, timeout=60))
    assert all(g.tobytes() == s.tobytes() for g, s in zip(got, sources))
    assert ring.qsize() == slots
