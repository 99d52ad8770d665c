// Tile phase of the grid MST on the GPU: Boruvka after Vineet et al. (HPG 2009), as in
// Gerritsen 2012, part II ch. 3 (docs/ARCHITECTURE.md#mst-pipeline), for all tiles of a batch in one launch per step.
//
// Cells are numbered in the batch (v = i * W + j); a cell sees only its neighbours in the same
// T x T tile, so each tile's spanning forest grows independently. Every edge has one strict key:
// (weight, code) with code = (local lo row * T + local lo col) * 4 + rank, rank 0..3 for the
// forward directions E, SW, S, SE (the order of the larger endpoint), which orders a tile's edges
// exactly as the global (weight, smaller id, larger id). PACKED=1: the weight is exactly a float32
// and weight and code share one 64-bit key (one atomicMin per run of a component's cells in a warp
// and round); PACKED=0: float64 weights, the minimum weight first, then the minimum code among edges
// of that weight.
//
// INCORE=1: the whole DEM is one "tile" (``mst --method incore``): a cell sees all its neighbours, the
// code is the global (smaller cell id * 4 + rank) -- 32 bits for up to 2**30 cells, which the host
// checks --, and the roots of a round point at their new roots by pointer jumping among the roots
// (``jump``; a hooking chain may be as long as the grid is wide) instead of one chase per cell; after the
// first round the hooks, pairs and jumps follow a list of the round's roots (the last round's pair
// winners, ``break_pairs``), not every cell. Everywhere a vertex with no neighbour outside its component
// is marked interior and skipped by ``find_min`` from then on (components only grow).
//
// Compile-time options: VAL_T (the elevation type), KIND (0 = max, 1 = absdiff; see
// terrain_io/weights.py), PACKED, INCORE.

typedef unsigned long long u64;
typedef long long i64;

#ifndef INCORE
#define INCORE 0
#endif

#include "grid.cuh"

__constant__ int RANK_TO_DIR[4] = {0, 3, 2, 1};

// The order of float32 bits as unsigned (-0 and +0: one key). From the bits, with no float arithmetic
// (-ftz=true, see grid.cuh's to_double).
__device__ __forceinline__ unsigned order32(unsigned u) {
    if (u == 0x80000000u) u = 0;
    return (u >> 31) ? ~u : (u | 0x80000000u);
}

// The weight's part of a packed key (the weight exactly a float32). Float32 elevations pack only under
// the max model: the larger order of the two elevations' bits, no conversion that -ftz=true would flush;
// integer elevations (16 bits at most) give integer weights, exact and normal as floats.
__device__ __forceinline__ unsigned weight_key32(float a, float b, double) {
    const unsigned x = order32(__float_as_uint(a)), y = order32(__float_as_uint(b));
    return x > y ? x : y;
}
template <typename T>
__device__ __forceinline__ unsigned weight_key32(T, T, double w) {
    return order32(__float_as_uint((float)w));
}

