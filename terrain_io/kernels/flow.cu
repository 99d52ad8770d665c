// Flow routing on the GPU (terrain_io/grid/flow/_gpu.py); the definitions are the CPU kernels'
// (terrain_io/grid/flow/_cpu.py) and the codes terrain_io/grid/flow/codes.py's.
//
// Directions: D8 in one pass (float64 slopes, --fmad=false); the flats' two multi-source BFS
// (Barnes, Lehman & Mulla 2014) as the fixpoint dist(c) = min(dist(c), dist(n) + 1) over 8-adjacent
// unresolved cells, relaxed TS x TS tiles at a time in shared memory over a work list of active
// tiles (worklist.cuh, as fill.cu): a filled lake costs rounds per tile it spans, not per cell;
// then each flat cell's code from the mask 2 * towards - away.
//
// Accumulation (Barnes 2017, "Parallel non-divergent flow accumulation for trillion cell digital
// elevation models", with the perimeter solve done by an Euler tour + list ranking):
//   A. acc_tile<.., FINAL=0>: every TS x TS tile alone in shared memory (counts by doubling along
//      the in-tile paths, weighted sums by rounds in the CPU's order: see acc_tile); the cells
//      whose code leaves the tile are its *exits*,
//      ranked in the tile; their tile-local values and, for every cell, the rank of the exit its
//      in-tile path reaches (pointer jumping, log2(TS * TS) rounds) are written out.
//   B. reduce_links: the exits form a forest (an exit's parent is the exit its target's path
//      reaches in the next tile); subtree sums of the tile-local values over that forest (an Euler
//      tour ranked by terrain_io.graph.listrank on the host side) are the exits' final values.
//   C. acc_tile<.., FINAL=1>: the tiles again, outside donors now giving the exits' final values.
// Every cell's sum s(c) = its donors' values v(n) = s(n) + w(n). Sums are integers, so any order
// gives the CPU's bytes: counts in unsigned long long; weights as the CPU's fixed-point integers
// (terrain_io/grid/flow/_cpu.py: q(w) = w * 2^scale, 128 bits in two words, u128), converted to
// float64 once at the end (to_double).
// Compile-time: VAL (float or double: the elevations).

#include "grid.cuh"
#include "worklist.cuh"

#define UNRESOLVED 254
#define NODATA_CODE 255
#define OUTLET_CODE 8
#define SINK_CODE 9
#define FAR 0x3fffffff  // BFS distance of an unreached (or non-flat) cell; FAR + 1 does not overflow
#define MAXE (4 * TS - 4)  // exits of a tile at most: its border cells

// D8 steepest descent: code 0..7, OUTLET_CODE, NODATA_CODE or UNRESOLVED; tile_flag[t] = 1 for the
// tiles holding an unresolved cell.
extern "C" __global__ void d8(const VAL* __restrict__ z, const unsigned char* __restrict__ valid, int h, int w,
                              const double* __restrict__ L, int nodata_drains, unsigned char* __restrict__ code,
                              int* __restrict__ tile_flag) {
    const long long n = (long long)h * w;
    const int ntc = (w + TS - 1) / TS;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        if (!valid[q]) {
            code[q] = NODATA_CODE;
            continue;
        }
        const int r = (int)(q / w), c = (int)(q - (q / w) * w);
        const VAL zc = z[q];
        bool out = r == 0 || r == h - 1 || c == 0 || c == w - 1;
        int best = -1;
        double top = 0.0;
        for (int d = 0; d < 8; ++d) {
            const int r2 = r + DR[d], c2 = c + DC[d];
            if (r2 < 0 || r2 >= h || c2 < 0 || c2 >= w) continue;
            const long long q2 = (long long)r2 * w + c2;
            if (!valid[q2]) {
                out = out || nodata_drains;
                continue;
            }
            const VAL zn = z[q2];
            if (zn < zc) {
                const double s = ((double)zc - (double)zn) / L[d];
                if (best < 0 || s > top) {
                    best = d;
                    top = s;
                }
            }
        }
        unsigned char k = best >= 0 ? (unsigned char)best : (out ? OUTLET_CODE : UNRESOLVED);
        code[q] = k;
        if (k == UNRESOLVED) tile_flag[(r / TS) * ntc + c / TS] = 1;
    }
}

