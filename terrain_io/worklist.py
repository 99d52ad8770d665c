"""Host side of ``kernels/worklist.cuh``: rounds of tile relaxation over a GPU work list of tiles,
for the kernels that relax TS x TS tiles in shared memory until nothing changes (the in-core
SSSP, ``kernels/sssp_incore.cu``; the in-core fill, ``kernels/fill.cu``)."""
from __future__ import annotations

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
