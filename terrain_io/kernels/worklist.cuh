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
// Keyed rounds (near-far order, below; worklist.py::KeyedWorkLists) take keyed_tile, whose far
// tiles return at once, and store_improved_keyed in place of listed_tile and store_improved.

#define TS 32
#define BY 8
#define HS (TS + 2)

// The sides of the tile (mark[di][dj], di, dj in 0..2; 1 1 the tile itself) that its border cell
// (i, j) lies on: side(di, dj) for each.
template <typename Side>
__device__ __forceinline__ void border_sides(int i, int j, Side side) {
    const int di = i == 1 ? 0 : (i == TS ? 2 : 1), dj = j == 1 ? 0 : (j == TS ? 2 : 1);
    if (di != 1) side(di, 1);
    if (dj != 1) side(1, dj);
    if (di != 1 && dj != 1) side(di, dj);
}

// After a tile's round: queue(di, dj, nt) in one thread for each neighbouring tile nt (on side di, dj).
template <typename Queue>
__device__ __forceinline__ void each_neighbour(int tr, int tc, int ntr, int ntc, Queue queue) {
    __syncthreads();
    const int t = threadIdx.y * TS + threadIdx.x;
    if (t < 9) {
        const int di = t / 3 - 1, dj = t % 3 - 1;
        const int nr = tr + di, nc = tc + dj;
        if ((di || dj) && nr >= 0 && nr < ntr && nc >= 0 && nc < ntc) queue(di + 1, dj + 1, nr * ntc + nc);
    }
}

// After a tile's round: queue the neighbours next to the border cells that improved.
__device__ __forceinline__ void queue_neighbours(int (*mark)[3], int tr, int tc, int ntr, int ntc,
                                                 int* __restrict__ own_flag, int* __restrict__ next_flag,
                                                 int* __restrict__ next_work, int* __restrict__ next_count) {
    each_neighbour(tr, tc, ntr, ntc, [&](int a, int b, int nt) {
        if (mark[a][b] && atomicExch(&next_flag[nt], 1) == 0) next_work[atomicAdd(next_count, 1)] = nt;
    });
}

__device__ __forceinline__ void mark_border(int (*mark)[3], int i, int j) {
    border_sides(i, j, [&](int a, int b) { mark[a][b] = 1; });
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
// out[origin + (tr * TS + i) * row_stride + tc * TS + j]), improved(i, j, label) for each.
template <typename T, typename Solve, typename Improved>
__device__ __forceinline__ void write_improved(const ListedTile& tile, T (*s)[HS], const T* before, const Solve* solve,
                                               T* __restrict__ out, long long row_stride, long long origin,
                                               Improved improved) {
    const int j = 1 + threadIdx.x;
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = 1 + threadIdx.y + BY * m;
        if (solve[m] && s[i][j] < before[m]) {
            out[origin + (long long)(tile.tr * TS + i) * row_stride + tile.tc * TS + j] = s[i][j];
            improved(i, j, s[i][j]);
        }
    }
}

// Write back the improved cells (write_improved), mark the borders they lie on and queue the
// neighbouring tiles for the next round.
template <typename T, typename Solve>
__device__ __forceinline__ void store_improved(const ListedTile& tile, T (*s)[HS], const T* before, const Solve* solve,
                                               T* __restrict__ out, long long row_stride, long long origin,
                                               int (*mark)[3], int* __restrict__ own_flag,
                                               int* __restrict__ next_flag, int* __restrict__ next_work,
                                               int* __restrict__ next_count) {
    write_improved(tile, s, before, solve, out, row_stride, origin, [&](int i, int j, T) { mark_border(mark, i, j); });
    queue_neighbours(mark, tile.tr, tile.tc, tile.ntr, tile.ntc, own_flag, next_flag, next_work, next_count);
}