// BFS sources: towards = 1 at the low edges (an unresolved cell beside a resolved valid cell of its
// elevation), away = 1 at the high edges (beside a higher valid cell); FAR everywhere else.
extern "C" __global__ void flat_edges(const VAL* __restrict__ z, const unsigned char* __restrict__ valid,
                                      const unsigned char* __restrict__ code, int h, int w, int* __restrict__ towards,
                                      int* __restrict__ away) {
    const long long n = (long long)h * w;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        bool low = false, high = false;
        if (code[q] == UNRESOLVED) {
            const int r = (int)(q / w), c = (int)(q - (q / w) * w);
            const VAL zc = z[q];
            for (int d = 0; d < 8; ++d) {
                const int r2 = r + DR[d], c2 = c + DC[d];
                if (r2 < 0 || r2 >= h || c2 < 0 || c2 >= w) continue;
                const long long q2 = (long long)r2 * w + c2;
                if (!valid[q2]) continue;
                const VAL zn = z[q2];
                high = high || zn > zc;
                low = low || (zn == zc && code[q2] != UNRESOLVED);
            }
        }
        towards[q] = low ? 1 : FAR;
        away[q] = high ? 1 : FAR;
    }
}

// One round of the BFS fixpoint over the work list's tiles: each tile relaxed to local convergence
// in shared memory; a tile whose border cells improved queues its neighbours (worklist.cuh). The
// rounds are launched back to back without the host reading the list's length (it reads it every
// few rounds): counts[round % 3] is this round's length, counts[(round + 1) % 3] the next round's
// (zeroed by the round before), counts[(round + 2) % 3] zeroed here for the round after; a fixed
// grid strides over the list, so an empty round costs one launch of idle blocks.
extern "C" __global__ void __launch_bounds__(TS * BY)
relax_bfs(const unsigned char* __restrict__ code, int* __restrict__ dist, int h, int w, const int* __restrict__ work,
          int* __restrict__ counts, int round, int* __restrict__ own_flag, int* __restrict__ next_flag,
          int* __restrict__ next_work) {
    __shared__ int sd[HS][HS];
    __shared__ int mark[3][3];
    const int ntr = (h + TS - 1) / TS, ntc = (w + TS - 1) / TS;
    const int n = counts[round % 3];
    int* next_count = counts + (round + 1) % 3;
    if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) counts[(round + 2) % 3] = 0;
    for (int b = blockIdx.x; b < n; b += gridDim.x) {
        const int t = work[b];
        const int tr = t / ntc, tc = t - (t / ntc) * ntc;
        if (threadIdx.x == 0 && threadIdx.y == 0) own_flag[t] = 0;
        if (threadIdx.y == 0 && threadIdx.x < 9) mark[threadIdx.x / 3][threadIdx.x % 3] = 0;
        for (int i = threadIdx.y; i < HS; i += BY) {
            for (int j = threadIdx.x; j < HS; j += TS) {
                const int R = tr * TS + i - 1, C = tc * TS + j - 1;
                sd[i][j] = (R >= 0 && R < h && C >= 0 && C < w) ? dist[(long long)R * w + C] : FAR;
            }
        }
        __syncthreads();
        const int j = 1 + threadIdx.x;
        int before[TS / BY];
        bool solve[TS / BY];
    #pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            const int i = 1 + threadIdx.y + BY * m;
            const int R = tr * TS + i - 1, C = tc * TS + j - 1;
            before[m] = sd[i][j];
            solve[m] = R < h && C < w && sd[i][j] > 1 && code[(long long)R * w + C] == UNRESOLVED;
        }
        relax_tile(solve, [&](int, int i, int j) {
            int low = sd[i][j + 1];
#pragma unroll
            for (int k = 1; k < 8; ++k) low = min(low, sd[i + DR[k]][j + DC[k]]);
            if (low + 1 < sd[i][j]) {
                sd[i][j] = low + 1;
                return true;
            }
            return false;
        });
        // The tile's cell (i, j) is dist's (tr * TS + i - 1, tc * TS + j - 1): origin -w - 1.
        store_improved(ListedTile{ntr, ntc, t, tr, tc}, sd, before, solve, dist, w, -(long long)w - 1, mark, own_flag,
                       next_flag, next_work, next_count);
        __syncthreads();  // mark and sd read before the next tile of this block overwrites them
    }
}

