// Work lists of tiles for kernels that relax TS x TS tiles in shared memory, round after round
// (sssp_incore.cu, fill.cu; the host side is terrain_io/worklist.py::WorkLists): a
// thread block of TS x BY threads per tile of the round's list; a tile whose border cells changed
// queues its neighbours for the next round, a flag per tile keeping each once.
// Inlined into a kernel's source by terrain_io.backend.kernel_source.

#define TS 32
#define BY 8
#define HS (TS + 2)

// After a tile's round: queue the neighbours next to the border cells that improved.
__device__ __forceinline__ void queue_neighbours(int (*mark)[3], int tr, int tc, int ntr, int ntc,
                                                 int* __restrict__ own_flag, int* __restrict__ next_flag,
                                                 int* __restrict__ next_work, int* __restrict__ next_count) {
    __syncthreads();
    const int t = threadIdx.y * TS + threadIdx.x;
    if (t < 9) {
        const int di = t / 3 - 1, dj = t % 3 - 1;
        const int nr = tr + di, nc = tc + dj;
        if ((di || dj) && mark[di + 1][dj + 1] && nr >= 0 && nr < ntr && nc >= 0 && nc < ntc) {
            const int nt = nr * ntc + nc;
            if (atomicExch(&next_flag[nt], 1) == 0) next_work[atomicAdd(next_count, 1)] = nt;
        }
    }
}

__device__ __forceinline__ void mark_border(int (*mark)[3], int i, int j) {
    const int di = i == 1 ? 0 : (i == TS ? 2 : 1), dj = j == 1 ? 0 : (j == TS ? 2 : 1);
    if (di != 1) mark[di][1] = 1;
    if (dj != 1) mark[1][dj] = 1;
    if (di != 1 && dj != 1) mark[di][dj] = 1;
}