// Keyed rounds: a near-far order over the tiles (Delta-stepping [Meyer & Sanders 2003], with the
// near and far piles of Davidson et al.'s Near-Far GPU SSSP, IPDPS 2014) for labels that are
// non-negative doubles (their bits order as unsigned integers). A queued tile carries a key: the
// least new label of the changed border cells that queued it (nothing it can learn from them is
// smaller). A round relaxes the tiles whose key is within delta of the list's least key and passes
// the others on to the next round unrelaxed, so that a tile far beyond the settled labels waits
// for them instead of being relaxed again and again as they fall. The order changes how often a
// tile is relaxed, never the fixpoint. A list's totals are counted by the round that fills it; the
// host resets them before that round (worklist.py, KeyedWorkLists).
#define NO_KEY 0xFFFFFFFFFFFFFFFFULL
enum KeyedTotal { LIST_LENGTH, LEAST_KEY, LARGEST_KEY, PASSED_ON };

struct KeyedLists {  // the round's list (work) and the next one's, a flag and a key per tile each
    const int* work;
    int* own_flag;
    int* next_flag;
    int* next_work;
    unsigned long long* own_key;
    unsigned long long* next_key;
    const unsigned long long* own_totals;
    unsigned long long* next_totals;
};

// Queue tile t for the next round with key (in one thread).
__device__ __forceinline__ void queue_keyed(const KeyedLists& l, int t, unsigned long long key) {
    atomicMin(&l.next_key[t], key);
    if (atomicExch(&l.next_flag[t], 1) == 0) l.next_work[atomicAdd(&l.next_totals[LIST_LENGTH], 1ULL)] = t;
    atomicMin(&l.next_totals[LEAST_KEY], key);
    atomicMax(&l.next_totals[LARGEST_KEY], key);
}

// This block's tile of a keyed round (as listed_tile), its border keys cleared; whether it is
// relaxed in this round (the same answer in every thread): a far tile is queued again instead.
__device__ __forceinline__ bool keyed_tile(const KeyedLists& l, double delta, unsigned long long (*mark)[3], int h,
                                           int w, ListedTile& tile) {
    __shared__ bool near;
    tile.ntr = (h + TS - 1) / TS;
    tile.ntc = (w + TS - 1) / TS;
    tile.t = l.work[blockIdx.x];
    tile.tr = tile.t / tile.ntc;
    tile.tc = tile.t - (tile.t / tile.ntc) * tile.ntc;
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        l.own_flag[tile.t] = 0;
        const unsigned long long key = l.own_key[tile.t];
        l.own_key[tile.t] = NO_KEY;
        near = __longlong_as_double(key) <= __longlong_as_double(l.own_totals[LEAST_KEY]) + delta;
        if (!near) {
            queue_keyed(l, tile.t, key);
            atomicAdd(&l.next_totals[PASSED_ON], 1ULL);
        }
    }
    if (threadIdx.y == 0 && threadIdx.x < 9) mark[threadIdx.x / 3][threadIdx.x % 3] = NO_KEY;
    __syncthreads();
    return near;
}

// store_improved for a keyed round: each neighbour next to improved border cells is queued with the
// least of their new labels.
template <typename Solve>
__device__ __forceinline__ void store_improved_keyed(const ListedTile& tile, double (*s)[HS], const double* before,
                                                     const Solve* solve, double* __restrict__ out,
                                                     long long row_stride, unsigned long long (*mark)[3],
                                                     const KeyedLists& l) {
    write_improved(tile, s, before, solve, out, row_stride, 0, [&](int i, int j, double label) {
        const unsigned long long key = __double_as_longlong(label);
        border_sides(i, j, [&](int a, int b) { atomicMin(&mark[a][b], key); });
    });
    each_neighbour(tile.tr, tile.tc, tile.ntr, tile.ntc, [&](int a, int b, int nt) {
        if (mark[a][b] != NO_KEY) queue_keyed(l, nt, mark[a][b]);
    });
}