__device__ __forceinline__ long long flat_mask(const int* towards, const int* away, long long q) {
    const int a = away[q];
    return 2 * (long long)towards[q] - (a >= FAR ? 0 : a);
}

// Final codes (out: a copy of code): a flat cell drains to its valid neighbour of equal elevation
// with the least mask (resolved ones count as -infinity; ties: least direction); unreached: SINK.
extern "C" __global__ void flat_codes(const VAL* __restrict__ z, const unsigned char* __restrict__ valid,
                                      const unsigned char* __restrict__ code, const int* __restrict__ towards,
                                      const int* __restrict__ away, int h, int w, unsigned char* __restrict__ out) {
    const long long n = (long long)h * w;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const unsigned char k = code[q];
        if (k != UNRESOLVED) {
            out[q] = k;
            continue;
        }
        if (towards[q] >= FAR) {
            out[q] = SINK_CODE;
            continue;
        }
        const int r = (int)(q / w), c = (int)(q - (q / w) * w);
        const VAL zc = z[q];
        long long low = flat_mask(towards, away, q);
        int best = -1;
        for (int d = 0; d < 8; ++d) {
            const int r2 = r + DR[d], c2 = c + DC[d];
            if (r2 < 0 || r2 >= h || c2 < 0 || c2 >= w) continue;
            const long long q2 = (long long)r2 * w + c2;
            if (!valid[q2] || z[q2] != zc) continue;
            if (code[q2] != UNRESOLVED) {  // resolved: mask -infinity
                best = d;
                break;
            }
            const long long mn = flat_mask(towards, away, q2);
            if (mn < low) {
                best = d;
                low = mn;
            }
        }
        out[q] = (unsigned char)best;  // a reached flat cell always has a lower mask beside it
    }
}

// ---- accumulation -------------------------------------------------------------------------------

// An unsigned 128-bit integer in two words (the CPU's (lo, hi)); trivially constructible, so that it
// can live in shared memory.
struct u128 {
    unsigned long long lo, hi;
    u128() = default;
    __device__ u128(unsigned long long x) : lo(x), hi(0ull) {}
    __device__ u128(unsigned long long l, unsigned long long h) : lo(l), hi(h) {}
};
__device__ __forceinline__ u128 operator+(u128 a, u128 b) {
    const unsigned long long lo = a.lo + b.lo;
    return u128(lo, a.hi + b.hi + (lo < a.lo ? 1ull : 0ull));
}
__device__ __forceinline__ u128& operator+=(u128& a, u128 b) {
    a = a + b;
    return a;
}

// q(w) = w * 2^scale (w finite, >= 0), rounded half up to an integer: _cpu._q line for line.
__device__ __forceinline__ u128 quantize(double w, int scale) {
    const unsigned long long x = (unsigned long long)__double_as_longlong(w) & 0x7fffffffffffffffull;
    if (!x) return u128(0ull);
    long long e = (long long)(x >> 52);
    unsigned long long m = x & ((1ull << 52) - 1ull);
    if (e == 0) {
        e = -1074;
    } else {
        m |= 1ull << 52;
        e -= 1075;
    }
    const long long sh = e + scale;
    if (sh >= 64) return u128(0ull, m << (sh - 64));
    if (sh > 0) return u128(m << sh, m >> (64 - sh));
    if (sh == 0) return u128(m);
    if (sh < -53) return u128(0ull);
    const int k = (int)-sh;
    return u128((m + (1ull << (k - 1))) >> k);
}

// The float64 nearest v * 2^-scale: _cpu.to_float line for line (the high word's leading 64 bits,
// a sticky bit for the rest, one correctly rounded conversion, an exact power-of-two scaling).
__device__ __forceinline__ double to_double(u128 v, int scale) {
    if (!v.hi) return ldexp(__ull2double_rn(v.lo), -scale);
    const int n = __clzll((long long)v.hi);
    unsigned long long t = v.hi, rest = v.lo;
    if (n) {
        t = (v.hi << n) | (v.lo >> (64 - n));
        rest = v.lo << n;
    }
    if (rest) t |= 1ull;
    return ldexp(__ull2double_rn(t), 64 - n - scale);
}

