"""A run of a shard's chunks encoded or decoded in one call that does not hold the GIL.

The store's chunks are zstd frames, each followed by its crc32c (zarr's ``ZstdCodec`` and
``Crc32cCodec``; docs/ARCHITECTURE.md#the-store). Encoding them one at a time from Python -- cut
out, padded, compared with the fill value, compressed, checksummed, handed between threads -- takes
the GIL between every step: at 8192^2 float32 the 1024 chunk encodes took 3.7-5.6 s of thread time
over 32 threads where the codec alone needs 0.07 s on 16 (benchmarks/RESULTS.md, "bench_io on the
H100, session 19"). Here a numba kernel (``nogil``) walks a run of chunks and calls the C functions
of the libraries the store already uses -- zstd in numcodecs' extension, crc32c in google-crc32c's
-- through their addresses (first-class function arguments, so the kernel is cached on disk like
any other): one GIL hand-off a run instead of several a chunk. The frames are the bytes numcodecs'
``Zstd(level).encode`` makes (both call ``ZSTD_compress`` at that level without a content
checksum; ``tests/test_chunkcodec.py``), so zarr reads what this writes.

Where either library does not export its functions, :func:`functions` is None and the store codes
chunk by chunk as before; so it does until numba has started in the process (``store._codec_runs``).
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import NamedTuple

import numpy as np
from numba import njit

from . import integrity

NO_CHUNK = np.uint64(2**64 - 1)  # an index entry of a chunk not stored (all fill value)

# kernel status a chunk (decode): 0 fine
CHECKSUM_FAILED, UNDECODABLE, WRONG_SIZE = 1, 2, 3
PROBLEMS = {CHECKSUM_FAILED: "chunk fails its checksum", UNDECODABLE: "chunk does not decode",
            WRONG_SIZE: "chunk decodes to the wrong number of bytes"}


class CFunctions(NamedTuple):
    """The C functions the kernels call, as ctypes functions."""

    compress: object  # ZSTD_compressCCtx
    create_cctx: object
    free_cctx: object
    decompress: object  # ZSTD_decompressDCtx
    create_dctx: object
    free_dctx: object
    crc32c: object  # google-crc32c's crc32c_value (integrity.crc32c_function)


@functools.cache
def functions() -> CFunctions | None:
    """The C functions, or None where a library does not export one."""
    crc = integrity.crc32c_function()
    try:
        from numcodecs import zstd as numcodecs_zstd

        zstd = ctypes.CDLL(numcodecs_zstd.__file__)
        compress, decompress = zstd.ZSTD_compressCCtx, zstd.ZSTD_decompressDCtx
        cctx, free_cctx, dctx, free_dctx = (zstd.ZSTD_createCCtx, zstd.ZSTD_freeCCtx, zstd.ZSTD_createDCtx,
                                            zstd.ZSTD_freeDCtx)
    except (ImportError, OSError, AttributeError):
        return None
    if crc is None:
        return None
    p, n = ctypes.c_void_p, ctypes.c_size_t
    compress.argtypes, compress.restype = [p, p, n, p, n, ctypes.c_int], n
    decompress.argtypes, decompress.restype = [p, p, n, p, n], n
    for create in (cctx, dctx):
        create.argtypes, create.restype = [], p
    for free in (free_cctx, free_dctx):
        free.argtypes, free.restype = [p], n
    return CFunctions(compress, cctx, free_cctx, decompress, dctx, free_dctx, crc)


class _Contexts(threading.local):
    """This thread's zstd compression and decompression contexts, made on first use and kept: made
    and freed a call they cost ~110 us (their workspace), more than a small run's work. About 1-2 MiB
    a thread that encodes; freed with the thread."""

    cctx = dctx = None

    def compression(self) -> int:
        if self.cctx is None:
            self.cctx = _Context(functions().create_cctx, functions().free_cctx)
        return self.cctx.pointer

    def decompression(self) -> int:
        if self.dctx is None:
            self.dctx = _Context(functions().create_dctx, functions().free_dctx)
        return self.dctx.pointer


class _Context:
    """A zstd context, made by ``create`` and freed by ``free`` with its owner."""

    def __init__(self, create, free):
        self.free = free
        self.pointer = create()
        if not self.pointer:
            raise MemoryError("zstd could not make a context")

    def __del__(self):
        self.free(self.pointer)


_CONTEXTS = _Contexts()


def compress_bound(nbytes: int) -> int:
    """zstd's ZSTD_COMPRESSBOUND: the most bytes a frame of ``nbytes`` can take."""
    return nbytes + (nbytes >> 8) + (((128 << 10) - nbytes) >> 11 if nbytes < (128 << 10) else 0)


