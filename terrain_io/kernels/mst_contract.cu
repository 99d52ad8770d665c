// Contraction of the tiles' spanning forests on the GPU (grid MST, tile phase, second half).
//
// Gerritsen 2012, part II ch. 2-3 (after Haverkort 2012; docs/ARCHITECTURE.md#mst-pipeline): in each tile's
// spanning forest, dead ends --
// leaves that are not on the tile boundary -- are removed repeatedly (their edges are final), and
// every path of non-boundary degree-2 vertices becomes one super-edge keyed by its maximum edge
// (strict order: weight, then edge code). The output is exactly that of the numba reference
// ``terrain_io.grid._mst_cpu.contract_tile``: the same vertices and super-edges in the same order,
// and the same exact weight sum of the forest (superaccumulator buckets).
//
// One thread block per tile (many tiles per launch); inside the tile:
//  1. every cell builds its forest adjacency (8 direction bits) from the forward bits of the
//     bitmask, its boundary mask ``outm`` (neighbours outside the tile that may be vertices) and
//     adds its forward edges' weights to the exact sum;
//  2. parallel leaf pruning in rounds: the current non-boundary leaves each remove their one edge;
//     an edge is claimed by an atomicAnd on the forward bit in its smaller cell's word, so two
//     leaves sharing an edge remove it once; a vertex whose degree falls from 2 to 1 joins the next
//     round's queue. Removing non-terminal leaves until none is left has one fixpoint (the union
//     of the minimal subtrees spanning each tree's boundary vertices), whatever the order, so the
//     result is that of the sequential stack in ``contract_tile``;
//  3. kept vertices (valid, and on the boundary or of degree >= 3) are numbered in row-major
//     order by a block-wide ordered compaction (warp ballots + a scan of the warp counts);
//  4. one thread per (kept vertex, direction) slot walks its path to the next kept vertex,
//     keeping the maximum edge; the walk from the smaller cell id emits the super-edge;
//  5. an ordered compaction of the slots (vertex rank, then direction 0..7) writes the edges in
//     the order of ``contract_tile``.
//
// Compile-time options: VAL_T (the elevation type), KIND (0 = max, 1 = absdiff; see
// terrain_io/weights.py). Launch: one block of BLOCK (1024) threads per tile.

typedef unsigned long long u64;
typedef long long i64;

#define BLOCK 1024

#include "grid.cuh"
#include "mst_exact.cuh"

// Block-wide exclusive scan of one flag per thread (all BLOCK threads must call it together).
// Returns the thread's position among the set flags; *total: their number.
__device__ __forceinline__ int block_rank(bool flag, int* s_warp, int* s_excl, int* s_total, int* total) {
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) s_warp[wid] = __popc(ballot);
    __syncthreads();
    if (wid == 0) {
        int x = s_warp[lane];  // BLOCK / 32 == 32 warps
        int incl = x;
        for (int off = 1; off < 32; off <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        s_excl[lane] = incl - x;
        if (lane == 31) *s_total = incl;
    }
    __syncthreads();
    *total = *s_total;
    return s_excl[wid] + __popc(ballot & ((1u << lane) - 1u));
}

__device__ __forceinline__ void push(int* queue, int* s_tail, int cell) {
    queue[atomicAdd(s_tail, 1)] = cell;
}

// The kernel's arguments in three structs passed by value, each all 8-byte members in this order
// (terrain_io/grid/_mst_gpu.py packs them with backend.kernel_struct).
// The batch: vals, valid (H x W cells, row-major); bits, the forests (bit d: edge to the neighbour
// in forward direction d = E, SE, S, SW); tiles (n, 4), i0, j0, h, w of each tile, one block each;
// gr0, gc0, the global cell of batch cell (0, 0); rows, cols, the DEM's shape; T, the tile size;
// cap, the entries of a tile's output rows.
struct ContractBatch {
    const VAL_T* vals;
    const unsigned char* valid;
    const unsigned char* bits;
    const i64* tiles;
    i64 gr0, gc0, rows, cols, T, H, W, cap;
};
// Scratch: alive (H*W, the forest adjacency still standing), outm (H*W, the boundary masks), queue
// (n*T*T, the leaves), vcell (n*cap, the kept vertices' cells); per (kept vertex, direction) slot,
// n*cap*8 each: sflag (emits a super-edge), sother (its far end), sw (its weight), scode (its code).
struct ContractScratch {
    unsigned* alive;
    unsigned char* outm;
    int* queue;
    int* vcell;
    unsigned char* sflag;
    i64* sother;
    double* sw;
    i64* scode;
};
// Output rows of cap entries per tile, as _mst_cpu.TileGraphs; buckets (2, N_EXP) summed.
struct ContractOut {
    i64* nv_out;
    i64* vid;
    double* vh;
    unsigned char* vmask;
    i64* ne_out;
    i64* eu;
    i64* ev;
    double* ew;
    i64* ecode;
    u64* buckets;
};

