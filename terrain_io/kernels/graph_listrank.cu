// List ranking / list scan kernels (CuPy RawModule), used by terrain_io/graph/listrank.py.
//
// Every kernel computes an inclusive *prefix* along the list: out[i] = v[head] op ... op v[i].
// Templates: I = index type (int or long long), V = value type, OP = 0 sum, 1 min, 2 max,
// UNIT = 1 when every value is 1 (list ranking: the value array is never read).
//
// Helman-JaJa sparse ruling set (Helman & JaJa 1999; Rehman, Kothapalli, Narayanan, ICS'09,
// Algorithm 3 "RHJ"): splitters = every element i with i % stride == 0 plus every head. The
// element link word encodes both the successor and whether the element is a splitter, so a walk
// reads ONE word per step (the paper packs rank and successor into 64 bits for the same reason):
//   link >= 0   successor of a non-splitter
//   link == -1  tail, non-splitter
//   link <= -2  splitter whose successor is -3 - link (-1: it is a tail)

template <typename V, int OP>
__device__ __forceinline__ V combine(V a, V b) {
    if (OP == 0) return a + b;
    if (OP == 1) return b < a ? b : a;
    return b > a ? b : a;
}

// One 64-bit word (owner << 32 | bits of the local prefix) per element when I and V are 4 bytes:
// the walk then makes one random write per element instead of two.
template <typename V>
__device__ __forceinline__ unsigned long long pack_cell(unsigned owner, V x) {
    union { V v; unsigned u; } c;
    c.v = x;
    return ((unsigned long long)owner << 32) | c.u;
}
template <typename V>
__device__ __forceinline__ V cell_value(unsigned long long cell) {
    union { V v; unsigned u; } c;
    c.u = (unsigned)(cell & 0xffffffffULL);
    return c.v;
}

template <typename I, typename V, int UNIT>
__device__ __forceinline__ V value_at(const V* __restrict__ val, I j) {
    if (UNIT) return (V)1;
    return val[j];
}

// pred[succ[i]] = i (pred preset to -1). Duplicated successors are caught by lr_check.
template <typename I>
__global__ void lr_pred(const I* __restrict__ succ, I n, I* __restrict__ pred) {
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I s = succ[i];
        if (s >= 0 && s < n) pred[s] = i;
    }
}

// Validation without a second random pass: counts[0] += elements with a successor, counts[1] +=
// elements with a predecessor (after lr_pred), counts[2] += successors out of range. Two elements
// sharing a successor leave counts[1] < counts[0].
template <typename I>
__global__ void lr_check(const I* __restrict__ succ, const I* __restrict__ pred, I n,
                         unsigned long long* counts) {
    unsigned long long has_succ = 0, has_pred = 0, bad = 0;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I s = succ[i];
        has_succ += (s >= 0);
        has_pred += (pred[i] >= 0);
        bad += (s >= n || s < -1);
    }
    if (has_succ) atomicAdd(counts, has_succ);
    if (has_pred) atomicAdd(counts + 1, has_pred);
    if (bad) atomicAdd(counts + 2, bad);
}

// Build link words and the splitter table. Regular splitters (i % stride == 0) get id i / stride;
// heads that are not regular get ids from an atomic counter starting at n_regular.
template <typename I>
__global__ void lr_link(const I* __restrict__ next, const I* __restrict__ prev, I n, I stride,
                        I n_regular, I* __restrict__ link, I* __restrict__ spl_id,
                        I* __restrict__ spl_elem, unsigned long long* counter) {
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I s = next[i];
        bool regular = (i % stride) == 0;
        bool head = prev[i] < 0;
        if (regular || head) {
            I id = regular ? i / stride : n_regular + (I)atomicAdd(counter, 1ULL);
            spl_id[i] = id;
            spl_elem[id] = i;
            link[i] = -3 - s;
        } else {
            link[i] = s;
        }
    }
}

