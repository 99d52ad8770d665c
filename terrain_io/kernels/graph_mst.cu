// Borůvka minimum spanning forest on the GPU (in the manner of Vineet et al. 2009 and
// Gerritsen 2012's tile phase), used by terrain_io/graph/mst.py. Edges are pre-sorted in the strict order
// (weight, min id, max id, edge id), so an edge's position r in that order is its key: the lightest
// edge leaving a component is an atomicMin over 32-bit positions, ties cannot occur and every run
// gives the same forest. su/sv: endpoints of the edge at position r; comp: each vertex's component
// (a root vertex id, fully compressed after every round).

#define NONE 0xffffffffu

// For every active edge joining two components, offer its position to both components.
extern "C" __global__ void boruvka_lightest(const unsigned* act, long long m, const int* su, const int* sv,
                                            const int* comp, unsigned* best) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m; i += (long long)gridDim.x * blockDim.x) {
        unsigned r = act[i];
        int cu = comp[su[r]], cv = comp[sv[r]];
        if (cu != cv) { atomicMin(&best[cu], r); atomicMin(&best[cv], r); }
    }
}

// Every root with a lightest edge hooks onto the component at its other end and marks the edge.
// Two components that chose the same edge form the only possible cycle (positions are distinct);
// the smaller id stays the root. Writes parent only for this root, reads best only.
extern "C" __global__ void boruvka_hook(int n, const int* su, const int* sv, const int* comp, const unsigned* best,
                                        int* parent, unsigned char* in_forest) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    unsigned r = best[c];
    if (r == NONE || comp[c] != c) return;
    int cu = comp[su[r]], cv = comp[sv[r]];
    int other = (cu == c) ? cv : cu;
    in_forest[r] = 1;
    if (!(best[other] == r && c < other)) parent[c] = other;
}

// One pointer-jumping step over the hook forest; *changed is set while any pointer moved.
extern "C" __global__ void pointer_jump(int n, int* parent, int* changed) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    int p = parent[c], g = parent[p];
    if (p != g) { parent[c] = g; *changed = 1; }
}

// comp[v] = root of v's old component (parent is fully jumped).
extern "C" __global__ void relabel(int n, int* comp, const int* parent) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v < n) comp[v] = parent[comp[v]];
}

// keep[i] = 1 while active edge i still joins two components (stream compaction happens in CuPy).
extern "C" __global__ void crossing(const unsigned* act, long long m, const int* su, const int* sv, const int* comp,
                                    unsigned char* keep) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m; i += (long long)gridDim.x * blockDim.x) {
        unsigned r = act[i];
        keep[i] = comp[su[r]] != comp[sv[r]];
    }
}

// Filter-Kruskal's filter (Osipov, Sanders & Singler 2009): keep edges whose endpoints lie in
// different trees; root[] is the host union-find, fully path-compressed before the upload.
extern "C" __global__ void filter_crossing(long long m, const int* lo, const int* hi, const int* root,
                                           unsigned char* keep) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m; i += (long long)gridDim.x * blockDim.x)
        keep[i] = root[lo[i]] != root[hi[i]];
}
