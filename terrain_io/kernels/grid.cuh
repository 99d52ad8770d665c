// The 8-neighbourhood of the grid kernels (the numba kernels' weights.DR / weights.DC, in the same
// order): direction d = 0..7 is E, SE, S, SW, W, NW, N, NE; d and d ^ 4 are opposite, and
// d < 4 are the forward directions (towards the larger cell id in row-major order).
// Inlined into a kernel's source by terrain_io.backend.kernel_source ('#include "grid.cuh"').

__constant__ int DR[8] = {0, 1, 1, 1, 0, -1, -1, -1};
__constant__ int DC[8] = {1, 1, 0, -1, -1, -1, 0, 1};

#ifdef KIND
// The MST weight models in float64 (terrain_io/weights.py: 0 = max, 1 = absdiff), arguments in
// the order of the numba code (the sign of a zero maximum depends on it).
__device__ __forceinline__ double edge_weight(double a, double b) {
#if KIND == 0
    return a >= b ? a : b;
#else
    return fabs(a - b);
#endif
}

// An elevation as a double, exactly: CuPy compiles every kernel with -ftz=true, which flushes a float32
// subnormal to zero in any float operation or conversion (ties that are not, weights lost from the
// exact sum), so a float's subnormal is built from its integer bits (m * 2**-149, exact in double).
__device__ __forceinline__ double to_double(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7F800000u) || !(u & 0x007FFFFFu)) return (double)x;  // normal, zero, inf: never flushed
    const double d = (double)(u & 0x007FFFFFu) * 0x1p-149;
    return (u >> 31) ? -d : d;
}
template <typename T>
__device__ __forceinline__ double to_double(T x) {
    return (double)x;
}

// The rank 0..3 of forward direction d in the order of the larger endpoint's id (E, SW, S, SE):
// edge codes (lo cell * 4 + rank) then order a tile's edges as (smaller id, larger id).
__constant__ int DIR_TO_RANK[4] = {0, 3, 2, 1};
#endif

// The SSSP weight models in float64 (terrain_io/weights.py: 1 absdiff, 2 surface, 3 cell, 4 walk, 5 walk_friction),
// edge a -> b (walk is directed). walk's exp is weights.portable_exp line for line: the same
// literals and operations (compiled with --fmad=false), so the same bits as numba.
__device__ __forceinline__ double portable_exp(double x) {
    if (x > 709.0) return __longlong_as_double(0x7ff0000000000000LL);
    const double k = floor(x * 0x1.71547652b82fep+0 + 0.5);
    const double r = (x - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
    const double c[12] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26,
                          0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
                          0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
                          0x1.5555555555555p-5,  0x1.5555555555555p-3,  0x1.0000000000000p-1};
    double p = c[0];
#pragma unroll
    for (int i = 1; i < 12; ++i) p = p * r + c[i];
    p = (p * r + 1.0) * r + 1.0;
    return ldexp(p, (int)k);
}

__device__ __forceinline__ double walk_time(double a, double b, double step) {
    return step * 0.6 * portable_exp(3.5 * fabs((b - a) / step + 0.05));
}

// walk_friction's values: the float32 elevation in the high half of the double, the friction in
// the low half (weights.pack_walk_friction)
__device__ __forceinline__ double packed_high(double x) {
    return (double)__int_as_float((int)(__double_as_longlong(x) >> 32));
}
__device__ __forceinline__ double packed_low(double x) {
    return (double)__int_as_float((int)(__double_as_longlong(x) & 0xFFFFFFFFLL));
}

__device__ __forceinline__ double sssp_edge_weight(int kind, double a, double b, double step) {
    if (kind == 2) return sqrt(step * step + (a - b) * (a - b));
    if (kind == 3) return (a + b) * 0.5 * step;
    if (kind == 4) return walk_time(a, b, step);
    if (kind == 5) return walk_time(packed_high(a), packed_high(b), step) * ((packed_low(a) + packed_low(b)) * 0.5);
    return fabs(a - b);
}