// The weights' exponent range at the valid cells (_cpu.weight_range): out[0] = max of the binary
// exponents (w < 2^(top + 1)), out[1] = min of the exponents of the lowest set bits (out: -100000,
// 100000 beforehand; unchanged where no weight is > 0). Warp reductions, then one atomic a warp.
extern "C" __global__ void weight_range(const unsigned long long* __restrict__ bits,
                                        const unsigned char* __restrict__ code, long long n, long long* out) {
    long long top = -100000, low = 100000;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x) {
        const unsigned long long x = bits[q] & 0x7fffffffffffffffull;
        if (!x || code[q] == NODATA_CODE) continue;
        long long e = (long long)(x >> 52);
        unsigned long long m = x & ((1ull << 52) - 1ull);
        if (e) {
            top = max(top, e - 1023);
            m |= 1ull << 52;
            e -= 1075;
        } else {
            top = max(top, -1075ll + (64 - __clzll((long long)m)));
            e = -1074;
        }
        low = min(low, e + __ffsll((long long)m) - 1);
    }
    for (int o = 16; o > 0; o >>= 1) {
        top = max(top, __shfl_down_sync(0xffffffffu, top, o));
        low = min(low, __shfl_down_sync(0xffffffffu, low, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(out, top);
        atomicMin(out + 1, low);
    }
}

// Phase C's band of weighted sums as float64.
extern "C" __global__ void band_to_double(const u128* __restrict__ in, long long n, int scale,
                                          double* __restrict__ out) {
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += (long long)gridDim.x * blockDim.x)
        out[q] = to_double(in[q], scale);
}

// The exits' values as four 32-bit limbs (list ranking sums each exactly in 64-bit words), and back.
extern "C" __global__ void to_limbs(const u128* __restrict__ v, int m, long long* __restrict__ limbs) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < m; k += gridDim.x * blockDim.x) {
        limbs[k] = (long long)(v[k].lo & 0xffffffffull);
        limbs[(long long)m + k] = (long long)(v[k].lo >> 32);
        limbs[2ll * m + k] = (long long)(v[k].hi & 0xffffffffull);
        limbs[3ll * m + k] = (long long)(v[k].hi >> 32);
    }
}

extern "C" __global__ void from_limbs(const long long* __restrict__ limbs, int m, u128* __restrict__ v) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < m; k += gridDim.x * blockDim.x) {
        const unsigned long long l0 = limbs[k], l1 = limbs[(long long)m + k], l2 = limbs[2ll * m + k],
                                 l3 = limbs[3ll * m + k];  // each < 2^63
        u128 t = u128(l0) + u128(l1 << 32, l1 >> 32) + u128(0ull, l2) + u128(0ull, l3 << 32);
        v[k] = t;
    }
}

// The value of an outside donor in phase C: the final value of that exit of its tile.
template <typename ACC>
__device__ __forceinline__ ACC exit_total(const short* term_rank, const int* offset, const ACC* total, int R2, int C2,
                                          int w, int ntc) {
    return total[offset[(R2 / TS) * ntc + C2 / TS] + term_rank[(long long)R2 * w + C2]];
}

