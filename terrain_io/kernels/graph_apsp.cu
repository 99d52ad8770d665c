// All-pairs shortest paths on the GPU: tiled min-plus product and the phases of blocked
// Floyd-Warshall (Venkataraman, Sahni & Mukhopadhyaya 2003; Padamata & Raveendran 2013,
// "Blocked Floyd Warshall Algorithm"). Loaded by terrain_io/graph/apsp.py through CuPy RawModule.
//
// T is float, double or int. Integer matrices use a saturating "infinity" INF_I = 2^30 - 1:
// stored values never exceed it, so a + b never overflows int32 and the Hopper DPX instruction
// __viaddmin_s32 (min(a + b, c) in one instruction) needs no guard. Python maps results >= INF_I/2
// back to "no path" (it checks that |weights| * n stays far below that).

#define INF_I 1073741823

template <typename T> struct Lim;
template <> struct Lim<float>  { __device__ static float  inf() { return __int_as_float(0x7f800000); } };
template <> struct Lim<double> { __device__ static double inf() { return __longlong_as_double(0x7ff0000000000000LL); } };
template <> struct Lim<int>    { __device__ static int    inf() { return INF_I; } };

// Four consecutive elements (16-byte aligned for float/int) from shared memory in as few loads as possible.
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
    float4 q = *reinterpret_cast<const float4*>(p); v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void load4(const int* p, int (&v)[4]) {
    int4 q = *reinterpret_cast<const int4*>(p); v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void load4(const double* p, double (&v)[4]) {
    double2 q = *reinterpret_cast<const double2*>(p); double2 r = *reinterpret_cast<const double2*>(p + 2);
    v[0] = q.x; v[1] = q.y; v[2] = r.x; v[3] = r.y;
}

// acc = min(acc, a + b); integers through the DPX instruction (native on sm_90, emulated elsewhere).
__device__ __forceinline__ void addmin(float& acc, float a, float b) { acc = fminf(acc, a + b); }
__device__ __forceinline__ void addmin(double& acc, double a, double b) { acc = fmin(acc, a + b); }
__device__ __forceinline__ void addmin(int& acc, int a, int b) { acc = __viaddmin_s32(a, b, acc); }

// C = min(C, A (x) B) over the min-plus semiring, C: M x N, A: M x K, B: K x N (row-major, leading
// dimensions lda/ldb/ldc; M, N multiples of TILE, K a multiple of BK). 256 threads per block
// compute one TILE x TILE block of C; each thread an (TILE/16) x (TILE/16) register tile made of
// 4 x 4 pieces 64 rows/columns apart, so that the shared-memory reads are 16-byte vectors without
// bank conflicts. A block whose row tile is skip_r or column tile is skip_c does nothing (the
// panels of blocked Floyd-Warshall). With PRED, PC[i,j] = PB[k*,j] where k* improved C[i,j]
// strictly; the new predecessors are read before any is written, so B and C may be one panel.
template <typename T, int TILE, int BK, bool PRED>
__device__ void minplus_update(T* __restrict__ C, int* __restrict__ PC, const T* __restrict__ A,
                               const T* __restrict__ B, const int* __restrict__ PB,
                               int K, int lda, int ldb, int ldc, int skip_r, int skip_c) {
    constexpr int R = TILE / 16;   // rows (= columns) per thread
    constexpr int PAD = 16 / sizeof(T) > 0 ? 16 / (int)sizeof(T) : 1;
    if ((int)blockIdx.y == skip_r || (int)blockIdx.x == skip_c) return;
    __shared__ __align__(16) T As[BK][TILE + PAD];   // A tile, transposed: As[k][i]
    __shared__ __align__(16) T Bs[BK][TILE];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, tid = threadIdx.x;
    const long i0 = (long)blockIdx.y * TILE, j0 = (long)blockIdx.x * TILE;
    T acc[R][R];
    int kbest[PRED ? R : 1][PRED ? R : 1];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < R; ++c) {
            acc[r][c] = Lim<T>::inf();
            if (PRED) kbest[r][c] = -1;
        }
    for (int k0 = 0; k0 < K; k0 += BK) {
        // A tile: each thread reads 4 consecutive k of one row (coalesced), stores them transposed.
        for (int q = tid; q < TILE * BK / 4; q += 256) {
            int row = q / (BK / 4), kk = (q % (BK / 4)) * 4;
            const T* src = A + (i0 + row) * lda + k0 + kk;
#pragma unroll
            for (int u = 0; u < 4; ++u) As[kk + u][row] = src[u];
        }
        for (int q = tid; q < TILE * BK / 4; q += 256) {
            int kk = q / (TILE / 4), col = (q % (TILE / 4)) * 4;
            const T* src = B + (long)(k0 + kk) * ldb + j0 + col;
#pragma unroll
            for (int u = 0; u < 4; ++u) Bs[kk][col + u] = src[u];
        }
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < BK; ++k) {
            T a[R], b[R];
#pragma unroll
            for (int h = 0; h < R / 4; ++h) {
                T va[4], vb[4];
                load4(&As[k][h * 64 + ty * 4], va);
                load4(&Bs[k][h * 64 + tx * 4], vb);
#pragma unroll
                for (int u = 0; u < 4; ++u) { a[h * 4 + u] = va[u]; b[h * 4 + u] = vb[u]; }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int c = 0; c < R; ++c) {
                    if (PRED) {
                        T s = a[r] + b[c];
                        if (s < acc[r][c]) { acc[r][c] = s; kbest[r][c] = k0 + k; }
                    } else {
                        addmin(acc[r][c], a[r], b[c]);
                    }
                }
        }
        __syncthreads();
    }
    int newp[PRED ? R : 1][PRED ? R : 1];
    if (PRED) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int c = 0; c < R; ++c) {
                long i = i0 + (r / 4) * 64 + ty * 4 + (r % 4), j = j0 + (c / 4) * 64 + tx * 4 + (c % 4);
                newp[r][c] = (kbest[r][c] >= 0 && acc[r][c] < C[i * ldc + j]) ? PB[(long)kbest[r][c] * ldb + j] : -2;
            }
        __syncthreads();   // every predecessor is read before any is overwritten
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < R; ++c) {
            long i = i0 + (r / 4) * 64 + ty * 4 + (r % 4), j = j0 + (c / 4) * 64 + tx * 4 + (c % 4);
            if (PRED) {
                if (newp[r][c] != -2) { C[i * ldc + j] = acc[r][c]; PC[i * ldc + j] = newp[r][c]; }
            } else {
                T old = C[i * ldc + j];
                if (acc[r][c] < old) C[i * ldc + j] = acc[r][c];
            }
        }
}