__device__ __forceinline__ u64 order64(double w) {
    u64 u = (u64)__double_as_longlong(w + 0.0);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

// The edge from cell v = (i, j) in direction d to u = (ii, jj): its code inside the tile (INCORE: in
// the grid).
__device__ __forceinline__ unsigned edge_code(i64 v, i64 u, int i, int j, int ii, int jj, int d, int T) {
#if INCORE
    return (unsigned)((d < 4 ? v : u) * 4 + DIR_TO_RANK[d & 3]);
#else
    if (d < 4) return (unsigned)(((i % T) * T + (j % T)) * 4 + DIR_TO_RANK[d]);
    return (unsigned)(((ii % T) * T + (jj % T)) * 4 + DIR_TO_RANK[d - 4]);
#endif
}

// atomicMin of each lane's key into dst[c] (c < 0: none), one atomic per run of lanes with the same c
// (consecutive cells of one component): a segmented suffix minimum over the run by shuffles, the
// run's first lane holding it. Every lane of the warp must call it.
template <typename K>
__device__ __forceinline__ void atomic_min_runs(K* dst, int c, K key) {
    const unsigned full = 0xFFFFFFFFu;
    const int lane = threadIdx.x & 31;
    const int prev = __shfl_up_sync(full, c, 1), next = __shfl_down_sync(full, c, 1);
    const unsigned tails = __ballot_sync(full, lane == 31 || next != c);
    const int end = __ffs(tails & (full << lane)) - 1;  // the run's last lane
    for (int o = 1; o < 32; o <<= 1) {
        K other = __shfl_down_sync(full, key, o);
        if (lane + o <= end && other < key) key = other;
    }
    if ((lane == 0 || prev != c) && c >= 0 && key != (K)~(K)0) atomicMin(&dst[c], key);
}

// Neighbour u of cell (i, j) in direction d inside the same tile (INCORE: the grid), else -1. Whether
// it is a vertex is its comp's to say (-1: not). Cell ids fit 32 bits: comp holds them as ints.
__device__ __forceinline__ int tile_neighbour(int i, int j, int d, int H, int W, int T) {
    int ii = i + DR[d], jj = j + DC[d];
    if (ii < 0 || ii >= H || jj < 0 || jj >= W) return -1;
#if !INCORE
    if (ii / T != i / T || jj / T != j / T) return -1;
#endif
    return ii * W + jj;
}

#if INCORE
// A cell of the DEM is a vertex (store.valid_mask): not NaN; an integer cell, not nodata (compared as
// doubles: exact for integers of up to 32 bits, and for a nodata out of the type's range, never equal).
__device__ __forceinline__ bool is_vertex(float x, int, double) { return !isnan(x); }
__device__ __forceinline__ bool is_vertex(double x, int, double) { return !isnan(x); }
template <typename T>
__device__ __forceinline__ bool is_vertex(T x, int has_nodata, double nodata) {
    return !has_nodata || (double)x != nodata;
}

// Step 0, in core: every vertex its own component (comp = parent = its id), every other cell -1 for
// good (so comp also says which cells are vertices); no proposal yet (best: all ones -- hook sets back
// each it takes); *cells += the vertices (a grid-stride loop, one atomic a warp: one a cell's warp was
// 36 ms of contention at 2**30 cells). Our kernel, not CuPy's where / arange / fill: over arrays of
// 2**31 bytes and more CuPy compiles a 64-bit-indexed variant of each, in the first run of each machine.
extern "C" __global__ void init(const VAL_T* __restrict__ vals, int has_nodata, double nodata, int* comp,
                                int* parent, u64* best, unsigned* best_code, unsigned long long* cells,
                                long long n) {
    unsigned found = 0;
    for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < n; v += (long long)gridDim.x * blockDim.x) {
        const bool vertex = is_vertex(vals[v], has_nodata, nodata);
        found += vertex;
        comp[v] = parent[v] = vertex ? (int)v : -1;
        best[v] = ~0ULL;
#if !PACKED
        best_code[v] = 0xFFFFFFFFu;
#endif
    }
    for (int o = 16; o; o >>= 1) found += __shfl_down_sync(0xFFFFFFFFu, found, o);
    if ((threadIdx.x & 31) == 0 && found) atomicAdd(cells, (unsigned long long)found);
}
#endif

// Step 1: every vertex proposes its lightest edge leaving its component (cells that are no vertex:
// comp -1). A thread a cell, its row and column by 32-bit division (fewer than 2**31 cells). A vertex
// whose neighbours are all of its component (or none) is marked interior: components only grow, so it
// never proposes again, and later rounds read a byte of it instead of its neighbours' components.
extern "C" __global__ void find_min(const VAL_T* __restrict__ vals, const int* __restrict__ comp,
                                   unsigned char* interior, u64* best, int H, int W, int T) {
    const unsigned v = blockIdx.x * blockDim.x + threadIdx.x;
    const int cv = v < (unsigned)H * (unsigned)W && !interior[v] ? comp[v] : -1;
    u64 mine = ~0ULL;
    if (cv >= 0) {
        const int i = (int)(v / (unsigned)W), j = (int)(v - (unsigned)i * (unsigned)W);
        double hv = to_double(vals[v]);
        bool open = false;
        for (int d = 0; d < 8; ++d) {
            const int u = tile_neighbour(i, j, d, H, W, T);
            if (u < 0) continue;
            const int cu = comp[u];
            if (cu < 0 || cu == cv) continue;
            open = true;
            double w = edge_weight(hv, to_double(vals[u]));
#if PACKED
            u64 key = ((u64)weight_key32(vals[v], vals[u], w) << 32) | edge_code(v, u, i, j, i + DR[d], j + DC[d], d, T);
#else
            u64 key = order64(w);
#endif
            if (key < mine) mine = key;
        }
        if (!open) interior[v] = 1;
    }
    atomic_min_runs(best, cv, mine);
}