// Phases A (FINAL = 0) and C (FINAL = 1) of the module comment, one TS x TS tile a block. ACC:
// unsigned long long (counts, weights unused) or u128 (weights, as q(w) at ``scale``). A writes term_rank (every
// cell: the rank in its tile of the exit its in-tile path reaches, -1 if the path ends in the
// tile), the exits' values and local cell numbers at slots tile * MAXE + rank, and exit_count; C
// reads the exits' final values total[offset[tile] + rank] for the donors outside the tile and
// writes out (v, or s without the cell itself). err[0] counts valid cells never finished (codes
// on a cycle). The grid's blocks are the tiles from tile0 on; out holds the rows from row0 on (C
// can run a band of tile rows at a time into a band-sized out).
// Counts: by doubling along the in-tile paths (V_{k+1}(c) = V_k(c) + the V_k of the cells 2^k
// steps upstream, scattered by shared-memory atomics; at most log2(TS * TS) rounds, every lane
// busy; integer sums, so any order gives the same bits). Weights: rounds of Kahn's algorithm in
// the tile (a cell is summed once its donors are all done; rounds = the longest in-tile path: no
// 128-bit shared-memory atomics for the doubling). (Walks from the cells without donors, the last
// donor carrying on, as the CPU does, leave most lanes of a warp waiting for its longest walk.)
template <typename ACC, int WEIGHTED, int FINAL>
__global__ void __launch_bounds__(TS * BY)
acc_tile(const unsigned char* __restrict__ code, const double* __restrict__ weights, int h, int w,
         short* __restrict__ term_rank, const int* __restrict__ offset, const ACC* __restrict__ total,
         ACC* __restrict__ exit_val, short* __restrict__ exit_loc, int* __restrict__ exit_count,
         ACC* __restrict__ out, int include_self, unsigned long long* err, int tile0, int row0, int scale) {
    __shared__ unsigned char sc[HS][HS];
    __shared__ ACC sacc[2][TS * TS];
    __shared__ int pend[TS * TS];  // walks: donors left; doubling: two short pointer arrays
    __shared__ short snext[TS * TS];
    __shared__ short srank[TS * TS];
    __shared__ int wsum[BY];
    const int ntc = (w + TS - 1) / TS;
    const int tile = tile0 + blockIdx.x;
    const int tr = tile / ntc, tc = tile - (tile / ntc) * ntc;
    const long long band = (long long)row0 * w;  // out holds the rows from row0 on (C: a band of tile rows)
    for (int i = threadIdx.y; i < HS; i += BY) {
        for (int j = threadIdx.x; j < HS; j += TS) {
            const int R = tr * TS + i - 1, C = tc * TS + j - 1;
            sc[i][j] = (R >= 0 && R < h && C >= 0 && C < w) ? code[(long long)R * w + C] : NODATA_CODE;
        }
    }
    __syncthreads();
    const int j = threadIdx.x;
    unsigned long long left = 0;
    const ACC* fin = sacc[0];  // the finished values v
    if constexpr (!WEIGHTED) {
        ACC* V = sacc[0];
        ACC* V2 = sacc[1];
        short* P = reinterpret_cast<short*>(pend);
        short* P2 = P + TS * TS;
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            const int i = threadIdx.y + BY * m, l = i * TS + j;
            const int d = sc[i + 1][j + 1];
            int p = -1;
            if (d < 8) {
                const int i2 = i + DR[d], j2 = j + DC[d];
                if (i2 >= 0 && i2 < TS && j2 >= 0 && j2 < TS && sc[i2 + 1][j2 + 1] != NODATA_CODE) p = i2 * TS + j2;
            }
            P[l] = (short)p;
            ACC seed = d == NODATA_CODE ? (ACC)0 : (ACC)1;
            if (FINAL && d != NODATA_CODE) {
                for (int k = 0; k < 8; ++k) {
                    const int i2 = i + DR[k], j2 = j + DC[k];
                    if ((i2 < 0 || i2 >= TS || j2 < 0 || j2 >= TS) && sc[i2 + 1][j2 + 1] == (k ^ 4))
                        seed += exit_total(term_rank, offset, total, tr * TS + i2, tc * TS + j2, w, ntc);
                }
            }
            V[l] = seed;
        }
        __syncthreads();
        for (int round = 0; round <= 10; ++round) {  // paths in a tile: < 2^10 steps
#pragma unroll
            for (int m = 0; m < TS / BY; ++m) V2[(threadIdx.y + BY * m) * TS + j] = V[(threadIdx.y + BY * m) * TS + j];
            __syncthreads();
            bool any = false;
#pragma unroll
            for (int m = 0; m < TS / BY; ++m) {
                const int l = (threadIdx.y + BY * m) * TS + j;
                const int p = P[l];
                if (p >= 0) {
                    atomicAdd(&V2[p], V[l]);
                    P2[l] = P[p];
                    any = true;
                } else {
                    P2[l] = -1;
                }
            }
            any = __syncthreads_or(any);
            ACC* tv = V; V = V2; V2 = tv;
            short* tp = P; P = P2; P2 = tp;
            if (!any) break;
        }
        fin = V;
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            const int i = threadIdx.y + BY * m, l = i * TS + j;
            const int R = tr * TS + i, C = tc * TS + j;
            left += P[l] >= 0;  // still a successor after 2^10 steps: a cycle
            if (FINAL && R < h && C < w) {
                const bool ok = sc[i + 1][j + 1] != NODATA_CODE;
                out[(long long)R * w + C - band] = ok ? (include_self ? V[l] : V[l] - (ACC)1) : (ACC)0;
            }
        }
    } else {
        ACC* V = sacc[0];
        unsigned done = 0;  // bit m: cell (threadIdx.y + BY * m, j) is summed (or nodata)
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            const int i = threadIdx.y + BY * m;
            int n = 0;
            for (int d = 0; d < 8; ++d) {
                const int i2 = i + DR[d], j2 = j + DC[d];
                n += i2 >= 0 && i2 < TS && j2 >= 0 && j2 < TS && sc[i2 + 1][j2 + 1] == (d ^ 4);
            }
            pend[i * TS + j] = n;
            if (sc[i + 1][j + 1] == NODATA_CODE) {
                done |= 1u << m;
                const int R = tr * TS + i, C = tc * TS + j;
                if (FINAL && R < h && C < w) out[(long long)R * w + C - band] = (ACC)0;
            }
        }
        __syncthreads();
        for (int round = 0; round <= TS * TS; ++round) {  // a cell a round at least: a cycle stops it
            unsigned ready = 0;
#pragma unroll
            for (int m = 0; m < TS / BY; ++m)
                if (!(done >> m & 1u) && pend[(threadIdx.y + BY * m) * TS + j] == 0) ready |= 1u << m;
            __syncthreads();  // the round's ready cells fixed before any of them is summed
            done |= ready;
#pragma unroll 1
            for (int m = 0; m < TS / BY; ++m) {
                if (!(ready >> m & 1u)) continue;
                const int ci = threadIdx.y + BY * m, cj = j;
                const long long g = (long long)(tr * TS + ci) * w + tc * TS + cj;
                ACC s = (ACC)0;
#pragma unroll 1
                for (int d = 0; d < 8; ++d) {
                    const int i2 = ci + DR[d], j2 = cj + DC[d];
                    if (sc[i2 + 1][j2 + 1] != (d ^ 4)) continue;
                    if (i2 >= 0 && i2 < TS && j2 >= 0 && j2 < TS) s += V[i2 * TS + j2];
                    else if (FINAL) s += exit_total(term_rank, offset, total, tr * TS + i2, tc * TS + j2, w, ntc);
                }
                const ACC v = s + quantize(weights[g], scale);
                V[ci * TS + cj] = v;
                if (FINAL) out[g - band] = include_self ? v : s;
                const int d = sc[ci + 1][cj + 1];
                if (d < 8) {
                    const int i2 = ci + DR[d], j2 = cj + DC[d];
                    if (i2 >= 0 && i2 < TS && j2 >= 0 && j2 < TS && sc[i2 + 1][j2 + 1] != NODATA_CODE)
                        atomicSub(&pend[i2 * TS + j2], 1);
                }
            }
            if (!__syncthreads_or(ready != 0)) break;
        }
        left += (TS / BY) - __popc(done);
    }
    if (left) atomicAdd(err, left);
    if (FINAL) return;
    // exits, ranked in the order (m, threadIdx.y, threadIdx.x); snext: the next cell in the tile
    // (itself at the path's end in the tile)
    int base = 0;
    const unsigned lane_lt = (1u << threadIdx.x) - 1u;
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = threadIdx.y + BY * m, l = i * TS + j;
        const int d = sc[i + 1][j + 1];
        bool exit = false;
        int nxt = l;
        if (d < 8) {
            const int i2 = i + DR[d], j2 = j + DC[d];
            const bool inside = i2 >= 0 && i2 < TS && j2 >= 0 && j2 < TS;
            if (sc[i2 + 1][j2 + 1] != NODATA_CODE) {
                if (inside) nxt = i2 * TS + j2;
                else exit = true;
            }
        }
        snext[l] = (short)nxt;
        const unsigned ballot = __ballot_sync(0xffffffffu, exit);
        if (threadIdx.x == 0) wsum[threadIdx.y] = __popc(ballot);
        __syncthreads();
        int off = base, all = 0;
        for (int k = 0; k < BY; ++k) {
            off += k < threadIdx.y ? wsum[k] : 0;
            all += wsum[k];
        }
        srank[l] = exit ? (short)(off + __popc(ballot & lane_lt)) : (short)-1;
        base += all;
        __syncthreads();
    }
    bool moving = true;
    for (int round = 0; moving && (1 << round) < TS * TS; ++round) {  // pointer jumping to each path's end
        short got[TS / BY];
        bool moved = false;
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) {
            const short a = snext[(threadIdx.y + BY * m) * TS + j];
            got[m] = snext[a];
            moved = moved || got[m] != a;
        }
        moving = __syncthreads_or(moved);
