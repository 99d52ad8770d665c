// Grid SSSP, phase 1 on the GPU (Gerritsen 2012, ch. 5; docs/ARCHITECTURE.md#sssp-index-pipeline).
//
// One thread block per c x c cluster, one thread per boundary cell of the cluster: each thread
// runs Dijkstra from its boundary cell over the cluster's cells, with the selection done by a
// scan of the cluster (O(n^2) for n = c^2 cells: no heap, no divergence in the data structure,
// and for c <= 16 the scan is cheaper than a heap's pointer chasing). The cluster's values sit in
// shared memory, the threads' tentative distances in shared memory laid out cell-major
// (dist[cell * T + thread]) so that a warp's accesses hit consecutive banks.
// Output: out_d[q][s][t] (float32), the distance from boundary cell s to boundary cell t of
// cluster q, and out_v[q][t], the value of boundary cell t -- the layout of the CPU kernel.
// Weight kinds as in terrain_io/weights.py: 1 absdiff, 2 surface, 3 cell, 4 walk (grid.cuh).

#define INF __longlong_as_double(0x7ff0000000000000LL)

__device__ __forceinline__ int boundary_count(int h, int w) {
    return (h <= 2 || w <= 2) ? h * w : 2 * (h + w) - 4;
}

__device__ __forceinline__ int local_index(int i, int j, int h, int w) {
    if (i == 0) return j;
    if (j == w - 1) return w - 1 + i;
    if (i == h - 1) return w - 1 + h - 1 + (w - 1 - j);
    if (j == 0) return 2 * (w - 1) + h - 1 + (h - 1 - i);
    return -1;
}

__device__ __forceinline__ void position(int t, int h, int w, int* i, int* j) {
    if (t < w) { *i = 0; *j = t; }
    else if (t < w + h - 1) { *i = t - (w - 1); *j = w - 1; }
    else if (t < 2 * (w - 1) + h) { *i = h - 1; *j = (w - 1) - (t - (w - 1) - (h - 1)); }
    else { *i = (h - 1) - (t - 2 * (w - 1) - (h - 1)); *j = 0; }
}

#include "grid.cuh"

extern "C" __global__ void sssp_boundary_phase(const double* __restrict__ vals, int H, int W, int c, int kind,
                                               const double* __restrict__ steps, float* __restrict__ out_d,
                                               double* __restrict__ out_v, int mc) {
    extern __shared__ double sh[];
    const int q = blockIdx.x;
    const int a = q / mc, b = q - (q / mc) * mc;
    const int r0 = a * c, c0 = b * c;
    const int h = min(c, H - r0), w = min(c, W - c0);
    const int n = h * w;
    const int T = blockDim.x;
    const int B = 4 * c - 4;
    double* sv = sh;          // n values
    double* dist = sh + c * c; // n x T distances
    for (int i = threadIdx.x; i < n; i += T) sv[i] = vals[(long long)(r0 + i / w) * W + c0 + i % w];
    __syncthreads();
    const int nb = boundary_count(h, w);
    for (int t = threadIdx.x; t < nb; t += T) {
        int i, j;
        position(t, h, w, &i, &j);
        out_v[(long long)q * B + t] = sv[i * w + j];
    }
    const int s = threadIdx.x;
    if (s >= nb) return;
    int si, sj;
    position(s, h, w, &si, &sj);
    if (isnan(sv[si * w + sj])) return;
    int targets = 0;
    for (int t = 0; t < nb; ++t) {
        int i, j;
        position(t, h, w, &i, &j);
        targets += !isnan(sv[i * w + j]);
    }
    for (int i = 0; i < n; ++i) dist[i * T + s] = INF;
    dist[(si * w + sj) * T + s] = 0.0;
    unsigned long long done[4] = {0ULL, 0ULL, 0ULL, 0ULL};  // n <= 256
    float* row = out_d + ((long long)q * B + s) * B;
    while (targets > 0) {
        int best = -1;
        double bd = INF;
        for (int i = 0; i < n; ++i) {
            double d = dist[i * T + s];
            if (d < bd && !((done[i >> 6] >> (i & 63)) & 1ULL)) { bd = d; best = i; }
        }
        if (best < 0) break;
        done[best >> 6] |= 1ULL << (best & 63);
        const int bi = best / w, bj = best - (best / w) * w;
        const int t = local_index(bi, bj, h, w);
        if (t >= 0) { row[t] = (float)bd; --targets; }
        const double x = sv[best];
        for (int k = 0; k < 8; ++k) {
            const int ii = bi + DR[k], jj = bj + DC[k];
            if (ii < 0 || ii >= h || jj < 0 || jj >= w) continue;
            const int p = ii * w + jj;
            const double y = sv[p];
            if (isnan(y) || ((done[p >> 6] >> (p & 63)) & 1ULL)) continue;
            const double nd = bd + sssp_edge_weight(kind, x, y, steps[k]);
            if (nd < dist[p * T + s]) dist[p * T + s] = nd;
        }
    }
}

#ifdef FINAL_CLUSTER
// Grid SSSP, phase 3 on the GPU: one thread per cluster of at most FINAL_CLUSTER^2 cells, the
// exact port of the CPU's final_phase + cluster_dijkstra (terrain_io/grid/_sssp_cpu.py): the same
// seeds, the same lazy-deletion binary heap with (distance, root rank) keys, the same push and
// pop order, so distances and predecessor codes are bit-identical to the CPU's. The heap lives in
// local memory (8 entries a cell + 8, as on the CPU).
#define FN (FINAL_CLUSTER * FINAL_CLUSTER)
#define FCAP (8 * FN + 8)