// Step 1b (PACKED=0 only): the smallest code among the component's edges of minimum weight.
extern "C" __global__ void find_min_code(const VAL_T* __restrict__ vals, const int* __restrict__ comp,
                                        const unsigned char* __restrict__ interior, const u64* __restrict__ best,
                                        unsigned* best_code, int H, int W, int T) {
    const unsigned v = blockIdx.x * blockDim.x + threadIdx.x;
    int cv = v < (unsigned)H * (unsigned)W && !interior[v] ? comp[v] : -1;  // (interior: no edge leaves it)
    if (cv >= 0 && best[cv] == ~0ULL) cv = -1;
    unsigned mine = 0xFFFFFFFFu;
    if (cv >= 0) {
        const int i = (int)(v / (unsigned)W), j = (int)(v - (unsigned)i * (unsigned)W);
        u64 target = best[cv];
        double hv = to_double(vals[v]);
        for (int d = 0; d < 8; ++d) {
            const int u = tile_neighbour(i, j, d, H, W, T);
            if (u < 0) continue;
            const int cu = comp[u];
            if (cu < 0 || cu == cv) continue;
            if (order64(edge_weight(hv, to_double(vals[u]))) != target) continue;
            unsigned code = edge_code(v, u, i, j, i + DR[d], j + DC[d], d, T);
            if (code < mine) mine = code;
        }
    }
    atomic_min_runs(best_code, cv, mine);
}

// The round's roots: listed = 0, every cell t < m (those with comp[t] == t are roots); listed = 1 (in
// core, from the second round), the m cells of roots[] (the last round's pair winners, break_pairs).
__device__ __forceinline__ long long round_root(const int* __restrict__ roots, int listed, long long t) {
    return listed ? (long long)roots[t] : t;
}

// Step 2: every component root hooks onto the component at the other end of its edge, whose bit it
// sets (bits: a byte a cell, set through the aligned 32-bit word that holds it), and sets its best
// key (and code) back to all ones for the next round.
extern "C" __global__ void hook(const int* __restrict__ roots, int listed, long long m, const int* __restrict__ comp,
                               u64* best, unsigned* best_code, int* parent, unsigned* bits, int* changed,
                               int H, int W, int T) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const long long v = round_root(roots, listed, t);
    if (comp[v] != v) return;
    u64 b = best[v];
    if (b == ~0ULL) return;
    best[v] = ~0ULL;  // (the next round's find_min starts from all ones: best is only ever a root's)
#if PACKED
    unsigned code = (unsigned)(b & 0xFFFFFFFFu);
#else
    unsigned code = best_code[v];
    best_code[v] = 0xFFFFFFFFu;
#endif
    int d = RANK_TO_DIR[code & 3];
#if INCORE
    long long lo = (long long)(code >> 2);
#else
    int loc = (int)(code >> 2);
    int i = (int)(v / W), j = (int)(v % W);
    long long lo = (long long)((i / T) * T + loc / T) * W + (j / T) * T + loc % T;
#endif
    long long hi = lo + (long long)DR[d] * W + DC[d];
    parent[v] = comp[lo] == v ? comp[hi] : comp[lo];
    atomicOr(&bits[lo >> 2], (1u << d) << (8 * (lo & 3)));
    // one store a warp, by the lowest of the lanes here (a store a root: 30 ms of contention in round 1)
    if ((threadIdx.x & 31) == __ffs(__activemask()) - 1) *changed = 1;
}