#pragma unroll
        for (int m = 0; m < TS / BY; ++m) snext[(threadIdx.y + BY * m) * TS + j] = got[m];
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < TS / BY; ++m) {
        const int i = threadIdx.y + BY * m, l = i * TS + j;
        const int R = tr * TS + i, C = tc * TS + j;
        if (R >= h || C >= w) continue;
        term_rank[(long long)R * w + C] = srank[snext[l]];
        const int r = srank[l];
        if (r >= 0) {
            exit_val[(long long)tile * MAXE + r] = fin[l];
            exit_loc[(long long)tile * MAXE + r] = (short)l;
        }
    }
    if (threadIdx.x == 0 && threadIdx.y == 0) exit_count[tile] = base;
}

// Phase B's forest: exit k = offset[tile] + rank gets its tile-local value and its parent, the exit
// its target's in-tile path reaches (-1: the path ends in that tile).
template <typename ACC>
__global__ void reduce_links(const unsigned char* __restrict__ code, int h, int w, const short* __restrict__ term_rank,
                             const int* __restrict__ offset, const int* __restrict__ exit_count,
                             const ACC* __restrict__ exit_val, const short* __restrict__ exit_loc, long long slots,
                             int* __restrict__ parent, ACC* __restrict__ val) {
    const int ntc = (w + TS - 1) / TS;
    for (long long s = blockIdx.x * (long long)blockDim.x + threadIdx.x; s < slots; s += (long long)gridDim.x * blockDim.x) {
        const int tile = (int)(s / MAXE), r = (int)(s - (s / MAXE) * MAXE);
        if (r >= exit_count[tile]) continue;
        const int k = offset[tile] + r, l = exit_loc[s];
        const int R = (tile / ntc) * TS + l / TS, C = (tile % ntc) * TS + l % TS;
        const int d = code[(long long)R * w + C];
        const int R2 = R + DR[d], C2 = C + DC[d];
        const int r2 = term_rank[(long long)R2 * w + C2];
        parent[k] = r2 >= 0 ? offset[(R2 / TS) * ntc + C2 / TS] + r2 : -1;
        val[k] = exit_val[s];
    }
}

// The Euler tour of the exits' forest as a successor list (down(k) = 2k, up(k) = 2k + 1; the
// children of k: first_child / next_sib) with value val[k] at down(k), 0 at up(k).
template <typename V>
__global__ void euler_links(const int* __restrict__ parent, const int* __restrict__ first_child,
                            const int* __restrict__ next_sib, const V* __restrict__ val, int m,
                            int* __restrict__ succ, V* __restrict__ tour_val) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < m; k += gridDim.x * blockDim.x) {
        const int fc = first_child[k], ns = next_sib[k], p = parent[k];
        succ[2 * k] = fc >= 0 ? 2 * fc : 2 * k + 1;
        succ[2 * k + 1] = ns >= 0 ? 2 * ns : (p >= 0 ? 2 * p + 1 : -1);
        tour_val[2 * k] = val[k];
        tour_val[2 * k + 1] = (V)0;
    }
}