# The largest value ZSTD functions return as an error code (ZSTD_isError: above -ZSTD_error_maxCode).
_ZSTD_ERROR = np.uint64(2**64 - 1 - 120)


@njit(nogil=True, cache=True)
def _encode_run(block_at, row_stride, rows, cols, t0, t1, fill, zero_mask, nan_mask, nan_fill, cells, compressed, level,
                crc_on, scratch, out, entries, cctx, compress, crc32c, move):
    """Encode the chunks ``cells`` ((k, 2): chunk row, column) of a block of ``rows`` x ``cols``
    cells (a shard's; its first cell at address ``block_at``, ``row_stride`` bytes a row, each row
    contiguous: an address, not an array, so that one build serves every layout of block) into
    ``out``, one after another from its start, through ``scratch`` (t0 * t1 unsigned integers of
    the array's item size):
    each chunk padded with ``fill`` to t0 x t1, left out when every cell equals the fill value
    (``entries[k]`` = NO_CHUNK), else its zstd frame at ``level`` (``compressed``; else its bytes)
    and, with ``crc_on``, its crc32c (4 bytes, little-endian), ``entries[k]`` = (offset, bytes).
    Cells compare as the array's values, as ``==`` and numpy's ``isnan`` do: by their bits, but
    for floats both zeros alike (their bits but the sign, ``zero_mask``, zero) and, where the fill
    value is NaN (``nan_fill``), every NaN alike (those bits above the infinity's, ``nan_mask``). Returns the bytes used, or -1 when
    zstd failed."""
    item = scratch.itemsize
    nbytes = t0 * t1 * item
    at = 0
    for k in range(cells.shape[0]):
        a0 = cells[k, 0] * t0
        b0 = cells[k, 1] * t1
        inside0 = min(t0, rows - a0)
        inside1 = min(t1, cols - b0)
        for r in range(t0):
            if r < inside0:
                move(scratch[r * t1 :].ctypes.data, block_at + np.uint64((a0 + r) * row_stride + b0 * item),
                     inside1 * item)
                for c in range(inside1, t1):
                    scratch[r * t1 + c] = fill
            else:
                for c in range(t1):
                    scratch[r * t1 + c] = fill
        every_fill = True  # (most chunks differ at their first cell: the loop ends there)
        for x in range(t0 * t1):
            v = scratch[x]
            if nan_fill:
                same = (v & zero_mask) > nan_mask
            else:
                same = v == fill or ((v | fill) & zero_mask) == 0
            if not same:
                every_fill = False
                break
        if every_fill:
            entries[k, 0] = NO_CHUNK
            entries[k, 1] = NO_CHUNK
            continue
        start = at
        if compressed:
            n = compress(cctx, out[at:].ctypes.data, out.size - at, scratch.ctypes.data, nbytes, level)
            if np.uint64(n) > _ZSTD_ERROR:
                return np.int64(-1)
            at += n
        else:
            move(out[at:].ctypes.data, scratch.ctypes.data, nbytes)
            at += nbytes
        if crc_on:
            value = crc32c(out[start:].ctypes.data, at - start)
            for b in range(4):
                out[at + b] = (value >> (8 * b)) & 0xFF
            at += 4
        entries[k, 0] = start
        entries[k, 1] = at - start
    return at


@njit(nogil=True, cache=True)
def _decode_run(raw, jobs, t0, t1_bytes, first_row, first_col, out_at, out_stride, rows, cols, scratch, compressed,
                crc_on, status, dctx, decompress, crc32c, move):
    """Check and decode the chunks ``jobs`` ((k, 4): chunk row, column, offset in ``raw``, stored
    bytes) into the window of ``rows`` x ``cols`` bytes at address ``out_at``, ``out_stride`` bytes a
    row (row r, byte column c; an address: one build for every layout), each t0 x ``t1_bytes``
    chunk placed at (row * t0 - first_row, column * t1_bytes - first_col) and cut to ``out``; its
    crc32c checked first (``crc_on``), then the zstd frame decoded (``compressed``) or the bytes
    taken as they are. ``status[k]``: 0, or the chunk's problem (CHECKSUM_FAILED, UNDECODABLE,
    WRONG_SIZE), after which it is not placed. Returns the number of chunks with a problem."""
    nbytes = t0 * t1_bytes
    problems = 0
    for k in range(jobs.shape[0]):
        off = jobs[k, 2]
        nb = jobs[k, 3]
        status[k] = 0
        if crc_on:
            nb -= 4
            value = crc32c(raw[off:].ctypes.data, nb)
            stored = np.uint32(0)
            for b in range(4):
                stored |= np.uint32(raw[off + nb + b]) << np.uint32(8 * b)
            if np.uint32(value) != stored:
                status[k] = CHECKSUM_FAILED
                problems += 1
                continue
        if compressed:
            n = decompress(dctx, scratch.ctypes.data, nbytes, raw[off:].ctypes.data, nb)
            if np.uint64(n) > _ZSTD_ERROR:
                status[k] = UNDECODABLE
                problems += 1
                continue
            if n != nbytes:
                status[k] = WRONG_SIZE
                problems += 1
                continue
            chunk = scratch[0:]
        else:
            if nb != nbytes:
                status[k] = WRONG_SIZE
                problems += 1
                continue
            chunk = raw[off : off + nb]
        r0 = jobs[k, 0] * t0 - first_row
        c0 = jobs[k, 1] * t1_bytes - first_col
        lo1, hi1 = max(c0, 0), min(c0 + t1_bytes, cols)
        if hi1 <= lo1:
            continue
        for r in range(max(r0, 0), min(r0 + t0, rows)):
            move(out_at + np.uint64(r * out_stride + lo1), chunk[(r - r0) * t1_bytes + lo1 - c0 :].ctypes.data,
                 hi1 - lo1)
    return problems


