// Work lists of tiles for kernels that relax TS x TS tiles in shared memory, round after round
// (sssp_incore.cu, fill.cu, flow.cu; the host side is terrain_io/worklist.py::WorkLists): a
// thread block of TS x BY threads per tile of the round's list; a tile whose border cells changed
// queues its neighbours for the next round, a flag per tile keeping each once.
// Inlined into a kernel's source by terrain_io.backend.kernel_source.
//
// A round's kernel, with these pieces:
//   const ListedTile tile = listed_tile(work, own_flag, mark, h, w);
//   ... load the tile and its halo (HS x HS) into shared memory ...
//   __syncthreads();
//   ... per cell m of the thread (row 1 + threadIdx.y + BY * m, column 1 + threadIdx.x):
//       its value before[m] and whether it is solved, solve[m] ...
//   relax_tile(solve, [&](int m, int i, int j) { ... return lowered; });
//   store_improved(tile, s, before, solve, out, row_stride, origin, mark, own_flag, ...);
// Each thread holds TS / BY cells of the tile, one column; the halo (ring of one cell) is fixed.

#define TS 32
#define BY 8
#define HS (TS + 2)

// After a tile's round: queue the neighbours next to the border cells that improved.
__device__ __forceinline__ void queue_neighbours(int (*mark)[3], int tr, int tc, int ntr, int ntc,
                                                 int* __restrict__ own_flag, int* __restrict__ next_flag,
                                                 int* __restrict__ next_work, int* __restrict__ next_count) {
    __syncthreads();
    const int t = threadIdx.y * TS + threadIdx.x;
    if (t < 9) {
        const int di = t / 3 - 1, dj = t % 3 - 1;
        const int nr = tr + di, nc = tc + dj;
        if ((di || dj) && mark[di + 1][dj + 1] && nr >= 0 && nr < ntr && nc >= 0 && nc < ntc) {
            const int nt = nr * ntc + nc;
            if (atomicExch(&next_flag[nt], 1) == 0) next_work[atomicAdd(next_count, 1)] = nt;
        }
    }
}

__device__ __forceinline__ void mark_border(int (*mark)[3], int i, int j) {
    const int di = i == 1 ? 0 : (i == TS ? 2 : 1), dj = j == 1 ? 0 : (j == TS ? 2 : 1);
    if (di != 1) mark[di][1] = 1;
    if (dj != 1) mark[1][dj] = 1;
    if (di != 1 && dj != 1) mark[di][dj] = 1;
}

// This block's tile of the round: tile t = (tr, tc) of the ntr x ntc tiles over h x w cells. Clears
// the tile's own flag (it may be queued again for the next round) and the block's border marks.
struct ListedTile {
    int ntr, ntc, t, tr, tc;
};

__device__ __forceinline__ ListedTile listed_tile(const int* __restrict__ work, int* __restrict__ own_flag,
                                                  int (*mark)[3], int h, int w) {
    ListedTile tile;
    tile.ntr = (h + TS - 1) / TS;
    tile.ntc = (w + TS - 1) / TS;
    tile.t = work[blockIdx.x];
    tile.tr = tile.t / tile.ntc;
    tile.tc = tile.t - (tile.t / tile.ntc) * tile.ntc;  // (not t - tr * ntc: ptxas then spills relax_distances)
    if (threadIdx.x == 0 && threadIdx.y == 0) own_flag[tile.t] = 0;
    if (threadIdx.y == 0 && threadIdx.x < 9) mark[threadIdx.x / 3][threadIdx.x % 3] = 0;
    return tile;
}

// Relax the thread's solved cells (solve[m]) until no cell of the tile changes: lower(m, i, j)
// lowers the thread's cell m, (i, j) in shared memory, from its neighbours and says whether it
// did. Labels only fall, so a neighbour read mid-update is safe (the fixpoint is the same).
// (Keep the loop's shape: written as `if (solve[m] && lower(...))`, ptxas spills relax_distances.)
template <typename Solve, typename Lower>
__device__ __forceinline__ void relax_tile(const Solve* solve, Lower lower) {
    const int j = 1 + threadIdx.x;
    bool changed;
    do {
        changed = false;
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            if (!solve[m]) continue;
            const int i = 1 + threadIdx.y + BY * m;
            if (lower(m, i, j)) changed = true;
        }
    } while (__syncthreads_or(changed));
}

// Write back the thread's solved cells that fell below before[m] (cell (i, j) of the tile to
// out[origin + (tr * TS + i) * row_stride + tc * TS + j]), mark the borders they lie on and queue
// the neighbouring tiles for the next round.
template <typename T, typename Solve>
__device__ __forceinline__ void store_improved(const ListedTile& tile, T (*s)[HS], const T* before, const Solve* solve,
                                               T* __restrict__ out, long long row_stride, long long origin,
                                               int (*mark)[3], int* __restrict__ own_flag,
                                               int* __restrict__ next_flag, int* __restrict__ next_work,
                                               int* __restrict__ next_count) {
    const int j = 1 + threadIdx.x;
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = 1 + threadIdx.y + BY * m;
        if (solve[m] && s[i][j] < before[m]) {
            out[origin + (long long)(tile.tr * TS + i) * row_stride + tile.tc * TS + j] = s[i][j];
            mark_border(mark, i, j);
        }
    }
    queue_neighbours(mark, tile.tr, tile.tc, tile.ntr, tile.ntc, own_flag, next_flag, next_work, next_count);
}
