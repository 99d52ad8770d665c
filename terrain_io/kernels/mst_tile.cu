// Tile phase of the grid MST on the GPU: Boruvka after Vineet et al. (HPG 2009), as in
// Gerritsen 2012, part II ch. 3 (docs/ARCHITECTURE.md#mst-pipeline), for all tiles of a batch in one launch per step.
//
// Cells are numbered in the batch (v = i * W + j); a cell sees only its neighbours in the same
// T x T tile, so each tile's spanning forest grows independently. Every edge has one strict key:
// (weight, code) with code = (local lo row * T + local lo col) * 4 + rank, rank 0..3 for the
// forward directions E, SW, S, SE (the order of the larger endpoint), which orders a tile's edges
// exactly as the global (weight, smaller id, larger id). PACKED=1: the weight is exactly a float32
// and weight and code share one 64-bit key (one atomicMin per vertex and round); PACKED=0: float64
// weights, the minimum weight first, then the minimum code among edges of that weight.
//
// Compile-time options: VAL_T (the elevation type), KIND (0 = max, 1 = absdiff; see
// terrain_io/weights.py), PACKED.

typedef unsigned long long u64;

#include "grid.cuh"

__constant__ int RANK_TO_DIR[4] = {0, 3, 2, 1};

__device__ __forceinline__ unsigned order32(float w) {
    unsigned u = __float_as_uint(w + 0.0f);  // -0 and +0: one key
    return (u >> 31) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 order64(double w) {
    u64 u = (u64)__double_as_longlong(w + 0.0);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

// The edge from cell (i, j) in direction d to (ii, jj): its code inside the tile.
__device__ __forceinline__ unsigned edge_code(int i, int j, int ii, int jj, int d, int T) {
    if (d < 4) return (unsigned)(((i % T) * T + (j % T)) * 4 + DIR_TO_RANK[d]);
    return (unsigned)(((ii % T) * T + (jj % T)) * 4 + DIR_TO_RANK[d - 4]);
}

// Neighbour u of v in direction d inside the same tile and valid, else -1.
__device__ __forceinline__ long long tile_neighbour(const unsigned char* valid, int i, int j, int d,
                                                    int H, int W, int T) {
    int ii = i + DR[d], jj = j + DC[d];
    if (ii < 0 || ii >= H || jj < 0 || jj >= W) return -1;
    if (ii / T != i / T || jj / T != j / T) return -1;
    long long u = (long long)ii * W + jj;
    return valid[u] ? u : -1;
}

// Step 1: every vertex proposes its lightest edge leaving its component.
extern "C" __global__ void find_min(const VAL_T* __restrict__ vals, const unsigned char* __restrict__ valid,
                                   const int* __restrict__ comp, u64* best, int H, int W, int T) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= (long long)H * W || !valid[v]) return;
    int i = (int)(v / W), j = (int)(v % W);
    int cv = comp[v];
    double hv = (double)vals[v];
    u64 mine = ~0ULL;
    for (int d = 0; d < 8; ++d) {
        long long u = tile_neighbour(valid, i, j, d, H, W, T);
        if (u < 0 || comp[u] == cv) continue;
        double w = edge_weight(hv, (double)vals[u]);
#if PACKED
        u64 key = ((u64)order32((float)w) << 32) | edge_code(i, j, i + DR[d], j + DC[d], d, T);
#else
        u64 key = order64(w);
#endif
        if (key < mine) mine = key;
    }
    if (mine != ~0ULL) atomicMin(&best[cv], mine);
}

// Step 1b (PACKED=0 only): the smallest code among the component's edges of minimum weight.
extern "C" __global__ void find_min_code(const VAL_T* __restrict__ vals, const unsigned char* __restrict__ valid,
                                        const int* __restrict__ comp, const u64* __restrict__ best,
                                        unsigned* best_code, int H, int W, int T) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= (long long)H * W || !valid[v]) return;
    int i = (int)(v / W), j = (int)(v % W);
    int cv = comp[v];
    u64 target = best[cv];
    if (target == ~0ULL) return;
    double hv = (double)vals[v];
    unsigned mine = 0xFFFFFFFFu;
    for (int d = 0; d < 8; ++d) {
        long long u = tile_neighbour(valid, i, j, d, H, W, T);
        if (u < 0 || comp[u] == cv) continue;
        if (order64(edge_weight(hv, (double)vals[u])) != target) continue;
        unsigned code = edge_code(i, j, i + DR[d], j + DC[d], d, T);
        if (code < mine) mine = code;
    }
    if (mine != 0xFFFFFFFFu) atomicMin(&best_code[cv], mine);
}

// Step 2: every component root hooks onto the component at the other end of its edge.
extern "C" __global__ void hook(const int* __restrict__ comp, const u64* __restrict__ best,
                               const unsigned* __restrict__ best_code, int* parent, unsigned* bits,
                               int* changed, int H, int W, int T) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= (long long)H * W || comp[v] != v) return;
    u64 b = best[v];
    if (b == ~0ULL) return;
#if PACKED
    unsigned code = (unsigned)(b & 0xFFFFFFFFu);
#else
    unsigned code = best_code[v];
#endif
    int d = RANK_TO_DIR[code & 3];
    int loc = (int)(code >> 2);
    int i = (int)(v / W), j = (int)(v % W);
    long long lo = (long long)((i / T) * T + loc / T) * W + (j / T) * T + loc % T;
    long long hi = lo + (long long)DR[d] * W + DC[d];
    parent[v] = comp[lo] == v ? comp[hi] : comp[lo];
    atomicOr(&bits[lo], 1u << d);
    *changed = 1;
}

// Step 3: two components that chose the same edge point at each other; the smaller stays root.
extern "C" __global__ void break_pairs(const int* __restrict__ comp, int* parent, long long n) {
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= n || comp[v] != v) return;
    int p = parent[v];
    if (p != v && parent[p] == v && v < p) parent[v] = (int)v;
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