@njit(nogil=True, cache=True)
def _checksums(addresses, sizes, out, crc32c):
    """``out[k]`` = the crc32c of ``sizes[k]`` bytes from address ``addresses[k]``."""
    for k in range(addresses.shape[0]):
        out[k] = crc32c(addresses[k], sizes[k])


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_FLOAT_BITS = {2: (0x7FFF, 0x7C00), 4: (0x7FFFFFFF, 0x7F800000), 8: (0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000)}


def as_bits(values: np.ndarray) -> np.ndarray | None:
    """``values`` (2-D, its rows contiguous) as unsigned integers of its item size, no copy; None
    where that cannot be a view."""
    unsigned = _UNSIGNED.get(values.dtype.itemsize)
    if unsigned is None or values.ndim != 2 or values.strides[1] != values.dtype.itemsize:
        return None
    return values.view(unsigned)


def encode_run(block: np.ndarray, tile: tuple[int, int], fill, cells: np.ndarray, level: int | None, crc: bool):
    """The stored bytes of chunks ``cells`` ((k, 2) chunk rows and columns, in the order wanted) of
    ``block`` (a shard's cells, clipped at the array's edge, its rows contiguous: :func:`as_bits`),
    as the store writes them: (one buffer of them end to end, entries (k, 2): each chunk's offset in
    it and its bytes, NO_CHUNK where it is all fill value and left out). ``level`` None: the chunks'
    bytes, not compressed. Needs :func:`functions`."""
    c = functions()
    bits = as_bits(block)
    t0, t1 = tile
    dtype = block.dtype
    unsigned = bits.dtype.type
    fill_bits = np.array(fill, dtype=dtype).reshape(1).view(bits.dtype)[0]
    if dtype.kind == "f":
        zero_mask, nan_mask = (unsigned(m) for m in _FLOAT_BITS[dtype.itemsize])
    else:  # integers: equal only as the same bits (both zero is the same bits)
        zero_mask, nan_mask = unsigned(np.iinfo(unsigned).max), unsigned(0)
    nan_fill = bool(dtype.kind == "f" and np.isnan(np.array(fill, dtype)))
    cells = np.ascontiguousarray(cells, np.int64).reshape(-1, 2)
    if len(cells) and (cells.min() < 0 or (cells[:, 0] * t0).max() >= bits.shape[0]
                       or (cells[:, 1] * t1).max() >= bits.shape[1]):  # (the kernel has addresses, not bounds)
        raise ValueError(f"chunks {cells.tolist()} are not all inside a block of {bits.shape}")
    nbytes = t0 * t1 * dtype.itemsize
    out = np.empty(len(cells) * ((compress_bound(nbytes) if level is not None else nbytes) + 4 * crc), np.uint8)
    entries = np.empty((len(cells), 2), np.uint64)
    used = _call(_encode_run, np.uintp(_address(bits)), bits.strides[0], *bits.shape, t0, t1, fill_bits, zero_mask, nan_mask,
                       nan_fill, cells, level is not None,
                       0 if level is None else int(level), bool(crc), np.empty(t0 * t1, bits.dtype), out, entries,
                       _CONTEXTS.compression(), c.compress, c.crc32c, ctypes.memmove)
    if used < 0:
        raise RuntimeError("zstd could not compress a chunk")
    return out[:used], entries


