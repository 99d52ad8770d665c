// The in-core SSSP engine on the GPU (terrain_io/grid/sssp/incore.py has the rules; the numba
// kernels of _incore_cpu.py compute the same bytes).
//
// The ringed block ((h + 2) x (w + 2), row-major) is cut into TS x TS tiles of its interior. A
// round runs one thread block per tile of a work list: the tile and its one-cell halo go into
// shared memory, the tile is relaxed there to local convergence (pull relaxation, in place:
// labels only fall, so reading a neighbour mid-update is safe), improved cells are written back,
// and a tile whose border cells improved puts its neighbours on the next round's list (a flag per
// tile keeps each once). Rounds repeat until a list is empty: the fixpoint, the same bits as
// Dijkstra whatever the order (incore.py). Distances first, in near-far order (keyed rounds of
// worklist.cuh: a tile waits while its key lies beyond the round's reach), then plateau levels
// the same way with the distances fixed, then the parent codes cell by cell.
// Compile-time: VAL (value type), KIND (weight model: 1 absdiff, 2 surface, 3 cell, 4 walk).

#include "grid.cuh"
#include "worklist.cuh"

#define NO_LEVEL 2147483647
#define NO_PRED 255

// the weight of edge a -> b (grid.cuh), the model fixed at compile time
__device__ __forceinline__ double sssp_weight(double a, double b, double step) {
    return sssp_edge_weight(KIND, a, b, step);
}

