"""``pinned.write_bands``'s sets (issue 31): a band's host buffers are refilled only once every writer of
the band that used them before is done. A GPU test (the in-core SSSP's predecessors with the CPU's
encoders, three sets) found a slow writer of an older band reading the next band's values: the bands in
flight were counted by writers pending, and later bands' writers finishing first let the count fall.
Here on any machine: a host stand-in for the GPU's download, one writer held back."""
import threading
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from terrain_io import pinned, store

Win = namedtuple("Win", "r0 r1 c0 c1")


class HostSets:
    """``PinnedBands``' download into reused host buffers, without a GPU."""

    pin_seconds = 0.0

    def __init__(self, sets):
        self.sets, self.buffers = sets, {}

    def download(self, band, arrays):
        out = []
        for i, a in enumerate(arrays):
            buf = self.buffers.setdefault((band % self.sets, i), np.empty_like(a))
            buf[...] = a
            out.append(buf)
        return out


class Arr:
    shards = (1, 1)


@pytest.mark.parametrize("sets", [2, 3])
def test_a_slow_writer_keeps_its_bands_values(monkeypatch, sets):
    release, seen = threading.Event(), []

    def write_shard(arr, sr, sc, block):
        if (sr, sc) == (0, 0):
            release.wait(0.5)  # band 0's first writer: still at work while later bands come and go
        seen.append((sr, int(block[0, 0])))

    def band_outputs(r0, r1):
        if r0 == sets + 1:
            release.set()
        return [np.full((r1 - r0, 2), r0, np.int64)]  # a band's cells hold its row

    monkeypatch.setattr(store, "write_shard", write_shard)
    monkeypatch.setattr(store, "shard_layout", lambda arr: None)  # (no GPU codec: the CPU's way)
    bands = [[Win(k, k + 1, 0, 1), Win(k, k + 1, 1, 2)] for k in range(sets + 3)]
    with ThreadPoolExecutor(4) as pool:
        pinned.write_bands([Arr()], bands, band_outputs, HostSets(sets), pool)
    assert len(seen) == 2 * len(bands)
    assert all(row == value for row, value in seen), seen


def test_pinned_slots_lend_each_buffer_to_one_shard_at_a_time():
    """read_device's slots: a buffer lent is not lent again before it is given back; one given back is
    lent again (the smallest free one that holds the shard); when none free holds a shard, a new one is
    made and the smallest free one dropped (pinned memory held stays that of the shards in flight)."""
    from terrain_io.pinned import PinnedSlots

    made = []
    slots = PinnedSlots(allocate=lambda n: made.append(n) or np.zeros(n, np.uint8))
    a, b = slots.take(3 << 20), slots.take(2 << 20)
    assert len(made) == 2 and not np.shares_memory(a, b) and len(a) == 3 << 20 and len(b) == 2 << 20
    a[:] = 1
    slots.give(a)
    c = slots.take(1 << 20)  # a's buffer again
    assert len(made) == 2 and np.shares_memory(c, a) and len(c) == 1 << 20
    slots.give(b)
    slots.give(c)
    d = slots.take(5 << 20)  # none free holds it: a new one, the smaller free one (b's) dropped
    assert len(made) == 3 and made[-1] >= 5 << 20
    e, f = slots.take(3 << 20), slots.take(1 << 20)  # a's buffer, then a new one (b's was dropped)
    assert np.shares_memory(e, a) and len(made) == 4 and not np.shares_memory(f, d)


@pytest.mark.gpu
def test_empty_pinned_is_page_locked_and_copies_both_ways():
    """pinned.empty_pinned: the array's memory is registered with the driver (page-locked host memory),
    round trips through the GPU, and is unregistered when the array goes (registering it again works)."""
    cp = pytest.importorskip("cupy")
    host = pinned.empty_pinned((3, 1 << 20), np.float32)
    assert host.shape == (3, 1 << 20) and host.dtype == np.float32
    attrs = cp.cuda.runtime.pointerGetAttributes(host.ctypes.data)
    assert attrs.type == cp.cuda.runtime.memoryTypeHost  # (plain memory: memoryTypeUnregistered)
    want = cp.arange(3 << 20, dtype=cp.float32).reshape(3, 1 << 20)
    want.get(out=host)
    cp.cuda.Device().synchronize()
    back = cp.empty_like(want)
    back.set(host)
    cp.cuda.Device().synchronize()
    assert bool((back == want).all()) and host[2, 5] == float(2 * (1 << 20) + 5)
    address = host.ctypes.data
    del host
    import gc

    gc.collect()  # (the driver no longer knows the range: unregistered before it was unmapped)
    assert cp.cuda.runtime.pointerGetAttributes(address).type == cp.cuda.runtime.memoryTypeUnregistered


def test_pinned_slots_are_told_apart_by_identity():
    """Free buffers taken out of the list by identity: list.remove compared the arrays (a ValueError
    where their sizes differ, cells compared where equal), so the H100's reads fell back to the CPU's
    decode (session 21)."""
    from terrain_io.pinned import PinnedSlots

    slots = PinnedSlots(allocate=lambda n: np.zeros(n, np.uint8))
    big, small, same = slots.take(3 << 20), slots.take(2 << 20), slots.take(2 << 20)
    for view in (big, small, same):
        slots.give(view)
    got = slots.take(1 << 20)  # the smallest that holds it: the second or third, not the first
    assert got.ctypes.data in (small.ctypes.data, same.ctypes.data)
    other = slots.take(2 << 20)
    assert other.ctypes.data in (small.ctypes.data, same.ctypes.data) and other.ctypes.data != got.ctypes.data
    slots.give(got)
    slots.give(other)
    assert slots.take(5 << 20).ctypes.data not in (big.ctypes.data, small.ctypes.data, same.ctypes.data)