def decode_run(raw: np.ndarray, jobs: np.ndarray, tile: tuple[int, int], first: tuple[int, int], out: np.ndarray,
               level: int | None, crc: bool) -> np.ndarray:
    """Check and decode the stored chunks ``jobs`` ((k, 4) int64: chunk row, column, offset in
    ``raw`` (uint8), stored bytes) into ``out`` (the window's cells, its rows contiguous:
    :func:`as_bits`), chunk (i, j)'s first cell at out's (i * t0 - first[0], j * t1 - first[1]), cut
    to ``out``. Returns the status a job (0, or a key of :data:`PROBLEMS`); a chunk with a problem is
    not placed. Needs :func:`functions`."""
    c = functions()
    item = out.dtype.itemsize
    t0, t1 = tile
    jobs = np.ascontiguousarray(jobs, np.int64).reshape(-1, 4)
    if raw.dtype != np.uint8 or raw.ndim != 1 or not raw.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("decode_run: raw must be contiguous bytes and out writable")
    if len(jobs) and (jobs.min() < 0 or (jobs[:, 2] + jobs[:, 3]).max() > raw.size or jobs[:, 3].min() < 4 * crc):
        raise ValueError("decode_run: a chunk lies outside the bytes read")  # (the kernel has addresses, not bounds)
    status = np.empty(len(jobs), np.int8)
    view = as_bits(out)
    _call(_decode_run, raw, jobs, t0, t1 * item, first[0], first[1] * item,
                np.uintp(_address(view)), view.strides[0], view.shape[0], view.shape[1] * item,
                np.empty(t0 * t1 * item, np.uint8), level is not None, bool(crc), status,
                _CONTEXTS.decompression(), c.decompress, c.crc32c, ctypes.memmove)
    return status


def _call(kernel, *args):
    """``kernel(*args)``, past numba's dispatcher once it has typed arguments of these kinds: the
    dispatcher types every argument of every call under the GIL, a ctypes function ~25 us, so a
    call with three took ~150 us (2-core VM) -- more than a small run's decode, and 16 threads queued
    for the GIL behind it; the compiled entry point takes ~4 us (it unboxes, and lets go of the GIL,
    as the dispatcher's call does). Where numba keeps no such entry point, through the dispatcher."""
    key = (kernel, *map(_kind, args))
    entry = _ENTRY_POINTS.get(key)
    if entry is not None:
        return entry(*args)
    result = kernel(*args)  # (typed, and compiled or loaded from the cache, by the dispatcher)
    try:
        entry = kernel.overloads[tuple(map(kernel.typeof_pyval, args))].entry_point
    except (AttributeError, KeyError, TypeError):
        entry = kernel
    _ENTRY_POINTS[key] = entry
    return result


_ENTRY_POINTS: dict = {}  # (kernel, each argument's kind) -> the compiled function numba typed them for


def _kind(value):
    """What numba's type of ``value`` depends on: an array's dtype, dimensions, layout and flags; a
    Python int's range; a ctypes function's identity (its argument types); else the Python type."""
    if isinstance(value, np.ndarray):
        f = value.flags
        return value.dtype.str, value.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(value, ctypes._CFuncPtr):
        return id(value)
    if type(value) is int:
        return int, -(2**63) <= value < 2**63
    return type(value)


def _address(values: np.ndarray) -> int:
    return values.__array_interface__["data"][0]


def checksums(frames: list[np.ndarray]) -> np.ndarray:
    """The crc32c of each of ``frames`` (1-D uint8 arrays, contiguous) as zarr's codec appends it:
    (k, 4) bytes, little-endian, in one call that does not hold the GIL (a shard's frames made on
    the GPU: 64-1024 a shard, each checksummed from Python took the GIL back between them). Needs
    :func:`functions`."""
    addresses = np.fromiter((_address(f) for f in frames), np.uint64, len(frames))
    sizes = np.fromiter((f.nbytes for f in frames), np.uint64, len(frames))
    out = np.empty(len(frames), "<u4")
    _call(_checksums, addresses, sizes, out, functions().crc32c)
    return out.view(np.uint8).reshape(-1, 4)


def load() -> None:
    """The kernels loaded (or compiled) now, on a few cells, so that their first use is not slow; where
    that fails (a numba that cannot type the C functions), :func:`usable` is false from then on."""
    if functions() is None:
        return
    try:
        for dtype in (np.uint8, np.uint16, np.float32, np.float64):
            cells = np.zeros((1, 2), np.int64)
            data, entries = encode_run(np.ones((2, 2), dtype), (2, 2), 0, cells, 1, True)
            decode_run(data, np.array([[0, 0, 0, entries[0, 1]]]), (2, 2), (0, 0), np.empty((2, 2), dtype), 1, True)
        checksums([data])
    except Exception:  # noqa: BLE001 -- the store codes chunk by chunk instead
        _LOAD_FAILED[0] = True


_LOAD_FAILED = [False]


def usable() -> bool:
    """Whether the store may code its chunks here: the C functions found, and the kernels not failed."""
    return functions() is not None and not _LOAD_FAILED[0]
