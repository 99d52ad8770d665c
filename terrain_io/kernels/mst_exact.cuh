// The exact weight sum of an MST kernel: _mst_cpu._add_exact's superaccumulator, (2, N_EXP) int64
// buckets, one pair per binary exponent. Inlined by terrain_io.backend.kernel_source
// ('#include "mst_exact.cuh"'); needs the typedefs i64 and u64.

#define N_EXP 2200       // _mst_cpu.N_EXP
#define EXP_OFFSET 1100  // _mst_cpu.EXP_OFFSET
#define LO_BITS 26       // _mst_cpu._LO_BITS

// A thread's running share of the exact sum: one exponent at a time (neighbouring cells mostly
// share it), flushed into the block's shared buckets when the exponent changes.
struct ExactAcc {
    int e;
    i64 hi, lo;
};

__device__ __forceinline__ void acc_flush(ExactAcc& acc, i64* s_buckets) {
    if (acc.hi != 0) atomicAdd((u64*)&s_buckets[acc.e + EXP_OFFSET], (u64)acc.hi);
    if (acc.lo != 0) atomicAdd((u64*)&s_buckets[N_EXP + acc.e + EXP_OFFSET], (u64)acc.lo);
    acc.hi = 0;
    acc.lo = 0;
}

// _mst_cpu._add_exact: w = mant * 2**(e - 53), mant split into (hi << 26) + lo.
__device__ __forceinline__ void acc_add(ExactAcc& acc, i64* s_buckets, double w) {
    if (w == 0.0) return;
    int e;
    double m = frexp(w, &e);
    i64 mant = (i64)(m * 9007199254740992.0);  // m * 2**53: exact
    i64 hi = mant >> LO_BITS;
    i64 lo = mant - (hi << LO_BITS);
    if (e != acc.e) {
        acc_flush(acc, s_buckets);
        acc.e = e;
    }
    acc.hi += hi;
    acc.lo += lo;
}