// Load the tile with its halo: values (NaN beyond the block) and labels.
template <typename L>
__device__ __forceinline__ void load_tile(const VAL* __restrict__ vals, const L* __restrict__ lab, L beyond,
                                          int h, int w, const ListedTile& tile, double (*sv)[HS], L (*sl)[HS]) {
    const long long W2 = w + 2;
    for (int i = threadIdx.y; i < HS; i += BY) {
        for (int j = threadIdx.x; j < HS; j += TS) {
            const int R = tile.tr * TS + i, C = tile.tc * TS + j;  // ringed coordinates (tile interior from 1)
            if (R <= h + 1 && C <= w + 1) {
                sv[i][j] = (double)vals[R * W2 + C];
                sl[i][j] = lab[R * W2 + C];
            } else {
                sv[i][j] = __longlong_as_double(0x7ff8000000000000LL);
                sl[i][j] = beyond;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(TS * BY)
relax_distances(const VAL* __restrict__ vals, double* __restrict__ dist, int h, int w, const double* __restrict__ steps,
                double limit, const int* __restrict__ work, int* __restrict__ own_flag, int* __restrict__ next_flag,
                int* __restrict__ next_work, unsigned long long* __restrict__ own_key,
                unsigned long long* __restrict__ next_key, const unsigned long long* __restrict__ own_totals,
                unsigned long long* __restrict__ next_totals, double delta) {
    __shared__ double sv[HS][HS];
    __shared__ double sd[HS][HS];
    __shared__ unsigned long long mark[3][3];
    const KeyedLists lists{work, own_flag, next_flag, next_work, own_key, next_key, own_totals, next_totals};
    ListedTile tile;
    if (!keyed_tile(lists, delta, mark, h, w, tile)) return;  // far: passed on
    const int tr = tile.tr, tc = tile.tc;
    load_tile<double>(vals, dist, __longlong_as_double(0x7ff0000000000000LL), h, w, tile, sv, sd);
    __syncthreads();
    double st[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) st[k] = steps[k];
    const int j = 1 + threadIdx.x;
    // a partial tile at the block's edge: its cells beyond the interior (the ring) stay fixed
    const bool col_in = tc * TS + j <= w;
    double before[TS / BY];
    bool solve[TS / BY];
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = 1 + threadIdx.y + BY * m;
        before[m] = sd[i][j];
        solve[m] = col_in && tr * TS + i <= h && !isnan(sv[i][j]);
    }
    relax_tile(solve, [&](int, int i, int j) {
        const double b = sv[i][j];
        double best = sd[i][j];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const double a = sv[i + DR[k]][j + DC[k]];
            if (isnan(a)) continue;
            const double nd = sd[i + DR[k]][j + DC[k]] + sssp_weight(a, b, st[k]);
            if (nd < best && nd <= limit) best = nd;  // beyond the limit: unreached
        }
        if (best < sd[i][j]) {
            sd[i][j] = best;
            return true;
        }
        return false;
    });
    store_improved_keyed(tile, sd, before, solve, dist, w + 2, mark, lists);
}

// Level 0 at sources (set by the caller) and at cells with a strictly nearer tight parent; the
// other reached cells start at NO_LEVEL (plateau cells). Interior cells only.
extern "C" __global__ void initial_levels(const VAL* __restrict__ vals, const double* __restrict__ dist,
                                          int* __restrict__ level, int h, int w, const double* __restrict__ steps) {
    const long long n = (long long)h * w;
    const long long W2 = w + 2;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const long long v = (q / w + 1) * W2 + q % w + 1;
        const double b = (double)vals[v], dv = dist[v];
        int lv = NO_LEVEL;
        if (!isnan(b) && dv < __longlong_as_double(0x7ff0000000000000LL)) {
            for (int k = 0; k < 8; ++k) {
                const long long u = v + DR[k] * W2 + DC[k];
                const double a = (double)vals[u];
                if (!isnan(a) && dist[u] < dv && dist[u] + sssp_weight(a, b, steps[k]) == dv) {
                    lv = 0;
                    break;
                }
            }
        }
        level[v] = lv;
    }
}

extern "C" __global__ void __launch_bounds__(TS * BY)
relax_levels(const VAL* __restrict__ vals, const double* __restrict__ dist, int* __restrict__ level, int h, int w,
             const double* __restrict__ steps, const int* __restrict__ work, int* __restrict__ own_flag,
             int* __restrict__ next_flag, int* __restrict__ next_work, int* __restrict__ next_count) {
    __shared__ double sv[HS][HS];
    __shared__ double sd[HS][HS];
    __shared__ int sl[HS][HS];
    __shared__ int mark[3][3];
    const ListedTile tile = listed_tile(work, own_flag, mark, h, w);
    const int tr = tile.tr, tc = tile.tc;
    load_tile<double>(vals, dist, __longlong_as_double(0x7ff0000000000000LL), h, w, tile, sv, sd);
    load_tile<int>(vals, level, NO_LEVEL, h, w, tile, sv, sl);
    __syncthreads();
    const int j = 1 + threadIdx.x;
    const bool col_in = tc * TS + j <= w;
    // each interior cell's plateau parents (tight, same distance) as a bit mask, found once
    unsigned parents[TS / BY];
    int before[TS / BY];
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = 1 + threadIdx.y + BY * m;
        before[m] = sl[i][j];
        parents[m] = 0;
        const double b = sv[i][j], dv = sd[i][j];
        if (!col_in || tr * TS + i > h || sl[i][j] == 0 || isnan(b) || !(dv < __longlong_as_double(0x7ff0000000000000LL))) continue;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const double a = sv[i + DR[k]][j + DC[k]], du = sd[i + DR[k]][j + DC[k]];
            if (!isnan(a) && du == dv && du + sssp_weight(a, b, steps[k]) == dv) parents[m] |= 1u << k;
        }
    }
    relax_tile(parents, [&](int m, int i, int j) {
        int best = sl[i][j];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (!(parents[m] >> k & 1)) continue;
            const int lu = sl[i + DR[k]][j + DC[k]];
            if (lu != NO_LEVEL && lu + 1 < best) best = lu + 1;
        }
        if (best < sl[i][j]) {
            sl[i][j] = best;
            return true;
        }
        return false;
    });
    store_improved(tile, sl, before, parents, level, w + 2, 0, mark, own_flag, next_flag, next_work, next_count);
}

// The parent code of every interior cell: the tight parent with the least (key, direction).
extern "C" __global__ void parent_codes(const VAL* __restrict__ vals, const double* __restrict__ dist,
                                        const int* __restrict__ level, unsigned char* __restrict__ pred, int h, int w,
                                        const double* __restrict__ steps) {
    const long long n = (long long)h * w;
    const long long W2 = w + 2;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const long long v = (q / w + 1) * W2 + q % w + 1;
        const double b = (double)vals[v], dv = dist[v];
        int best = NO_PRED;
        if (!isnan(b) && dv < __longlong_as_double(0x7ff0000000000000LL)) {
            long long best_key = 1LL << 62;
            for (int k = 0; k < 8; ++k) {
                const long long u = v + DR[k] * W2 + DC[k];
                const double a = (double)vals[u];
                if (isnan(a) || !(dist[u] + sssp_weight(a, b, steps[k]) == dv)) continue;
                const long long key = dist[u] < dv ? 0 : (long long)level[u] + 1;
                if (key < best_key) {
                    best_key = key;
                    best = k;
                }
            }
        }
        pred[q] = (unsigned char)best;
    }
}
