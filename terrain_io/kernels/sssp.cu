// Grid SSSP, phase 1 on the GPU (terrain thesis ch. 5; DESIGN.md "SSSP pipeline").
//
// One thread block per c x c cluster, one thread per boundary cell of the cluster: each thread
// runs Dijkstra from its boundary cell over the cluster's cells, with the selection done by a
// scan of the cluster (O(n^2) for n = c^2 cells: no heap, no divergence in the data structure,
// and for c <= 16 the scan is cheaper than a heap's pointer chasing). The cluster's values sit in
// shared memory, the threads' tentative distances in shared memory laid out cell-major
// (dist[cell * T + thread]) so that a warp's accesses hit consecutive banks.
// Output: out_d[q][s][t] (float32), the distance from boundary cell s to boundary cell t of
// cluster q, and out_v[q][t], the value of boundary cell t -- the layout of the CPU kernel.
// Weight kinds as in terrain_io/weights.py: 1 absdiff, 2 surface, 3 cell.

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

__device__ __forceinline__ double edge_weight(int kind, double a, double b, double step) {
    if (kind == 2) return sqrt(step * step + (a - b) * (a - b));
    if (kind == 3) return (a + b) * 0.5 * step;
    return fabs(a - b);
}

__constant__ int DR[8] = {0, 1, 1, 1, 0, -1, -1, -1};
__constant__ int DC[8] = {1, 1, 0, -1, -1, -1, 0, 1};

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
            const double nd = bd + edge_weight(kind, x, y, steps[k]);
            if (nd < dist[p * T + s]) dist[p * T + s] = nd;
        }
    }
}