#define MINPLUS(NAME, T, TILE, BK, PRED)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                              \
        T* C, int* PC, const T* A, const T* B, const int* PB, int K, int lda, int ldb, int ldc,          \
        int skip_r, int skip_c) {                                                                        \
        minplus_update<T, TILE, BK, PRED>(C, PC, A, B, PB, K, lda, ldb, ldc, skip_r, skip_c);          \
    }

MINPLUS(minplus_f32_128, float, 128, 32, false)
MINPLUS(minplus_f32_64, float, 64, 32, false)
MINPLUS(minplus_i32_128, int, 128, 32, false)
MINPLUS(minplus_i32_64, int, 64, 32, false)
MINPLUS(minplus_f64_64, double, 64, 16, false)
MINPLUS(minplus_f32_64p, float, 64, 32, true)
MINPLUS(minplus_i32_64p, int, 64, 32, true)
MINPLUS(minplus_f64_64p, double, 64, 16, true)

// Phase 1 of blocked Floyd-Warshall: plain Floyd-Warshall on the b x b diagonal tile at D (leading
// dimension ld), in shared memory (dynamic: b*b*(sizeof(T) + 4*pred) bytes), one block of 1024
// threads. Row k and column k do not change in step k (D[k,k] >= 0 without negative cycles), so
// one barrier per k suffices.
template <typename T>
__device__ void fw_tile(T* D, int* P, int b, int ld, bool pred) {
    extern __shared__ __align__(16) unsigned char smem[];
    T* S = reinterpret_cast<T*>(smem);
    int* SP = reinterpret_cast<int*>(smem + sizeof(T) * b * b);
    for (int q = threadIdx.x; q < b * b; q += blockDim.x) {
        S[q] = D[(long)(q / b) * ld + q % b];
        if (pred) SP[q] = P[(long)(q / b) * ld + q % b];
    }
    __syncthreads();
    for (int k = 0; k < b; ++k) {
        for (int q = threadIdx.x; q < b * b; q += blockDim.x) {
            int i = q / b, j = q % b;
            T s = S[i * b + k] + S[k * b + j];
            if (s < S[q]) { S[q] = s; if (pred) SP[q] = SP[k * b + j]; }
        }
        __syncthreads();
    }
    for (int q = threadIdx.x; q < b * b; q += blockDim.x) {
        D[(long)(q / b) * ld + q % b] = S[q];
        if (pred) P[(long)(q / b) * ld + q % b] = SP[q];
    }
}

extern "C" __global__ void fw_tile_f32(float* D, int* P, int b, int ld, int pred) { fw_tile<float>(D, P, b, ld, pred); }
extern "C" __global__ void fw_tile_f64(double* D, int* P, int b, int ld, int pred) { fw_tile<double>(D, P, b, ld, pred); }
extern "C" __global__ void fw_tile_i32(int* D, int* P, int b, int ld, int pred) { fw_tile<int>(D, P, b, ld, pred); }

// One step k of plain Floyd-Warshall over the whole n x n matrix (one thread per entry).
template <typename T>
__device__ void fw_step(T* D, int* P, int n, int k, bool pred) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= n || j >= n) return;
    T s = D[(long)i * n + k] + D[(long)k * n + j];
    if (s < D[(long)i * n + j]) { D[(long)i * n + j] = s; if (pred) P[(long)i * n + j] = P[(long)k * n + j]; }
}

extern "C" __global__ void fw_step_f32(float* D, int* P, int n, int k, int pred) { fw_step<float>(D, P, n, k, pred); }
extern "C" __global__ void fw_step_f64(double* D, int* P, int n, int k, int pred) { fw_step<double>(D, P, n, k, pred); }
extern "C" __global__ void fw_step_i32(int* D, int* P, int n, int k, int pred) { fw_step<int>(D, P, n, k, pred); }
