"""Zstd frames made on the GPU: NVIDIA nvCOMP's batched compressor (pip ``nvidia-libnvcomp-cu13``,
its C API ``nvcompBatchedZstdCompressAsync`` through ctypes), for the in-core GPU pipelines, whose
results are on the device before they are stored.

A band of shard rows of one array is cut into its chunks on the GPU (padded with the fill value at
the array's edge, each shard's chunks in zarr's Morton order, chunks all of fill value left out as
zarr leaves them out), compressed there in one batched call, packed end to end with each frame's
crc32c after them (computed there too) and copied to the host in one copy: the frames cross the bus
instead of the raw cells (fill's three outputs at 32768^2: 12.9 GB raw, ~3 GB of frames), and the
host's threads only write them (:func:`terrain_io.store.write_frames`: each checksum in Python, a
chunk at a time, held the GIL against the thread feeding the GPU). nvCOMP writes standard zstd frames (RFC 8878), which
numcodecs and so zarr decode: the chunks decode to the bytes the CPU's encoder stores; the frames
themselves differ (another encoder), as they would between two zstd versions.

:func:`encoder` gives None -- the bands then go the CPU's way -- where the library is not installed or
does not load, or ``TERRAIN_NVCOMP=0`` is set (to compare the two ways).

The other way, :class:`BandDecoder`: the frames of a store's chunks, read from its shard files and
checked on the host (:func:`terrain_io.store.shard_frames`: each chunk's crc32c, since nvCOMP's
decompressor trusts its input), cross the bus as they are (an eighth of the flow accumulation's
cells) and are decoded there by ``nvcompBatchedZstdDecompressAsync`` straight into the rows of the
array they belong to (:func:`terrain_io.pinned.read_device`).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import os
import sys

import numpy as np

_SUCCESS = 0
_SONAME = "libnvcomp.so.6"


class _Opts(ctypes.Structure):
    """nvcompBatchedZstdCompressOpts_t: 64 reserved bytes, zeroed (the defaults)."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _DecompressOpts(ctypes.Structure):
    """nvcompBatchedZstdDecompressOpts_t: the backend (0: nvCOMP's choice) and 60 reserved bytes, zeroed."""
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


class _Alignments(ctypes.Structure):
    """nvcompAlignmentRequirements_t."""
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


@functools.cache
def _lib():
    """libnvcomp from the ``nvidia-libnvcomp-cu13`` wheel (``nvidia/libnvcomp/lib64`` on the path),
    with the prototypes of the calls used here; None where it is not there or does not load."""
    for root in sys.path:
        path = os.path.join(root or ".", "nvidia", "libnvcomp", "lib64", _SONAME)
        if os.path.isfile(path):
            break
    else:
        return None
    try:
        lib = ctypes.CDLL(path, ctypes.RTLD_LOCAL)
    except OSError:
        return None
    size_t, ptr, p_size = ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    protos = {
        "nvcompBatchedZstdCompressGetMaxOutputChunkSize": (size_t, _Opts, p_size),
        "nvcompBatchedZstdCompressGetRequiredAlignments": (_Opts, ctypes.POINTER(_Alignments)),
        "nvcompBatchedZstdCompressGetTempSize": (size_t, size_t, _Opts, p_size, size_t, ptr),
        "nvcompBatchedZstdCompressAsync": (ptr, ptr, size_t, size_t, ptr, size_t, ptr, ptr, _Opts, ptr, ptr),
        "nvcompBatchedZstdDecompressGetRequiredAlignments": (_DecompressOpts, ctypes.POINTER(_Alignments)),
        "nvcompBatchedZstdDecompressGetTempSize": (size_t, size_t, _DecompressOpts, p_size, size_t, ptr),
        "nvcompBatchedZstdDecompressAsync": (ptr, ptr, ptr, ptr, size_t, ptr, size_t, ptr, _DecompressOpts, ptr, ptr),
    }
    for name, args in protos.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != _SUCCESS:
        raise RuntimeError(f"nvCOMP {what}: status {status}")


