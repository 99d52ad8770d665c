// Depression filling on the GPU (terrain_io/grid/_fill_gpu.py; the definition is fill.py's, and
// the numba pipeline of _fill_cpu.py computes the same bytes).
//
// Fill levels: F is the fixpoint of F(v) = max(h(v), min over valid 8-neighbours u of F(u)),
// with F = h at the outlet cells and F = +inf elsewhere to start: labels only fall, and the
// fixpoint reached from above is the minimax distance to the outside vertex O (each value is the
// highest elevation on some path to O, and no path's is lower). min and max never round, so any
// order of relaxation gives the same bits. The ringed DEM ((h + 2) x (w + 2), row-major, NaN
// ring) is cut into TS x TS tiles relaxed in shared memory to local convergence, over a work list
// of active tiles (worklist.cuh), as the in-core SSSP engine's distances (sssp_incore.cu).
// Cells still at +inf have no path to O (islands walled by nodata): they keep F = h.
//
// Lakes: union-find over the 8-connected cells with F > h (hooking the larger root under the
// smaller by compare-and-swap, as ECL-CC does: Jaiganesh & Burtscher 2018), so every root is its
// component's least cell id; roots numbered 1, 2, ... in cell order give the CPU's ids.
// Compile-time: VAL (float or double: the DEM's values, exactly); CELL (unsigned or unsigned long
// long: a row-major cell id, 32 bits up to 2^32 cells -- 65536^2 -- and 64 bits beyond).

#include "grid.cuh"
#include "worklist.cuh"

#define RUN 16  // cells a thread folds into one update of a lake's statistics

__device__ __forceinline__ VAL val_inf() { return (VAL)__longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ VAL val_nan() { return (VAL)__longlong_as_double(0x7ff8000000000000LL); }

// a cell of the grid graph: not NaN, not the (integer DEM's) nodata value (NaN: none)
__device__ __forceinline__ bool is_vertex(VAL x, VAL nd) { return !isnan(x) && x != nd; }

// F = h at the outlets (valid cells on the DEM's edge or, with nodata_drains, next to a
// non-vertex), +inf at every other cell of the ringed array.
extern "C" __global__ void init_levels(const VAL* __restrict__ vals, VAL* __restrict__ F, int h, int w, VAL nd,
                                       int nodata_drains) {
    const long long W2 = w + 2, n = (long long)(h + 2) * W2;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const long long R = q / W2, C = q - (q / W2) * W2;
        const VAL x = vals[q];
        VAL f = val_inf();
        if (R >= 1 && R <= h && C >= 1 && C <= w && is_vertex(x, nd)) {
            bool out = R == 1 || R == h || C == 1 || C == w;
            for (int k = 0; k < 8 && !out && nodata_drains; ++k) out = !is_vertex(vals[q + DR[k] * W2 + DC[k]], nd);
            if (out) f = x;
        }
        F[q] = f;
    }
}

extern "C" __global__ void __launch_bounds__(TS * BY)
relax_levels(const VAL* __restrict__ vals, VAL* __restrict__ F, int h, int w, VAL nd, const int* __restrict__ work,
             int* __restrict__ own_flag, int* __restrict__ next_flag, int* __restrict__ next_work,
             int* __restrict__ next_count) {
    __shared__ VAL sv[HS][HS];
    __shared__ VAL sf[HS][HS];
    __shared__ int mark[3][3];
    const ListedTile tile = listed_tile(work, own_flag, mark, h, w);
    const int tr = tile.tr, tc = tile.tc;
    const long long W2 = w + 2;
    for (int i = threadIdx.y; i < HS; i += BY) {
        for (int j = threadIdx.x; j < HS; j += TS) {
            const int R = tr * TS + i, C = tc * TS + j;  // ringed coordinates (the tile's interior from 1)
            VAL x = val_nan(), f = val_inf();
            if (R <= h + 1 && C <= w + 1) {
                x = vals[R * W2 + C];
                f = F[R * W2 + C];  // +inf at non-vertices: they never lower a neighbour
                if (!is_vertex(x, nd)) x = val_nan();
            }
            sv[i][j] = x;
            sf[i][j] = f;
        }
    }
    __syncthreads();
    const int j = 1 + threadIdx.x;
    const bool col_in = tc * TS + j <= w;
    VAL before[TS / BY];
    bool solve[TS / BY];
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = 1 + threadIdx.y + BY * m;
        before[m] = sf[i][j];
        // F == h is final (F never falls below h); partial tiles: the cells beyond stay fixed
        solve[m] = col_in && tr * TS + i <= h && !isnan(sv[i][j]) && sf[i][j] > sv[i][j];
    }
    relax_tile(solve, [&](int, int i, int j) {
        VAL low = sf[i][j + 1];
#pragma unroll
        for (int k = 1; k < 8; ++k) low = fmin(low, sf[i + DR[k]][j + DC[k]]);
        const VAL b = sv[i][j];
        const VAL nf = low > b ? low : b;
        if (nf < sf[i][j]) {
            sf[i][j] = nf;
            return true;
        }
        return false;
    });
    store_improved(tile, sf, before, solve, F, W2, 0, mark, own_flag, next_flag, next_work, next_count);
}

