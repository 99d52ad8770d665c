// Watersheds, basins, stream links and HAND on the GPU (terrain_io/grid/hydro/_gpu.py); the
// definitions are the CPU kernels' (terrain_io/grid/hydro/_cpu.py), the codes
// terrain_io/grid/flow/codes.py's.
//
// Every result is a value carried from the roots of a forest of cells to its trees: each cell's
// parent pointer (the flow forest: its downstream cell; the link forest: its one stream donor) is
// jumped to its root, par[k] = par[par[k]], until no pointer moves (Wyllie's pointer jumping:
// log2 of the longest chain rounds; in place, as a read of a pointer already jumped only skips
// further). A root points at itself; nodata and cells off the network hold -1.

#include "grid.cuh"

#define NODATA_CODE 255
#define GRID_STRIDE(k, n) \
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < (n); k += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ long long downstream(const unsigned char* code, long long h, long long w, long long k) {
    unsigned char d = code[k];
    if (d >= 8) return -1;
    long long r = k / w + DR[d], c = k % w + DC[d];
    if (r < 0 || r >= h || c < 0 || c >= w) return -1;
    long long t = r * w + c;
    return code[t] == NODATA_CODE ? -1 : t;
}

// The flow forest: terminal and seeded cells are roots.
extern "C" __global__ void flow_parents(const unsigned char* code, const unsigned char* seed, long long h,
                                        long long w, long long* par) {
    long long n = h * w;
    GRID_STRIDE(k, n) {
        if (code[k] == NODATA_CODE) { par[k] = -1; continue; }
        long long t = seed[k] ? -1 : downstream(code, h, w, k);
        par[k] = t < 0 ? k : t;
    }
}

// The link forest: a stream cell with exactly one stream donor points at it; the others (heads) are roots.
extern "C" __global__ void link_parents(const unsigned char* code, const bool* stream, long long h, long long w,
                                        long long* par) {
    long long n = h * w;
    GRID_STRIDE(k, n) {
        if (!stream[k]) { par[k] = -1; continue; }
        long long r = k / w, c = k % w, only = -1;
        int donors = 0;
        for (int e = 0; e < 8; ++e) {
            long long r2 = r + DR[e], c2 = c + DC[e];
            if (r2 < 0 || r2 >= h || c2 < 0 || c2 >= w) continue;
            long long t = r2 * w + c2;
            if (stream[t] && code[t] == (e ^ 4)) { ++donors; only = t; }
        }
        par[k] = donors == 1 ? only : k;
    }
}

extern "C" __global__ void jump(long long* par, long long n, int* moved) {
    int any = 0;
    GRID_STRIDE(k, n) {
        long long p = par[k];
        if (p < 0) continue;
        long long q = par[p];
        if (q != p) { par[k] = q; any = 1; }
    }
    if (any) *moved = 1;
}

// Per link (index = id - 1) at its last cell: the cell, the downstream link (0 none).
extern "C" __global__ void link_ends(const unsigned char* code, const bool* stream, const unsigned int* link,
                                     long long h, long long w, long long* tail, unsigned int* down) {
    long long n = h * w;
    GRID_STRIDE(k, n) {
        if (!stream[k]) continue;
        long long t = downstream(code, h, w, k);
        bool on = t >= 0 && stream[t];
        if (on && link[t] == link[k]) continue;
        tail[link[k] - 1] = k;
        down[link[k] - 1] = on ? link[t] : 0;
    }
}

// A root of the forest: a cell whose pointer is itself.
extern "C" __global__ void is_root(const long long* par, long long n, bool* root) {
    GRID_STRIDE(k, n) root[k] = par[k] == k;
}

// The value at each cell's root (par[k] >= 0), else 0: labels, link ids.
extern "C" __global__ void gather_u32(const long long* par, const unsigned int* values, long long n,
                                      unsigned int* out) {
    GRID_STRIDE(k, n) {
        long long p = par[k];
        out[k] = p >= 0 ? values[p] : 0u;
    }
}

// HAND where the cell's root is a stream cell: its elevation minus the root's (float64, rounded to
// float32: the CPU's arithmetic) and the root's link; elsewhere the host's NaN bits and link 0.
extern "C" __global__ void hand_values(const long long* par, const double* z, const bool* stream,
                                       const unsigned int* link, long long n, float* height,
                                       unsigned int* drainage) {
    GRID_STRIDE(k, n) {
        long long p = par[k];
        if (p >= 0 && stream[p]) {
            height[k] = (float)(z[k] - z[p]);
            drainage[k] = link[p];
        } else {
            height[k] = __int_as_float(0x7fc00000);
            drainage[k] = 0u;
        }
    }
}