// Local ranking phase: one thread walks the sublist of one splitter, writing the local inclusive
// prefix and the owning sublist of every element (separately, or packed in one word when PACK);
// the sublist's total, successor sublist and (for the successor) predecessor sublist form the
// reduced list.
template <typename I, typename V, int OP, int UNIT, int PACK>
__global__ void lr_walk(const I* __restrict__ link, const V* __restrict__ val,
                        const I* __restrict__ spl_id, const I* __restrict__ spl_elem, I n_spl,
                        V* __restrict__ local, I* __restrict__ owner,
                        unsigned long long* __restrict__ cells, V* __restrict__ sub_val,
                        I* __restrict__ sub_next, I* __restrict__ sub_prev,
                        unsigned long long* covered) {
    I t = blockIdx.x * (I)blockDim.x + threadIdx.x;
    if (t >= n_spl) return;
    I s = spl_elem[t];
    V acc = value_at<I, V, UNIT>(val, s);
    if (PACK) cells[s] = pack_cell<V>((unsigned)t, acc);
    else { local[s] = acc; owner[s] = t; }
    unsigned long long count = 1;
    I j = -3 - link[s];
    while (j >= 0) {
        I l = link[j];
        if (l <= -2) break;          // j starts another sublist
        acc = combine<V, OP>(acc, value_at<I, V, UNIT>(val, j));
        if (PACK) cells[j] = pack_cell<V>((unsigned)t, acc);
        else { local[j] = acc; owner[j] = t; }
        count++;
        j = l;
    }
    sub_val[t] = acc;
    if (j >= 0) {
        I k = spl_id[j];
        sub_next[t] = k;
        sub_prev[k] = t;
    } else {
        sub_next[t] = -1;
    }
    atomicAdd(covered, count);
}

// Recombination: out[i] = (prefix of the sublists before i's sublist) op local[i].
template <typename I, typename V, int OP, int PACK>
__global__ void lr_finish(const V* __restrict__ local, const I* __restrict__ owner,
                          const unsigned long long* __restrict__ cells,
                          const I* __restrict__ sub_prev, const V* __restrict__ sub_prefix, I n,
                          V* __restrict__ out) {
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I o;
        V x;
        if (PACK) {
            unsigned long long c = cells[i];
            o = (I)(c >> 32);
            x = cell_value<V>(c);
        } else {
            o = owner[i];
            x = local[i];
        }
        I p = sub_prev[o];
        out[i] = p >= 0 ? combine<V, OP>(sub_prefix[p], x) : x;
    }
}

// One round of Wyllie pointer jumping (pulling from predecessors, double-buffered):
// val2[i] = val[prev[i]] op val[i], prev2[i] = prev[prev[i]]; active[0] counts unfinished elements.
template <typename I, typename V, int OP>
__global__ void lr_wyllie_round(const I* __restrict__ prev, const V* __restrict__ val, I n,
                                I* __restrict__ prev2, V* __restrict__ val2,
                                unsigned long long* active) {
    unsigned long long local_active = 0;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I p = prev[i];
        V x = val[i];
        if (p >= 0) {
            x = combine<V, OP>(val[p], x);
            p = prev[p];
            local_active += (p >= 0);
        }
        val2[i] = x;
        prev2[i] = p;
    }
    if (local_active) atomicAdd(active, local_active);
}

// Base case of the recursion: the reduced list fits one block (n <= 2 * blockDim.x); Wyllie
// pointer jumping in shared memory, each thread owning elements tid and tid + blockDim.x.
// ok[0] = 0 when a cycle kept pointers alive after ceil(log2 n) + 1 rounds.
template <typename I, typename V, int OP>
__global__ void lr_block_wyllie(const I* __restrict__ prev_in, const V* __restrict__ val_in, int n,
                                V* __restrict__ out, int* ok) {
    extern __shared__ unsigned char smem[];
    V* sval = reinterpret_cast<V*>(smem);
    int* sprev = reinterpret_cast<int*>(sval + 2 * blockDim.x);
    __shared__ int alive;
    int a = threadIdx.x, b = threadIdx.x + blockDim.x;
    if (a < n) { sval[a] = val_in[a]; sprev[a] = (int)prev_in[a]; }
    if (b < n) { sval[b] = val_in[b]; sprev[b] = (int)prev_in[b]; }
    int rounds = 1;
    while ((1 << rounds) < n) rounds++;
    rounds += 1;
    __syncthreads();
    for (int r = 0; r < rounds; r++) {
        V xa = (V)0, xb = (V)0;
        int pa = -1, pb = -1;
        if (a < n) {
            pa = sprev[a]; xa = sval[a];
            if (pa >= 0) { xa = combine<V, OP>(sval[pa], xa); pa = sprev[pa]; }
        }
        if (b < n) {
            pb = sprev[b]; xb = sval[b];
            if (pb >= 0) { xb = combine<V, OP>(sval[pb], xb); pb = sprev[pb]; }
        }
        __syncthreads();
        if (a < n) { sval[a] = xa; sprev[a] = pa; }
        if (b < n) { sval[b] = xb; sprev[b] = pb; }
        __syncthreads();
    }
    if (threadIdx.x == 0) alive = 0;
    __syncthreads();
    if ((a < n && sprev[a] >= 0) || (b < n && sprev[b] >= 0)) alive = 1;
    __syncthreads();
    if (a < n) out[a] = sval[a];
    if (b < n) out[b] = sval[b];
    if (threadIdx.x == 0) ok[0] = alive ? 0 : 1;
}
