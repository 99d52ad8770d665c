// Watersheds, basins, stream links and HAND on the GPU (terrain_io/grid/hydro/_gpu.py); the
// definitions are the CPU kernels' (terrain_io/grid/hydro/_cpu.py), the codes
// terrain_io/grid/flow/codes.py's.
//
// Every result is a value carried from the roots of a forest of cells to its trees: each cell's
// parent pointer (the flow forest: its downstream cell; the link forest: its one stream donor) is
// jumped to its root, par[k] = par[par[k]], until no pointer moves (Wyllie's pointer jumping:
// log2 of the longest chain rounds; in place, as a read of a pointer already jumped only skips
// further). A root points at itself, and so does every cell outside the forest (nodata, cells off
// the network): no sentinel value, so the pointers are 32-bit words up to 2^32 cells (P = unsigned
// int; long long beyond), 4 bytes a cell. The values then overwrite the pointers in place: the
// roots' first (their numbers, written by the host), then every other cell's (resolve, gather,
// hand_values), which reads only its own pointer and its root's entry (never rewritten).

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

// The flow forest's parent of k: its downstream cell; k itself at nodata, at terminal cells and at
// seeded cells (seed may be null).
__device__ __forceinline__ long long flow_parent(const unsigned char* code, const unsigned char* seed, long long h,
                                                 long long w, long long k) {
    if (code[k] == NODATA_CODE || (seed && seed[k])) return k;
    long long t = downstream(code, h, w, k);
    return t < 0 ? k : t;
}

// The link forest's parent of k: its one stream donor when it has exactly one (a stream cell with
// none or several is a link's head, a root); k itself off the network.
__device__ __forceinline__ long long link_parent(const unsigned char* code, const bool* stream, long long h,
                                                 long long w, long long k) {
    if (!stream[k]) return k;
    long long r = k / w, c = k % w, only = -1;
    int donors = 0;
    for (int e = 0; e < 8; ++e) {
        long long r2 = r + DR[e], c2 = c + DC[e];
        if (r2 < 0 || r2 >= h || c2 < 0 || c2 >= w) continue;
        long long t = r2 * w + c2;
        if (stream[t] && code[t] == (e ^ 4)) { ++donors; only = t; }
    }
    return donors == 1 ? only : k;
}

template <typename P>
__global__ void flow_parents(const unsigned char* code, const unsigned char* seed, long long h, long long w, P* par) {
    GRID_STRIDE(k, h * w) par[k] = (P)flow_parent(code, seed, h, w, k);
}

template <typename P>
__global__ void link_parents(const unsigned char* code, const bool* stream, long long h, long long w, P* par) {
    GRID_STRIDE(k, h * w) par[k] = (P)link_parent(code, stream, h, w, k);
}

template <typename P>
__global__ void jump(P* par, long long n, int* moved) {
    int any = 0;
    GRID_STRIDE(k, n) {
        P p = par[k];
        P q = par[p];
        if (q != p) { par[k] = q; any = 1; }
    }
    if (any) *moved = 1;
}

// The roots among cells start .. start + n - 1 of the jumped forest: a member (member[k] != absent:
// the codes for the flow forest, the stream mask for the link forest) pointing at itself.
template <typename P>
__global__ void roots_in(const P* par, const unsigned char* member, unsigned char absent, long long start,
                         long long n, bool* root) {
    GRID_STRIDE(i, n) {
        long long k = start + i;
        root[i] = par[k] == (P)k && member[k] != absent;
    }
}

// Every cell's value, in place, once the roots hold theirs: a root keeps it (a root is known by its
// parent rule, as its pointer now holds its value), another member takes its root's, a cell
// outside the forest 0. link = 0: the flow forest (mark: its seeds, or null; seeded, only the
// seeds' values count, the other roots give 0), 1: the link forest (mark: the stream mask). out
// may be par itself (P = unsigned int).
template <typename P>
__global__ void resolve(P* par, const unsigned char* code, const unsigned char* mark, int link, long long h,
                        long long w, unsigned int* out) {
    GRID_STRIDE(k, h * w) {
        bool member = link ? mark[k] != 0 : code[k] != NODATA_CODE;
        long long p = link ? link_parent(code, (const bool*)mark, h, w, k) : flow_parent(code, mark, h, w, k);
        long long r = p == k ? k : (long long)par[k];
        bool keep = member && (link || !mark || mark[r]);
        out[k] = keep ? (unsigned int)par[r] : 0u;
    }
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

// The stream mask in place: reached (accumulation >= threshold) at a valid cell.
extern "C" __global__ void on_network(const unsigned char* code, bool* reached, long long n) {
    GRID_STRIDE(k, n) reached[k] = reached[k] && code[k] != NODATA_CODE;
}

// HAND where the cell's root (par, the flow forest seeded at the stream cells) is a stream cell (a
// link id > 0): its elevation minus the root's (float64, rounded to float32: the CPU's arithmetic)
// and the root's link; elsewhere the host's NaN bits and link 0. In place: height may be par's
// words (P = unsigned int), drainage link's (a root's link is rewritten with its own value only).
template <typename T, typename P>
__global__ void hand_values(const P* par, const T* z, unsigned int* link, long long n, float* height,
                            unsigned int* drainage) {
    GRID_STRIDE(k, n) {
        long long p = (long long)par[k];
        unsigned int id = link[p];
        height[k] = id ? (float)((double)z[k] - (double)z[p]) : __int_as_float(0x7fc00000);
        drainage[k] = id;
    }
}