// Unreached cells keep F = h; lake cells (F > h) start as their own roots (parent = cell id),
// every other cell gets parent 0 (cell 0 lies on the DEM's edge: never in a lake).
extern "C" __global__ void init_lakes(const VAL* __restrict__ vals, VAL* __restrict__ F, CELL* __restrict__ parent,
                                      int h, int w, VAL nd) {
    const long long n = (long long)h * w, W2 = w + 2;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const long long v = (q / w + 1) * W2 + q % w + 1;
        const VAL x = vals[v];
        CELL p = 0;
        if (is_vertex(x, nd)) {
            VAL f = F[v];
            if (f == val_inf()) F[v] = f = x;
            if (f > x) p = (CELL)q;
        }
        parent[q] = p;
    }
}

// The root of x (parent[y] <= y everywhere), halving the path on the way.
__device__ __forceinline__ CELL find_root(CELL* parent, CELL x) {
    CELL p = parent[x];
    if (p != x) {
        CELL next, prev = x;
        while (p > (next = parent[p])) {
            parent[prev] = next;
            prev = p;
            p = next;
        }
    }
    return p;
}

extern "C" __global__ void unite_lakes(CELL* __restrict__ parent, int h, int w) {
    const long long n = (long long)h * w;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        if (parent[q] == 0) continue;
        const int r = (int)(q / w), c = (int)(q - (q / w) * w);
        for (int k = 4; k < 8; ++k) {  // W, NW, N, NE: each undirected pair once
            const int x = r + DR[k], y = c + DC[k];
            if (x < 0 || y < 0 || y >= w) continue;
            const CELL u = (CELL)x * (CELL)w + (CELL)y;
            if (parent[u] == 0) continue;
            CELL a = find_root(parent, (CELL)q), b = find_root(parent, u);
            while (a != b) {  // hook the larger root under the smaller; a lost race retries from there
                if (a < b) {
                    const CELL got = atomicCAS(&parent[b], b, a);
                    if (got == b) break;
                    b = got;
                } else {
                    const CELL got = atomicCAS(&parent[a], a, b);
                    if (got == a) break;
                    a = got;
                }
            }
        }
    }
}

extern "C" __global__ void flatten_lakes(CELL* __restrict__ parent, unsigned char* __restrict__ root, int h, int w) {
    const long long n = (long long)h * w;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        CELL p = parent[q];
        if (p == 0) {
            root[q] = 0;
            continue;
        }
        while (parent[p] != p) p = parent[p];
        parent[q] = p;
        root[q] = p == (CELL)q;
    }
}

// After parent[root] = its lake's id (1, 2, ...) at every root: every other lake cell's parent (its
// root) -> that id. Roots are read here, never written (their flags tell them apart).
extern "C" __global__ void number_lakes(CELL* __restrict__ parent, const unsigned char* __restrict__ root,
                                        long long n) {
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const CELL p = parent[q];
        if (p != 0 && !root[q]) parent[q] = parent[p];
    }
}

__device__ __forceinline__ unsigned long long order_key(double x) {  // the order of doubles as unsigned
    const long long b = __double_as_longlong(x + 0.0);  // -0 as +0: equal elevations, one key
    return b >= 0 ? (unsigned long long)b | 0x8000000000000000ULL : ~(unsigned long long)b;
}

__device__ __forceinline__ void two_sum(double a, double b, double& s, double& e) {
    s = a + b;
    const double bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}

struct LakeSum {
    unsigned long long cells, pit_key, spill;
    double hi, lo, max_depth;
};

__device__ __forceinline__ void lake_reset(LakeSum& s) {
    s.cells = 0;
    s.pit_key = s.spill = 0xFFFFFFFFFFFFFFFFULL;
    s.hi = s.lo = s.max_depth = 0.0;
}

