// Breadth-first search kernels (CuPy RawModule), used by terrain_io/graph/bfs.py.
// depth: int, -1 = not reached. parent: index type I, -1 for the source and unreached vertices.

// Append `item` to out[] for every lane with `take`, one atomicAdd per warp. Every thread of the
// block must call it (the kernels below launch exactly one thread per work item, no early exit).
template <typename I>
__device__ __forceinline__ void warp_append(bool take, I item, I* out, unsigned long long* count) {
    unsigned mask = __ballot_sync(0xffffffffu, take);
    int lane = threadIdx.x & 31;
    unsigned long long base = 0;
    if (lane == 0 && mask) base = atomicAdd(count, (unsigned long long)__popc(mask));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) out[base + __popc(mask & ((1u << lane) - 1u))] = item;
}

// The project's naive BFS (BFSNaiveKernel): every edge, every level.
template <typename I>
__global__ void bfs_naive(const I* __restrict__ u, const I* __restrict__ v, long long m, int* depth,
                          I* parent, int level, int* changed) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < m;
         e += (long long)gridDim.x * blockDim.x) {
        I a = u[e], b = v[e];
        if (depth[a] == level && depth[b] == -1) {
            depth[b] = level + 1;     // every writer writes the same depth
            parent[b] = a;            // any writer is a valid parent
            *changed = 1;
        }
    }
}

// Top-down step, linear work (the project's "optimised" BFS): offs is the inclusive prefix sum of
// the frontier vertices' degrees; thread k gathers the k-th neighbour slot (binary search for its
// frontier vertex, as getNextFrontierBS) and filters visited vertices and duplicates by claiming
// the vertex with atomicCAS on its depth; the winners are compacted into the next frontier.
template <typename I>
__global__ void bfs_expand(const I* __restrict__ indptr, const I* __restrict__ indices,
                           const I* __restrict__ frontier, const long long* __restrict__ offs,
                           long long f, long long total, int* depth, I* parent, int level,
                           I* next, unsigned long long* next_count) {
    long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    bool take = false;
    I w = 0;
    if (k < total) {
        long long lo = 0, hi = f - 1;
        while (lo < hi) {
            long long mid = (lo + hi) >> 1;
            if (offs[mid] > k) hi = mid; else lo = mid + 1;
        }
        I src = frontier[lo];
        long long start = lo ? offs[lo - 1] : 0;
        w = indices[(long long)indptr[src] + (k - start)];
        if (depth[w] == -1 && atomicCAS(&depth[w], -1, level + 1) == -1) {
            parent[w] = src;
            take = true;
        }
    }
    warp_append<I>(take, w, next, next_count);
}

// Top-down step for frontiers of high mean degree: one warp per frontier vertex, the lanes read its
// neighbour list coalesced (no binary search); same claim-by-atomicCAS filter and compaction.
template <typename I>
__global__ void bfs_expand_warp(const I* __restrict__ indptr, const I* __restrict__ indices,
                                const I* __restrict__ frontier, long long f, int* depth, I* parent,
                                int level, I* next, unsigned long long* next_count) {
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long long i = warp; i < f; i += n_warps) {            // warp-uniform
        I src = frontier[i];
        long long start = indptr[src], end = indptr[src + 1];
        for (long long e = start + lane; e - lane < end; e += 32) {   // warp-uniform trip count
            bool take = false;
            I w = 0;
            if (e < end) {
                w = indices[e];
                if (depth[w] == -1 && atomicCAS(&depth[w], -1, level + 1) == -1) {
                    parent[w] = src;
                    take = true;
                }
            }
            warp_append<I>(take, w, next, next_count);
        }
    }
}

// Bottom-up step (Beamer et al., SC'12) for symmetric graphs: every unvisited vertex looks for a
// neighbour in the current frontier (depth == level) and stops at the first one.
template <typename I>
__global__ void bfs_bottom_up(const I* __restrict__ indptr, const I* __restrict__ indices,
                              long long n, int* depth, I* parent, int level, I* next,
                              unsigned long long* next_count) {
    long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    bool take = false;
    if (v < n && depth[v] == -1) {
        long long end = indptr[v + 1];
        for (long long e = indptr[v]; e < end; e++) {
            I w = indices[e];
            if (depth[w] == level) {
                parent[v] = w;
                take = true;
                break;
            }
        }
        if (take) depth[v] = level + 1;
    }
    warp_append<I>(take, (I)v, next, next_count);
}