// Step 3: two components that chose the same edge point at each other; the smaller stays root. keep:
// the winners appended to winners[*count ...] (one atomic a warp), the next round's roots -- every
// other root of the next round is a complete island's, which never hooks again. The winners are at
// most half the round's roots (one a pair).
extern "C" __global__ void break_pairs(const int* __restrict__ roots, int listed, long long m,
                                      const int* __restrict__ comp, int* parent, int keep, int* winners,
                                      unsigned* count) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const long long v = round_root(roots, listed, t);
    if (comp[v] != v) return;
    int p = parent[v];
    if (p != v && parent[p] == v && v < p) {
        parent[v] = (int)v;
        if (keep) {
            const unsigned here = __activemask(), lane = threadIdx.x & 31;
            const int first = __ffs(here) - 1;
            unsigned at = 0;
            if (lane == first) at = atomicAdd(count, __popc(here));
            at = __shfl_sync(here, at, first);
            winners[at + __popc(here & ((1u << lane) - 1))] = (int)v;
        }
    }
}

// Step 4: every vertex points straight at its new root (one launch, no host round trip: the
// roots do not move, and a pointer compressed by another thread still leads to the same root).
extern "C" __global__ void find_roots(int* parent, long long n) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= n) return;
    int p = parent[v];
    if (p < 0) return;
    int q = parent[p];
    while (q != p) {
        p = q;
        q = parent[p];
    }
    parent[v] = p;
}

#if INCORE
// Step 4, in core: every root of the round (comp[v] == v; round_root) follows its parent pointers, each step
// parent[v] = parent[parent[v]] (pointer jumping: the longest chain shortens by half or more a
// launch), up to 8 steps a launch; *changed: some root is not at its new root yet. Pointers only move
// towards the new root, so steps of other threads read in between are safe.
extern "C" __global__ void jump(const int* __restrict__ roots, int listed, long long m, const int* __restrict__ comp,
                                int* parent, int* changed) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const long long v = round_root(roots, listed, t);
    if (comp[v] != v) return;
    int p = parent[v];
    for (int k = 0; k < 8; ++k) {
        int q = parent[p];
        if (q == p) return;
        parent[v] = q;
        p = q;
    }
    if (parent[p] != p) {
        if ((threadIdx.x & 31) == __ffs(__activemask()) - 1) *changed = 1;  // (the lowest of the lanes here)
    }
}

// Step 5, in core: every vertex takes its root's new root.
extern "C" __global__ void relabel(int* comp, const int* __restrict__ parent, long long n) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= n) return;
    int c = comp[v];
    if (c >= 0) comp[v] = parent[c];
}

#define N_BLOCK 1024
#include "mst_exact.cuh"

// The forest's edge count and exact weight sum (buckets (2, N_EXP), as _mst_cpu.exact_buckets):
// every cell's forward bits, a grid-stride loop, each block's sums in shared memory.
extern "C" __global__ void __launch_bounds__(N_BLOCK)
forest_totals(const VAL_T* __restrict__ vals, const unsigned char* __restrict__ bits, long long n, int W,
              u64* buckets, u64* edges) {
    __shared__ i64 s_buckets[2 * N_EXP];
    __shared__ unsigned long long s_edges;
    for (int k = threadIdx.x; k < 2 * N_EXP; k += N_BLOCK) s_buckets[k] = 0;
    if (threadIdx.x == 0) s_edges = 0;
    __syncthreads();
    ExactAcc acc = {0, 0, 0};
    unsigned long long count = 0;
    for (long long v = (long long)blockIdx.x * N_BLOCK + threadIdx.x; v < n; v += (long long)gridDim.x * N_BLOCK) {
        const unsigned b = bits[v] & 0xFu;
        if (!b) continue;
        count += __popc(b);
        const double hv = to_double(vals[v]);
        for (int d = 0; d < 4; ++d)
            if ((b >> d) & 1u) acc_add(acc, s_buckets, edge_weight(hv, to_double(vals[v + (long long)DR[d] * W + DC[d]])));
    }
    acc_flush(acc, s_buckets);
    atomicAdd(&s_edges, count);
    __syncthreads();
    for (int k = threadIdx.x; k < 2 * N_EXP; k += N_BLOCK)
        if (s_buckets[k] != 0) atomicAdd(&buckets[k], (u64)s_buckets[k]);
    if (threadIdx.x == 0) atomicAdd(edges, s_edges);
}
#endif