extern "C" __global__ void __launch_bounds__(BLOCK)
contract_tiles(const ContractBatch in, const ContractScratch scratch, const ContractOut out) {
    const VAL_T* __restrict__ vals = in.vals;
    const unsigned char* __restrict__ valid = in.valid;
    const unsigned char* __restrict__ bits = in.bits;
    const i64* __restrict__ tiles = in.tiles;
    const int T = (int)in.T, H = (int)in.H, W = (int)in.W, cap = (int)in.cap;
    const i64 gr0 = in.gr0, gc0 = in.gc0, rows = in.rows, cols = in.cols;
    unsigned* alive = scratch.alive;
    unsigned char* outm = scratch.outm;
    int* queue = scratch.queue;
    int* vcell = scratch.vcell;
    unsigned char* sflag = scratch.sflag;
    i64* sother = scratch.sother;
    double* sw = scratch.sw;
    i64* scode = scratch.scode;
    i64 *nv_out = out.nv_out, *vid = out.vid, *ne_out = out.ne_out, *eu = out.eu, *ev = out.ev, *ecode = out.ecode;
    double *vh = out.vh, *ew = out.ew;
    unsigned char* vmask = out.vmask;
    u64* buckets = out.buckets;
    __shared__ i64 s_buckets[2 * N_EXP];
    __shared__ int s_warp[32], s_excl[32], s_total;
    __shared__ int s_tail, s_lo, s_hi;

    const int tid = threadIdx.x;
    const int t = blockIdx.x;
    const int i0 = (int)tiles[4 * t], j0 = (int)tiles[4 * t + 1];
    const int h = (int)tiles[4 * t + 2], w = (int)tiles[4 * t + 3];
    const int hw = h * w;
    int* q = queue + (i64)t * T * T;
    const i64 obase = (i64)t * cap;

    for (int k = tid; k < 2 * N_EXP; k += BLOCK) s_buckets[k] = 0;
    if (tid == 0) {
        s_tail = 0;
        s_hi = 0;
    }
    __syncthreads();

    // 1. adjacency, boundary mask, exact weight sum, the first leaves
    ExactAcc acc = {0, 0, 0};
    for (int l = tid; l < hw; l += BLOCK) {
        const int i = l / w, j = l % w;
        const i64 v = (i64)(i0 + i) * W + (j0 + j);
        const unsigned b = bits[v];
        unsigned a = b & 0xFu;
        for (int d = 4; d < 8; ++d) {
            const int ii = i + DR[d], jj = j + DC[d];
            if (ii >= 0 && ii < h && jj >= 0 && jj < w && ((bits[v + (i64)DR[d] * W + DC[d]] >> (d - 4)) & 1u))
                a |= 1u << d;
        }
        if (b & 0xFu) {
            const double hv = to_double(vals[v]);
            for (int d = 0; d < 4; ++d)
                if ((b >> d) & 1u) acc_add(acc, s_buckets, edge_weight(hv, to_double(vals[v + (i64)DR[d] * W + DC[d]])));
        }
        unsigned char m = 0;
        if (valid[v] && (i == 0 || i == h - 1 || j == 0 || j == w - 1)) {
            for (int d = 0; d < 8; ++d) {
                const int ii = i + DR[d], jj = j + DC[d];
                if (ii >= 0 && ii < h && jj >= 0 && jj < w) continue;  // inside the tile
                const int bi = i0 + ii, bj = j0 + jj;
                if (bi >= 0 && bi < H && bj >= 0 && bj < W) {
                    if (valid[(i64)bi * W + bj]) m |= (unsigned char)(1u << d);
                } else if (gr0 + bi >= 0 && gr0 + bi < rows && gc0 + bj >= 0 && gc0 + bj < cols) {
                    m |= (unsigned char)(1u << d);
                }
            }
        }
        alive[v] = a;
        outm[v] = m;
        if (__popc(a) == 1 && m == 0) push(q, &s_tail, (int)v);
    }
    acc_flush(acc, s_buckets);

    // 2. strip dead ends, round by round
    while (true) {
        __syncthreads();  // the previous round's removals and pushes are done and visible
        if (tid == 0) {
            s_lo = s_hi;
            s_hi = s_tail;
        }
        __syncthreads();
        const int lo = s_lo, hi = s_hi;
        if (lo == hi) break;
        for (int k = lo + tid; k < hi; k += BLOCK) {
            const int c = q[k];
            const unsigned a = ((volatile unsigned*)alive)[c];
            if (a == 0) continue;  // its edge went with its neighbour, a leaf of the same round
            const int d = __ffs(a) - 1;
            const int n = c + DR[d] * W + DC[d];
            int lo_c, hi_c;
            unsigned fbit, bbit;
            if (d < 4) {
                lo_c = c; hi_c = n; fbit = 1u << d; bbit = 1u << (d + 4);
            } else {
                lo_c = n; hi_c = c; fbit = 1u << (d - 4); bbit = 1u << d;
            }
            const unsigned old_lo = atomicAnd(&alive[lo_c], ~fbit);
            if (!(old_lo & fbit)) continue;  // claimed by the other end
            const unsigned old_hi = atomicAnd(&alive[hi_c], ~bbit);
            if (__popc(old_lo) == 2 && outm[lo_c] == 0) push(q, &s_tail, lo_c);
            if (__popc(old_hi) == 2 && outm[hi_c] == 0) push(q, &s_tail, hi_c);
        }
    }

    // 3. kept vertices, numbered in row-major order
    int nv = 0;
    for (int l0 = 0; l0 < hw; l0 += BLOCK) {
        const int l = l0 + tid;
        bool keep = false;
        i64 v = 0;
        if (l < hw) {
            v = (i64)(i0 + l / w) * W + (j0 + l % w);
            keep = valid[v] && (outm[v] != 0 || __popc(alive[v]) >= 3);
        }
        int total;
        const int pos = nv + block_rank(keep, s_warp, s_excl, &s_total, &total);
        if (keep && pos < cap) {
            const i64 gi = gr0 + v / W, gj = gc0 + v % W;
            vid[obase + pos] = gi * cols + gj;
            vh[obase + pos] = to_double(vals[v]);
            vmask[obase + pos] = outm[v];
            vcell[obase + pos] = (int)v;
        }
        nv += total;
    }
    if (nv > cap) nv = cap;  // impossible (at most 8T - 8), but never write past the rows
    __syncthreads();

    // 4. walks: slot (r, d0) follows the path leaving kept vertex r in direction d0
    const i64 sbase = obase * 8;
    for (int k = tid; k < 8 * nv; k += BLOCK) {
        const int r = k >> 3, d0 = k & 7;
        const int c0 = vcell[obase + r];
        unsigned char flag = 0;
        if ((alive[c0] >> d0) & 1u) {
            int pi = c0 / W, pj = c0 % W;
            int d = d0;
            int ci = pi + DR[d], cj = pj + DC[d];
            double best_w = 0.0;
            i64 best_c = -1;
            for (int steps = 0; steps <= hw; ++steps) {  // a path has fewer than hw edges
                const i64 pc = (i64)pi * W + pj, cc = (i64)ci * W + cj;
                const double wgt = edge_weight(to_double(vals[pc]), to_double(vals[cc]));
                const i64 code = d < 4 ? ((gr0 + pi) * cols + (gc0 + pj)) * 4 + DIR_TO_RANK[d]
                                       : ((gr0 + ci) * cols + (gc0 + cj)) * 4 + DIR_TO_RANK[d - 4];
                if (best_c < 0 || best_w < wgt || (best_w == wgt && best_c < code)) {
                    best_w = wgt;
                    best_c = code;
                }
                const unsigned ac = alive[cc];
                if (outm[cc] != 0 || __popc(ac) >= 3) break;
                const unsigned rest = ac & ~(1u << ((d + 4) & 7));
                if (rest == 0) break;  // impossible after stripping
                const int d2 = __ffs(rest) - 1;
                pi = ci;
                pj = cj;
                ci += DR[d2];
                cj += DC[d2];
                d = d2;
            }
            const i64 other = (gr0 + ci) * cols + (gc0 + cj);
            if (vid[obase + r] < other) {
                flag = 1;
                sother[sbase + k] = other;
                sw[sbase + k] = best_w;
                scode[sbase + k] = best_c;
            }
        }
        sflag[sbase + k] = flag;
    }
    __syncthreads();

    // 5. super-edges in slot order
    int ne = 0;
    for (int k0 = 0; k0 < 8 * nv; k0 += BLOCK) {
        const int k = k0 + tid;
        const bool emit = k < 8 * nv && sflag[sbase + k];
        int total;
        const int pos = ne + block_rank(emit, s_warp, s_excl, &s_total, &total);
        if (emit && pos < cap) {
            eu[obase + pos] = vid[obase + (k >> 3)];
            ev[obase + pos] = sother[sbase + k];
            ew[obase + pos] = sw[sbase + k];
            ecode[obase + pos] = scode[sbase + k];
        }
        ne += total;
    }
    if (tid == 0) {
        nv_out[t] = nv;
        ne_out[t] = ne < cap ? ne : cap;
    }
    for (int k = tid; k < 2 * N_EXP; k += BLOCK)
        if (s_buckets[k] != 0) atomicAdd(&buckets[k], (u64)s_buckets[k]);
}