__device__ __forceinline__ bool key_less(double ka, long long ra, double kb, long long rb) {
    return ka < kb || (ka == kb && ra < rb);
}

__device__ __forceinline__ int heap_push(double* hk, long long* hr, int* hv, int n, double k, long long r, int v) {
    int i = n;
    while (i > 0) {
        const int p = (i - 1) >> 1;
        if (!key_less(k, r, hk[p], hr[p])) break;
        hk[i] = hk[p]; hr[i] = hr[p]; hv[i] = hv[p];
        i = p;
    }
    hk[i] = k; hr[i] = r; hv[i] = v;
    return n + 1;
}

__device__ __forceinline__ int heap_pop(double* hk, long long* hr, int* hv, int n) {
    n -= 1;
    const double k = hk[n];
    const long long r = hr[n];
    const int v = hv[n];
    int i = 0;
    while (true) {
        int ch = 2 * i + 1;
        if (ch >= n) break;
        if (ch + 1 < n && key_less(hk[ch + 1], hr[ch + 1], hk[ch], hr[ch])) ch += 1;
        if (!key_less(hk[ch], hr[ch], k, r)) break;
        hk[i] = hk[ch]; hr[i] = hr[ch]; hv[i] = hv[ch];
        i = ch;
    }
    if (n > 0) { hk[i] = k; hr[i] = r; hv[i] = v; }
    return n;
}

// vals: H x W (a shard, origin on the cluster grid); mDist/mRank/mHow/mSet: (rows of clusters, MC, B)
// merge results; sources in shard coordinates; out_d (float32) and out_p (uint8): H x W.
extern "C" __global__ void sssp_final_phase(const double* __restrict__ vals, int H, int W, int c, int kind,
                                            const double* __restrict__ steps, const double* __restrict__ mDist,
                                            const long long* __restrict__ mRank, const unsigned char* __restrict__ mHow,
                                            const bool* __restrict__ mSet, int MC, int B,
                                            const long long* __restrict__ src_r, const long long* __restrict__ src_c,
                                            int nsrc, float* __restrict__ out_d, unsigned char* __restrict__ out_p) {
    const int mr = (H + c - 1) / c, mc = (W + c - 1) / c;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= mr * mc) return;
    const int a = q / mc, b = q - (q / mc) * mc;
    const int r0 = a * c, c0 = b * c;
    const int h = min(c, H - r0), w = min(c, W - c0);
    double dist[FN];
    long long root[FN];
    unsigned char pred[FN];
    bool fixed[FN];
    double hk[FCAP];
    long long hr[FCAP];
    int hv[FCAP];
    for (int p = 0; p < h * w; ++p) {
        dist[p] = INF; root[p] = 0x7fffffffffffffffLL; pred[p] = 255; fixed[p] = false;
    }
    bool any_seed = false;
    const long long cl = ((long long)a * MC + b) * B;
    const int nb = boundary_count(h, w);
    for (int t = 0; t < nb; ++t) {
        const unsigned char hw = mHow[cl + t];
        if (mSet[cl + t] && hw < 8) {
            int i, j;
            position(t, h, w, &i, &j);
            const int p = i * w + j;
            dist[p] = mDist[cl + t]; root[p] = mRank[cl + t]; pred[p] = hw; fixed[p] = true;
            any_seed = true;
        }
    }
    for (int k = 0; k < nsrc; ++k) {
        const long long i = src_r[k] - r0, j = src_c[k] - c0;
        if (0 <= i && i < h && 0 <= j && j < w) {
            const int p = (int)(i * w + j);
            dist[p] = 0.0; root[p] = -1; pred[p] = 255; fixed[p] = true;
            any_seed = true;
        }
    }
    if (any_seed) {
        int n = 0;
        for (int p = 0; p < h * w; ++p)
            if (dist[p] < INF) n = heap_push(hk, hr, hv, n, dist[p], root[p], p);
        while (n > 0) {
            const double d = hk[0];
            const long long r = hr[0];
            const int p = hv[0];
            n = heap_pop(hk, hr, hv, n);
            if (d != dist[p] || r != root[p]) continue;  // stale entry
            const int i = p / w, j = p - (p / w) * w;
            const double x = vals[(long long)(r0 + i) * W + c0 + j];
            for (int k = 0; k < 8; ++k) {
                const int ii = i + DR[k], jj = j + DC[k];
                if (ii < 0 || ii >= h || jj < 0 || jj >= w) continue;
                const int pp = ii * w + jj;
                if (fixed[pp]) continue;
                const double y = vals[(long long)(r0 + ii) * W + c0 + jj];
                if (isnan(y)) continue;
                const double nd = d + sssp_edge_weight(kind, x, y, steps[k]);
                if (key_less(nd, r, dist[pp], root[pp])) {
                    dist[pp] = nd; root[pp] = r; pred[pp] = (unsigned char)((k + 4) & 7);
                    n = heap_push(hk, hr, hv, n, nd, r, pp);
                }
            }
        }
    }
    for (int i = 0; i < h; ++i)
        for (int j = 0; j < w; ++j) {
            const long long o = (long long)(r0 + i) * W + c0 + j;
            const double x = vals[o];
            out_d[o] = isnan(x) ? __int_as_float(0x7fc00000) : (float)dist[i * w + j];
            out_p[o] = pred[i * w + j];
        }
}
#endif
