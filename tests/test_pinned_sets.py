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
