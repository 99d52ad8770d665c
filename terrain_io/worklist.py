"""Host side of ``kernels/worklist.cuh``: rounds of tile relaxation over a GPU work list of tiles,
for the kernels that relax TS x TS tiles in shared memory until nothing changes (the in-core
SSSP, ``kernels/sssp_incore.cu``; the in-core fill, ``kernels/fill.cu``), and its keyed rounds in
near-far order (:class:`KeyedWorkLists`: the SSSP's distances)."""
from __future__ import annotations

import math

import numpy as np

TILE = 32  # TS of worklist.cuh: a tile's side in cells
ROWS_PER_PASS = 8  # BY of worklist.cuh: a thread block is TILE x ROWS_PER_PASS threads


class WorkLists:
    """Two lists of tile numbers with a flag per tile: the current round's and the next one's."""

    def __init__(self, ntiles: int):
        import cupy as cp

        self.flags = [cp.zeros(ntiles, cp.int32), cp.zeros(ntiles, cp.int32)]
        self.lists = [cp.empty(ntiles, cp.int32), cp.empty(ntiles, cp.int32)]
        self.count = cp.zeros(1, cp.int32)

    def run(self, kernel, args, first) -> int:
        """Rounds from the tiles ``first`` (a CuPy int32 array) until no tile is queued; the rounds."""
        import cupy as cp

        n = int(first.size)
        cur = 0
        self.lists[0][:n] = first
        self.flags[0][first] = 1
        rounds = 0
        while n:
            nxt = 1 - cur
            self.count.fill(0)
            kernel((n,), (TILE, ROWS_PER_PASS), args + (self.lists[cur], self.flags[cur], self.flags[nxt],
                                                       self.lists[nxt], self.count))
            n = int(self.count.get()[0])
            cur = nxt
            rounds += 1
        cp.cuda.get_current_stream().synchronize()
        return rounds


NO_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)  # worklist.cuh's NO_KEY: no key (the largest)


class KeyedWorkLists(WorkLists):
    """Work lists in near-far order (worklist.cuh's keyed rounds): a key per listed tile, and each
    list's totals (its length, least and largest key, tiles passed on). The step ``delta`` is
    steered so that about ``reach`` tiles are relaxed a round: enough to fill the GPU (1.5 waves of
    the H100's resident blocks), few enough that a tile is rarely relaxed before the labels around
    it have settled. Measured on the H100 (benchmarks/RESULTS.md, issue 31): the SSSP's distances
    on 32768^2 synthetic terrain took 22.4 s in rounds of every queued tile (93 relaxations a tile
    at 16384^2), 1.24 s with a reach of 1024 (6.4 a tile), 1.49 s with 4096, 2.87 s with 16384."""

    reach = 1024

    def __init__(self, ntiles: int):
        import cupy as cp

        super().__init__(ntiles)
        self.keys = [cp.full(ntiles, NO_KEY, cp.uint64), cp.full(ntiles, NO_KEY, cp.uint64)]
        self.totals = cp.zeros((2, 4), cp.uint64)
        self.fresh = cp.asarray(np.array([0, NO_KEY, 0, 0], np.uint64))  # LIST_LENGTH .. PASSED_ON
        self.visits = self.passed = 0  # the last run's tiles relaxed and tiles passed on

    def run_near_far(self, kernel, args, first) -> int:
        """Keyed rounds from the tiles ``first`` (key 0) until no tile is queued; the rounds."""
        import cupy as cp

        n = int(first.size)
        cur = 0
        self.lists[0][:n] = first
        self.flags[0][first] = 1
        self.keys[0][first] = 0
        self.totals[0] = self.fresh
        self.totals[0, 1] = 0  # the least key
        delta = math.inf
        rounds = visits = passed_on = 0
        while n:
            nxt = 1 - cur
            self.totals[nxt] = self.fresh
            kernel((n,), (TILE, ROWS_PER_PASS), args + (self.lists[cur], self.flags[cur], self.flags[nxt],
                                                       self.lists[nxt], self.keys[cur], self.keys[nxt],
                                                       self.totals[cur], self.totals[nxt], np.float64(delta)))
            length, least, largest, passed = (int(x) for x in self.totals[nxt].get())
            relaxed = n - passed
            delta = self._step(delta, relaxed, passed, length, least, largest)
            visits += relaxed
            passed_on += passed
            n = length
            cur = nxt
            rounds += 1
        cp.cuda.get_current_stream().synchronize()
        self.visits, self.passed = visits, passed_on
        return rounds

    def _step(self, delta: float, relaxed: int, passed: int, length: int, least: int, largest: int) -> float:
        """The next round's step: from the spread of the keys the first time the list outgrows the
        reach, then doubled or halved as a round relaxed too few or too many tiles."""
        if not length:
            return delta
        if math.isinf(delta):
            if length <= self.reach:
                return delta
            lo, hi = np.array([least, largest], np.uint64).view(np.float64)
            return (hi - lo) * self.reach / length if hi > lo else delta
        if relaxed < self.reach // 2 and passed:
            return delta * 2 if delta > 0 else math.inf
        if relaxed > self.reach * 2:
            return delta / 2
        return delta