@functools.cache
def _pack_kernel():
    """Copy frame c (``sizes[c]`` bytes at ``slots[c]`` of ``src``) to ``offsets[c]`` of ``dst``: one
    block a frame."""
    import cupy as cp

    return cp.RawKernel(r"""
extern "C" __global__ void pack_frames(const unsigned char* __restrict__ src,
                                       const unsigned long long* __restrict__ slots,
                                       const unsigned long long* __restrict__ sizes,
                                       const unsigned long long* __restrict__ offsets,
                                       unsigned char* __restrict__ dst) {
    const unsigned char* s = src + slots[blockIdx.x];
    unsigned char* d = dst + offsets[blockIdx.x];
    const unsigned long long n = sizes[blockIdx.x];
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}
""", "pack_frames")


@functools.cache
def _crc32c_kernel():
    """The crc32c (Castagnoli, as zarr's ``crc32c`` codec and google-crc32c compute it) of frame c
    (``sizes[c]`` bytes at ``offsets[c]`` of ``src``) into ``out[c]``: one block a frame, each thread
    the CRC of its own stretch of the frame (a byte table in shared memory), the stretches joined by
    the CRC's linearity -- a stretch's CRC times x^(8 n) mod P for the n bytes after it, as zlib's
    ``crc32_combine`` (``multmodp``, ``x2nmodp``) does, the initial value's term likewise."""
    import cupy as cp

    return cp.RawKernel(r"""
#define POLY 0x82F63B78u
__device__ unsigned int multmodp(unsigned int a, unsigned int b) {  // a * b mod P, bits reflected (a != 0)
    unsigned int m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}
__device__ unsigned int x8nmodp(unsigned long long n) {  // x^(8 n) mod P
    unsigned int p = 1u << 31, sq = 1u << 23;  // x^0, x^8
    for (; n; n >>= 1) {
        if (n & 1) p = multmodp(sq, p);
        sq = multmodp(sq, sq);
    }
    return p;
}
extern "C" __global__ void crc32c_frames(const unsigned char* __restrict__ src,
                                         const unsigned long long* __restrict__ offsets,
                                         const unsigned long long* __restrict__ sizes,
                                         unsigned int* __restrict__ out) {
    __shared__ unsigned int table[256];
    __shared__ unsigned int warps[32];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        unsigned int c = i;
        for (int b = 0; b < 8; ++b) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[i] = c;
    }
    __syncthreads();
    const unsigned char* s = src + offsets[blockIdx.x];
    const unsigned long long n = sizes[blockIdx.x], per = (n + blockDim.x - 1) / blockDim.x;
    const unsigned long long a = min(n, per * threadIdx.x), e = min(n, a + per);
    unsigned int c = 0;
    for (unsigned long long i = a; i < e; ++i) c = table[(c ^ s[i]) & 0xff] ^ (c >> 8);
    c = multmodp(x8nmodp(n - e), c);  // (the stretch's CRC carried past the rest of the frame)
    for (int o = 16; o > 0; o >>= 1) c ^= __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (blockDim.x + 31) / 32; ++w) c ^= warps[w];
        out[blockIdx.x] = ~(c ^ multmodp(x8nmodp(n), 0xFFFFFFFFu));  // (initial value ~0, final ~)
    }
}
""", "crc32c_frames")


@functools.cache
def _place_module():
    """Copy chunk c (``slot`` cells from ``chunks + c * slot``, rows of ``t1``) to cell ``at[c]`` of
    ``band`` (rows of ``pitch`` cells), its first ``rows[c]`` rows and ``cols[c]`` columns (clipped at
    the array's edge): one block a chunk, its threads along a row. Cells moved as unsigned words of
    their size, so every bit (NaN payloads too) is kept."""
    import cupy as cp

    names = [f"place_chunks<{t}>" for t in _WORDS.values()]
    return cp.RawModule(code=r"""
template <typename T>
__global__ void place_chunks(const T* __restrict__ chunks, long long slot, long long t1,
                             const long long* __restrict__ at, const int* __restrict__ rows,
                             const int* __restrict__ cols, long long pitch, T* __restrict__ band) {
    const T* s = chunks + blockIdx.x * slot;
    T* d = band + at[blockIdx.x];
    const int h = rows[blockIdx.x], w = cols[blockIdx.x];
    for (int r = 0; r < h; ++r)
        for (int c = threadIdx.x; c < w; c += blockDim.x) d[r * pitch + c] = s[r * t1 + c];
}
""", name_expressions=names)


_WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


BATCH_CHUNKS = 2048  # chunks of an array a compress call needs to near nvCOMP's rate on the H100 (above)


def _usable() -> bool:
    """Whether nvCOMP loads here and ``TERRAIN_NVCOMP=0`` does not turn it off."""
    return os.environ.get("TERRAIN_NVCOMP", "1") != "0" and _lib() is not None


def encoder():
    """A :class:`BandEncoder`, or None where nvCOMP is not usable here (see the module's text)."""
    return BandEncoder() if _usable() else None


class _Launched:
    """A compress call under way on the GPU (:meth:`BandEncoder._launch`): its ``k`` frames' slots and
    where each starts in them, sizes and statuses (``info``: k sizes, then k int32 statuses), the
    event recorded after it, and the buffers it reads (kept until it is done)."""

    __slots__ = ("k", "slots", "at", "info", "done", "inputs")

    def __init__(self, k, slots, at, info, done, inputs):
        self.k, self.slots, self.at, self.info, self.done, self.inputs = k, slots, at, info, done, inputs


class BandEncoder:
    """Zstd frames of a band's chunks, made on the GPU: :meth:`encode`; or a call in two halves,
    :meth:`start` and :meth:`fetch`, so that the GPU compresses one call while the frames of the call
    before come back (:func:`terrain_io.pinned.write_bands`)."""

    _stream = None  # (the side stream: :meth:`_side_stream`)

    def __init__(self):
        self.lib = _lib()
        self.opts = _Opts()
        align = _Alignments()
        _check(self.lib.nvcompBatchedZstdCompressGetRequiredAlignments(self.opts, ctypes.byref(align)),
               "alignments")
        self.align = max(int(align.input), int(align.output), int(align.temp), 256)

    def encode(self, band, arr, shards: list, host):
        """The frames of ``band`` (a CuPy array: rows of ``arr`` from a shard row's first, every
        column, one shard row or several) for the shards ``shards`` ((sr, sc) of those rows, the
        first of them the band's first row, each with its chunks in the order
        ``store.shard_chunks`` gives): a list a shard of frames (NumPy views of the host buffer,
        None for a chunk all of fill value). ``host(nbytes)`` gives the host buffer the frames are
        copied into (pinned or not; valid while the caller's writers read it)."""
        return self.encode_many([band], [arr], shards, host)[0]

    def encode_many(self, bands, arrs, shards: list, host):
        """:meth:`encode` of the same rows of several arrays (``bands[i]`` of ``arrs[i]``) in one
        batched call, their frames in one host buffer: a list an array of :meth:`encode`'s lists.
        (nvCOMP's zstd on the H100: 6-8 GB/s of raw cells given 1024 chunks a call, 10-12 GB/s given
        2048: one band of one array at 32768^2 is 1024, so callers give it :data:`BATCH_CHUNKS` an
        array where they can; benchmarks/probe_gpu_encode.py.)"""
        return self.fetch(self.start(bands, arrs, shards), host)[0]

    def start(self, bands, arrs, shards: list):
        """:meth:`encode_many`'s first half: the chunks cut and their compress launched on the GPU (the
        current stream), waiting only for which chunks are kept; :meth:`fetch` gives the frames."""
        parts = [self._chunks(band, arr, shards) for band, arr in zip(bands, arrs)]
        kept = [p[1] for p in parts]
        return parts, (self._launch([p[0] for p in parts], kept) if sum(len(x) for x in kept) else None)

    def fetch(self, started, host):
        """:meth:`encode_many`'s second half, for what :meth:`start` gave: waits for its compress, copies
        its frames into ``host(nbytes)`` and gives (frames, sums): :meth:`encode_many`'s lists, and the
        same lists of each frame's crc32c (4 bytes, as zarr's codec stores it), computed on the GPU
        (``_crc32c_kernel``) and copied with the frames. Its GPU work runs on a stream of its own, so a
        compress started since (the next call's) goes on meanwhile."""
        parts, launched = started
        frames, sums = [], []
        if launched is not None:
            sizes, packed, crc_at = self._frames(launched)
            k = len(sizes)
            out = host(crc_at + 4 * k)[: crc_at + 4 * k]
            self._to_host(packed, out)
            lengths = sizes.tolist()
            frames = [out[a : a + n] for a, n in zip(itertools.accumulate(lengths, initial=0), lengths)]
            sums = [out[a : a + 4] for a in range(crc_at, crc_at + 4 * k, 4)]
        result, base = ([], []), 0
        for chunks, kept, order in parts:
            at = np.full(len(chunks), -1, np.int64)
            at[kept] = np.arange(base, base + len(kept))
            at, base, pos = at.tolist(), base + len(kept), 0
            per_frames, per_sums = [], []
            for cells in order:
                idx = at[pos : pos + len(cells)]
                per_frames.append([None if i < 0 else frames[i] for i in idx])
                per_sums.append([None if i < 0 else sums[i] for i in idx])
                pos += len(cells)
            result[0].append(per_frames)
            result[1].append(per_sums)
        return result

    @staticmethod
    def has_room(nbytes: int) -> bool:
        """Whether the GPU has ``nbytes`` free for another call in flight (its chunks, their frames'
        slots and the frames packed: ~3x the call's raw cells)."""
        from .backend import gpu_free_bytes

        return gpu_free_bytes() >= nbytes

    def _side_stream(self):
        """The stream of :meth:`fetch`'s GPU work (non-blocking: it neither waits for nor holds up the
        default stream's work, the next compress)."""
        import cupy as cp

        if self._stream is None:
            self._stream = cp.cuda.Stream(non_blocking=True)
        return self._stream

    def _to_host(self, packed, out) -> None:
        """The packed frames (device) copied into ``out`` (host memory), the copy complete."""
        stream = self._side_stream()
        packed.get(out=out, stream=stream)
        stream.synchronize()

    @staticmethod
    def _chunks(band, arr, shards: list):
        """``band``'s chunks for ``shards`` in the files' order ((n, t0, t1), contiguous), the indices
        of those not all of fill value (NumPy) and the order (a list a shard of its chunks). (A NumPy
        ``band`` is cut the same way, on the host: tests/test_write_bands_calls.py.)"""
        if isinstance(band, np.ndarray):
            xp = np
        else:
            import cupy as xp

        from .store import shard_layout, shard_chunks

        (t0, t1), _, _ = shard_layout(arr)
        dtype = np.dtype(arr.dtype)
        rows, cols = band.shape
        ntr, ntc = -(-rows // t0), -(-cols // t1)
        if (rows, cols) != (ntr * t0, ntc * t1):  # the array's edge: chunks padded with the fill value
            padded = xp.full((ntr * t0, ntc * t1), arr.fill_value, dtype)
            padded[:rows, :cols] = band
            band = padded
        n0, n1 = arr.shards[0] // t0, arr.shards[1] // t1
        first = shards[0][0]  # (the band's first shard row: the band may hold several)
        order = [shard_chunks(arr, sr, sc) for sr, sc in shards]
        tij = xp.asarray(np.array([[(sr - first) * n0 + i for (sr, _), cells in zip(shards, order) for i, _ in cells],
                                   [sc * n1 + j for (_, sc), cells in zip(shards, order) for _, j in cells]], np.int64))
        tiles = xp.ascontiguousarray(band, dtype=dtype).reshape(ntr, t0, ntc, t1).transpose(0, 2, 1, 3)
        chunks = tiles[tij[0], tij[1]]  # (n, t0, t1), contiguous, in the files' order
        flat = chunks.reshape(len(chunks), -1)
        fill = np.array(arr.fill_value, dtype)
        if dtype.kind == "f" and np.isnan(fill):
            keep = ~xp.isnan(flat).all(axis=1)
        else:
            keep = (flat != fill).any(axis=1)
        # The chunks kept found on the host: a band has a few hundred, and CuPy's reductions
        # (flatnonzero counts first) compile a kernel for each power-of-two class of such short
        # lengths -- seconds, in the first command at each new DEM width.
        return chunks, np.flatnonzero(keep if xp is np else keep.get()), order

    def _compress(self, chunks: list, kept: list):
        """Zstd frames of the chunks ``kept[i]`` (NumPy indices into ``chunks[i]``, an (n, t0, t1)
        array) in one call, waited for: their sizes (host) and the frames packed end to end (device;
        their crc32c after them), in the order given (benchmarks/probe_gpu_encode.py)."""
        sizes, packed, _ = self._frames(self._launch(chunks, kept))
        return sizes, packed

    def _launch(self, chunks: list, kept: list) -> _Launched:
        """The compress of the chunks ``kept[i]`` of ``chunks[i]`` (as :meth:`_compress`) launched on the
        current stream, each array's frames made in slots of its own chunks' largest frame; nothing
        waited for. (Its small tables cross in one copy: each copy or sync lets go of the GIL, and
        the writers' threads may keep it a while before this thread has it again.)"""
        import cupy as cp

        lib, stream = self.lib, cp.cuda.get_current_stream()
        counts = [len(x) for x in kept]
        nbytes = [int(np.prod(c.shape[1:])) * c.itemsize for c in chunks]
        k, largest = sum(counts), max(nbytes)
        slot = []
        for n in nbytes:
            max_out = ctypes.c_size_t()
            _check(lib.nvcompBatchedZstdCompressGetMaxOutputChunkSize(n, self.opts, ctypes.byref(max_out)),
                   "max output size")
            slot.append(-(-int(max_out.value) // self.align) * self.align)
        temp_bytes = ctypes.c_size_t()
        _check(lib.nvcompBatchedZstdCompressGetTempSize(k, largest, self.opts, ctypes.byref(temp_bytes),
                                                        sum(c * n for c, n in zip(counts, nbytes)), stream.ptr),
               "temp size")
        temp = cp.empty(max(1, int(temp_bytes.value)), cp.uint8)
        starts = [0, *itertools.accumulate(c * s for c, s in zip(counts, slot))]  # (Python ints: uint64 below)
        slots = cp.empty(max(1, starts[-1]), cp.uint8)
        at = np.concatenate([start + np.arange(c, dtype=np.uint64) * s for start, c, s in zip(starts, counts, slot)])
        inputs = np.concatenate([c.data.ptr + np.asarray(x, np.uint64) * np.uint64(n)
                                 for c, x, n in zip(chunks, kept, nbytes)])
        # one table, rows: the chunks' addresses, their sizes, the frames' slots (offsets, addresses)
        table = cp.asarray(np.concatenate([inputs, np.repeat(np.array(nbytes, np.uint64), counts), at,
                                           np.uint64(slots.data.ptr) + at]).reshape(4, k))
        info = cp.empty(2 * k, cp.uint64)  # (k sizes, then k int32 statuses)
        _check(lib.nvcompBatchedZstdCompressAsync(table[0].data.ptr, table[1].data.ptr, largest, k, temp.data.ptr,
                                                  int(temp_bytes.value), table[3].data.ptr, info.data.ptr, self.opts,
                                                  info[k:].data.ptr, stream.ptr),
               "zstd compress")
        done = cp.cuda.Event(disable_timing=True)
        done.record(stream)
        return _Launched(k, slots, table[2], info, done, (temp, table, chunks))

    def _frames(self, launched: _Launched):
        """``launched``'s frames once compressed, on the side stream: their sizes (host), and on the
        device the frames packed end to end, then from byte ``crc_at`` each one's crc32c (uint32):
        (sizes, packed, crc_at)."""
        import cupy as cp

        stream, k = self._side_stream(), launched.k
        stream.wait_event(launched.done)
        with stream:
            info = launched.info.get(stream=stream)
            stream.synchronize()
            sizes, failed = info[:k], info[k:].view(np.int32)[:k]
            if failed.any():
                raise RuntimeError(f"nvCOMP zstd compress: {np.count_nonzero(failed)} chunks failed "
                                   f"(status {int(failed.max())})")
            total = int(sizes.sum())
            crc_at = -(-total // 8) * 8
            offsets = cp.asarray(np.concatenate([np.zeros(1, np.uint64), np.cumsum(sizes)[:-1]]))
            packed = cp.empty(crc_at + 4 * k, cp.uint8)
            _pack_kernel()((k,), (256,), (launched.slots, launched.at, launched.info[:k], offsets, packed))
            _crc32c_kernel()((k,), (256,), (packed, offsets, launched.info[:k], packed[crc_at:]))
        return sizes, packed, crc_at


def decoder():
    """A :class:`BandDecoder`, or None where nvCOMP is not usable here (see the module's text)."""
    return BandDecoder() if _usable() else None


class BandDecoder:
    """Zstd frames decoded on the GPU into a band of an array's rows: :meth:`decode`."""

    def __init__(self):
        self.lib = _lib()
        self.opts = _DecompressOpts()
        align = _Alignments()
        _check(self.lib.nvcompBatchedZstdDecompressGetRequiredAlignments(self.opts, ctypes.byref(align)),
               "alignments")
        self.input_align = max(1, int(align.input))  # each frame's first byte (shard_frames' align)
        self.output_align = max(int(align.output), int(align.temp), 8)

    def decode(self, frames, chunks: np.ndarray, band, chunk_shape) -> np.ndarray:
        """Decode the frames in ``frames`` (a CuPy uint8 buffer) into ``band`` (a C-contiguous CuPy
        2-D array of the chunks' dtype): ``chunks`` rows (offset, bytes, row, col) of each frame, at
        multiples of :attr:`input_align`, and the band's cell its chunk's first cell lands on (the
        chunk clipped at the band's edge), ``chunk_shape`` (t0, t1). Returns the rows of ``chunks``
        that did not decode to a whole chunk (empty: all did), once the band is complete."""
        import cupy as cp

        lib, k = self.lib, len(chunks)
        if not k:
            return np.zeros(0, np.int64)
        (t0, t1), item = chunk_shape, band.dtype.itemsize
        chunk_bytes = t0 * t1 * item
        unit = max(self.output_align, item)
        slot = -(-chunk_bytes // unit) * unit
        stream = cp.cuda.get_current_stream().ptr
        temp_bytes = ctypes.c_size_t()
        _check(lib.nvcompBatchedZstdDecompressGetTempSize(k, chunk_bytes, self.opts, ctypes.byref(temp_bytes),
                                                          k * chunk_bytes, stream), "temp size")
        temp = cp.empty(max(1, int(temp_bytes.value)), cp.uint8)
        out = cp.empty(k * slot, cp.uint8)
        # (the small arrays made on the host and copied: no CuPy kernel to load in a fresh process)
        in_ptrs = cp.asarray(np.uint64(frames.data.ptr) + chunks[:, 0].astype(np.uint64))
        in_sizes = cp.asarray(chunks[:, 1].astype(np.uint64))
        out_ptrs = cp.asarray(np.uint64(out.data.ptr) + np.arange(k, dtype=np.uint64) * np.uint64(slot))
        room = cp.asarray(np.full(k, chunk_bytes, np.uint64))
        got, statuses = cp.zeros(k, cp.uint64), cp.zeros(k, cp.int32)
        _check(lib.nvcompBatchedZstdDecompressAsync(in_ptrs.data.ptr, in_sizes.data.ptr, room.data.ptr, got.data.ptr,
                                                    k, temp.data.ptr, int(temp_bytes.value), out_ptrs.data.ptr,
                                                    self.opts, statuses.data.ptr, stream), "zstd decompress")
        rows, cols = band.shape
        at = cp.asarray(chunks[:, 2] * cols + chunks[:, 3])
        h = cp.asarray(np.minimum(t0, rows - chunks[:, 2]).astype(np.int32))
        w = cp.asarray(np.minimum(t1, cols - chunks[:, 3]).astype(np.int32))
        word = np.dtype(f"u{item}")
        _place_module().get_function(f"place_chunks<{_WORDS[item]}>")(
            (k,), (256,), (out, np.int64(slot // item), np.int64(t1), at, h, w, np.int64(cols), band.view(word)))
        return np.flatnonzero((statuses.get() != 0) | (got.get() != chunk_bytes))
