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

// The rank 0..3 of forward direction d in the order of the larger endpoint's id (E, SW, S, SE):
// edge codes (lo cell * 4 + rank) then order a tile's edges as (smaller id, larger id).
__constant__ int DIR_TO_RANK[4] = {0, 3, 2, 1};
#endif