// Fold a run's sums into lake k's: volume as hi + lo, the CPU's double-double (two-sum on hi)
__device__ __forceinline__ void lake_flush(const LakeSum& s, unsigned k, unsigned long long* cells, double* hi,
                                           double* lo, unsigned long long* max_depth, unsigned long long* pit_key,
                                           unsigned long long* spill) {
    if (k == 0 || s.cells == 0) return;
    --k;
    atomicAdd(&cells[k], s.cells);
    const double old = atomicAdd(&hi[k], s.hi);
    double sum, err;
    two_sum(old, s.hi, sum, err);
    atomicAdd(&lo[k], err + s.lo);
    atomicMax(&max_depth[k], (unsigned long long)__double_as_longlong(s.max_depth));  // >= 0: ordered as bits
    atomicMin(&pit_key[k], s.pit_key);
    if (s.spill != 0xFFFFFFFFFFFFFFFFULL) atomicMin(&spill[k], s.spill);
}

// Per lake: cells, volume (hi, lo: depths F - h in float64), maximum depth, the least elevation
// (as an order key) and the spill cell (the least id among the cells next to the lake at its
// level). A thread takes RUN consecutive cells and updates a lake's sums once per run of it.
extern "C" __global__ void lake_stats(const VAL* __restrict__ vals, const VAL* __restrict__ F,
                                      const unsigned* __restrict__ dep, int h, int w, VAL nd,
                                      unsigned long long* cells, double* hi, double* lo,
                                      unsigned long long* max_depth, unsigned long long* pit_key,
                                      unsigned long long* spill) {
    const long long n = (long long)h * w, W2 = w + 2, runs = (n + RUN - 1) / RUN;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < runs; t += (long long)gridDim.x * blockDim.x) {
        const long long q1 = min(n, (t + 1) * RUN);
        unsigned cur = 0;
        LakeSum s;
        lake_reset(s);
        for (long long q = t * RUN; q < q1; ++q) {
            const unsigned k = dep[q];
            if (k != cur) {
                lake_flush(s, cur, cells, hi, lo, max_depth, pit_key, spill);
                lake_reset(s);
                cur = k;
            }
            if (k == 0) continue;
            const long long r = q / w, c = q - (q / w) * w;
            const long long v = (r + 1) * W2 + c + 1;
            const VAL x = vals[v], f = F[v];
            const double d = (double)f - (double)x;
            s.cells += 1;
            double sum, err;
            two_sum(s.hi, d, sum, err);
            s.hi = sum;
            s.lo += err;
            if (d > s.max_depth) s.max_depth = d;
            const unsigned long long key = order_key((double)x);
            if (key < s.pit_key) s.pit_key = key;
            for (int k2 = 0; k2 < 8; ++k2) {
                const VAL y = vals[v + DR[k2] * W2 + DC[k2]];
                if (is_vertex(y, nd) && y == f) {
                    const unsigned long long id = (unsigned long long)((r + DR[k2]) * w + c + DC[k2]);
                    if (id < s.spill) s.spill = id;
                }
            }
        }
        lake_flush(s, cur, cells, hi, lo, max_depth, pit_key, spill);
    }
}

// The pit: the least cell id among each lake's cells at its least elevation.
extern "C" __global__ void lake_pits(const VAL* __restrict__ vals, const unsigned* __restrict__ dep, int h, int w,
                                     const unsigned long long* __restrict__ pit_key, unsigned long long* pit) {
    const long long n = (long long)h * w, W2 = w + 2;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const unsigned k = dep[q];
        if (k == 0) continue;
        const VAL x = vals[(q / w + 1) * W2 + q % w + 1];
        if (order_key((double)x) == pit_key[k - 1]) atomicMin(&pit[k - 1], (unsigned long long)q);
    }
}

// Where each lake spills to: the lake holding the spill cell's neighbour of least (level, cell
// id) among its neighbours in other lakes; 0 when none (onto dry land or out of the DEM).
extern "C" __global__ void spill_targets(const VAL* __restrict__ F, const unsigned* __restrict__ dep, int h, int w,
                                         const long long* __restrict__ spill, long long lakes,
                                         unsigned* __restrict__ out) {
    const long long W2 = w + 2;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < lakes; k += (long long)gridDim.x * blockDim.x) {
        const long long s = spill[k];
        unsigned best = 0;
        double bl = 0.0;
        long long bid = -1;
        if (s >= 0) {
            const long long r = s / w, c = s - (s / w) * w;
            for (int d = 0; d < 8; ++d) {
                const long long x = r + DR[d], y = c + DC[d];
                if (x < 0 || y < 0 || x >= h || y >= w) continue;
                const unsigned o = dep[x * w + y];
                if (o == 0 || o == (unsigned)(k + 1)) continue;
                const double lv = (double)F[(x + 1) * W2 + y + 1];
                const long long nid = x * w + y;
                if (best == 0 || lv < bl || (lv == bl && nid < bid)) {
                    best = o;
                    bl = lv;
                    bid = nid;
                }
            }
        }
        out[k] = best;
    }
}
