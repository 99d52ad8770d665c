// Connected-components kernels (CuPy RawModule), used by terrain_io/graph/components.py.
// Invariant of every kernel: parent[x] <= x, so the parent pointers never form a cycle and the
// root of every tree is the smallest vertex id of its tree.

// Shiloach-Vishkin style conditional hooking (Yogaratnam 2010, sec. 4.2.4, kernel SV2): for every edge
// whose endpoints lie in different stars, the root of the larger label is hooked under the smaller.
template <typename I>
__global__ void sv_hook(const I* __restrict__ u, const I* __restrict__ v, long long m,
                        I* __restrict__ parent, int* changed) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < m;
         e += (long long)gridDim.x * blockDim.x) {
        I pu = parent[u[e]], pv = parent[v[e]];
        if (pu == pv) continue;
        I hi = pu > pv ? pu : pv, lo = pu > pv ? pv : pu;
        if (parent[hi] == hi) {        // hi is a root: hook it (racing writers all write smaller ids)
            parent[hi] = lo;
            *changed = 1;
        }
    }
}

// Short-cutting to stars (Yogaratnam 2010, kernels SV1/SV4, run to completion in one launch): every vertex
// follows its parent chain to the root. Concurrent updates only shorten chains.
template <typename I>
__global__ void compress(I* parent, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        I r = parent[i];
        I next = parent[r];
        if (next == r) continue;
        while (next != r) { r = next; next = ((volatile I*)parent)[r]; }
        parent[i] = r;
    }
}

// Union-find root with path halving (ECL-CC's "intermediate pointer jumping").
template <typename I>
__device__ __forceinline__ I find_root(I* parent, I v) {
    volatile I* p = parent;
    I cur = p[v];
    if (cur != v) {
        I prev = v, next;
        while (cur > (next = p[cur])) {
            p[prev] = next;
            prev = cur;
            cur = next;
        }
    }
    return cur;
}

__device__ __forceinline__ int cas(int* p, int expected, int value) {
    return atomicCAS(p, expected, value);
}
__device__ __forceinline__ long long cas(long long* p, long long expected, long long value) {
    return (long long)atomicCAS((unsigned long long*)p, (unsigned long long)expected,
                                (unsigned long long)value);
}

// ECL-CC style hooking (Jaiganesh & Burtscher, HPDC'18): lock-free union by atomicCAS of the larger
// representative's parent from itself to the smaller one; on failure continue from the value the
// CAS returned (a smaller ancestor), so every edge finishes in a bounded number of steps.
template <typename I>
__global__ void uf_hook(const I* __restrict__ u, const I* __restrict__ v, long long m, I* parent) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < m;
         e += (long long)gridDim.x * blockDim.x) {
        I a = u[e], b = v[e];
        if (a == b) continue;
        I ra = find_root(parent, a), rb = find_root(parent, b);
        while (ra != rb) {
            if (ra < rb) { I t = ra; ra = rb; rb = t; }     // now ra > rb: hook ra under rb
            I old = cas(&parent[ra], ra, rb);
            if (old == ra) break;
            ra = old;
        }
    }
}
