"""List ranking and list scan on successor arrays (NumPy + numba on the CPU, CuPy kernels on the GPU).

A list forest is given by its successor array: ``succ[i]`` is the element after ``i``, ``-1`` marks
a tail. Any number of lists (many heads) may share the array; every element belongs to exactly one.

Algorithms (``method=``):

- ``"wyllie"``: pointer jumping (Wyllie 1979; Rehman et al. 2009, Algorithm 1; Yogaratnam 2010,
  sec. 4.1.3; docs/ARCHITECTURE.md#references), O(n log n) work, ceil(log2 n) synchronous rounds, double-buffered.
- ``"helman_jaja"``: sparse ruling set (Helman & JaJa 1999; Rehman et al. Algorithm 2): splitters
  every ``stride`` indices plus every head, one walk per splitter writes local prefixes, the list
  of sublists is ranked sequentially (the paper's step 3, on the host), then every element adds
  its sublist's prefix.
- ``"recursive_hj"`` (and ``"auto"``): the recursive variant (Rehman et al. Algorithm 3 "RHJ"):
  the list of sublists is reduced again and again until it fits one block (GPU: 2048 elements,
  ranked by pointer jumping in shared memory) or 4096 elements (CPU: sequential walk).
- ``"sequential"``: a walk from every head (the O(n) reference).

Splitter count: the paper uses n / (2 log^2 n) splitters in the first round and n / log n after
it. On an H100 n / (2 log^2 n) gives ~26K walks for n = 32M, far too few to keep the 132 SMs'
memory pipes busy, so the default is one splitter per ``stride = max(8, log2 n)`` elements
(about n / log n) at every level; ``stride=`` overrides (the benchmark sweeps it). The link word
of every element encodes its successor and its splitter bit, so a walk step reads one word.
The CPU walks interleave 16 sublists per thread so that 16 independent cache misses are in flight
instead of one dependent chain.

Results: ``list_rank`` returns ranks in the index dtype (int32 below 2**31 elements, else int64);
``origin="head"`` (default) gives the position from the head (head = 0), ``origin="tail"`` the
distance to the tail (tail = 0). ``list_scan`` returns the inclusive (or exclusive) prefix of
``values`` along each list under ``op`` in {"sum", "min", "max"} (from the head, or from the tail
when ``origin="tail"``). Malformed inputs (ids out of range, two elements with one successor,
cycles) raise :class:`~terrain_io.errors.InputError`.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from ..backend import device_of, kernel_source, to_device
from ..errors import InputError
from ._csr import index_dtype

METHODS = ("auto", "wyllie", "helman_jaja", "recursive_hj", "sequential")
OPS = {"sum": 0, "min": 1, "max": 2}
CPU_BASE = 4096       # reduced lists this short are walked sequentially (CPU)
GPU_BLOCK = 1024      # threads of the one-block base case; it ranks up to 2 * GPU_BLOCK elements
_INTERLEAVE = 16      # concurrent walks per CPU thread


def _identity(op: int, dtype):
    dtype = np.dtype(dtype)
    if op == 0:
        return dtype.type(0)
    if dtype.kind == "f":
        return dtype.type(np.inf if op == 1 else -np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if op == 1 else info.min)


def auto_stride(n: int) -> int:
    """Elements per splitter: about log2 n (n / log n splitters, Rehman et al. section 4)."""
    return max(8, int(math.log2(max(n, 2))))


# ----------------------------------------------------------------------------------------------
# CPU kernels (numba)


@njit(inline="always")
def _comb(a, b, op):
    if op == 0:
        return a + b
    if op == 1:
        return b if b < a else a
    return b if b > a else a


@njit(cache=True, parallel=True)
def _cpu_pred(succ, pred):
    n = succ.shape[0]
    for i in prange(n):
        s = succ[i]
        if s >= 0 and s < n:
            pred[s] = i


@njit(cache=True, parallel=True)
def _cpu_check(succ, pred):
    n = succ.shape[0]
    bad = 0
    for i in prange(n):
        s = succ[i]
        if s >= n or s < -1 or (s >= 0 and pred[s] != i):
            bad += 1
    return bad


@njit(cache=True)
def _cpu_sequential(nxt, prv, val, unit, op, out):
    """Walk every list from its head; returns the number of elements reached (< n: a cycle)."""
    n = nxt.shape[0]
    covered = 0
    for h in range(n):
        if prv[h] >= 0:
            continue
        acc = val[0] if unit else val[h]
        out[h] = acc
        covered += 1
        j = nxt[h]
        while j >= 0 and covered <= n:
            acc = _comb(acc, val[0] if unit else val[j], op)
            out[j] = acc
            covered += 1
            j = nxt[j]
    return covered


@njit(cache=True, parallel=True)
def _cpu_link(nxt, prv, stride, extra_heads, link, spl_id, spl_elem):
    n = nxt.shape[0]
    for i in prange(n):
        if i % stride == 0:
            spl_id[i] = i // stride
            spl_elem[i // stride] = i
            link[i] = -3 - nxt[i]
        else:
            link[i] = nxt[i]
    n_regular = (n + stride - 1) // stride
    for k in prange(extra_heads.shape[0]):
        i = extra_heads[k]
        spl_id[i] = n_regular + k
        spl_elem[n_regular + k] = i
        link[i] = -3 - nxt[i]


@njit(cache=True)
def _cpu_walk_chunk(lo, hi, link, val, unit, op, spl_id, spl_elem, local, owner, sub_val, sub_next,
                    sub_prev):
    """Walk the sublists of splitters lo..hi-1, _INTERLEAVE at a time (independent misses in flight)."""
    cur = np.full(_INTERLEAVE, -1, dtype=link.dtype)
    tid = np.full(_INTERLEAVE, -2, dtype=np.int64)  # a walk's splitter; -2: a free slot, -1: done
    acc = np.zeros(_INTERLEAVE, dtype=local.dtype)
    count = 0
    nxt_t = lo
    active = _INTERLEAVE
    while active > 0:
        for g in range(_INTERLEAVE):
            t = tid[g]
            if t == -1:
                continue
            if t >= 0:  # one step of the walk; at the sublist's end its value and successor sublist
                j = cur[g]
                if j >= 0:
                    lj = link[j]
                    if lj > -2:
                        a = _comb(acc[g], val[0] if unit else val[j], op)
                        acc[g] = a
                        local[j] = a
                        owner[j] = t
                        cur[g] = lj
                        count += 1
                        continue
                sub_val[t] = acc[g]
                if j >= 0:
                    k = spl_id[j]
                    sub_next[t] = k
                    sub_prev[k] = t
                else:
                    sub_next[t] = -1
            if nxt_t < hi:  # the slot takes the next splitter
                s = spl_elem[nxt_t]
                a = val[0] if unit else val[s]
                local[s] = a
                owner[s] = nxt_t
                acc[g] = a
                cur[g] = -3 - link[s]
                tid[g] = nxt_t
                count += 1
                nxt_t += 1
            else:
                tid[g] = -1
                active -= 1
    return count


@njit(cache=True, parallel=True)
def _cpu_walk(link, val, unit, op, spl_id, spl_elem, local, owner, sub_val, sub_next, sub_prev, threads):
    """Local ranking phase of Helman-JaJa: one walk per splitter; returns the elements covered."""
    n_spl = spl_elem.shape[0]
    n_chunks = min(n_spl, 4 * threads)
    counts = np.zeros(max(n_chunks, 1), dtype=np.int64)
    for c in prange(n_chunks):
        counts[c] = _cpu_walk_chunk(c * n_spl // n_chunks, (c + 1) * n_spl // n_chunks, link, val, unit,
                                    op, spl_id, spl_elem, local, owner, sub_val, sub_next, sub_prev)
    return counts.sum()


@njit(cache=True, parallel=True)
def _cpu_finish(local, owner, sub_prev, sub_prefix, op, out):
    for i in prange(local.shape[0]):
        p = sub_prev[owner[i]]
        x = local[i]
        out[i] = _comb(sub_prefix[p], x, op) if p >= 0 else x


@njit(cache=True, parallel=True)
def _cpu_wyllie_round(prev, val, op, prev2, val2):
    active = 0
    for i in prange(prev.shape[0]):
        p = prev[i]
        x = val[i]
        if p >= 0:
            x = _comb(val[p], x, op)
            p = prev[p]
            if p >= 0:
                active += 1
        val2[i] = x
        prev2[i] = p
    return active


@njit(cache=True, parallel=True)
def _cpu_shift(prv, incl, ident, out):
    """Exclusive scan from the inclusive one: out[i] = incl[prv[i]] (identity at heads)."""
    for i in prange(prv.shape[0]):
        p = prv[i]
        out[i] = incl[p] if p >= 0 else ident


# ----------------------------------------------------------------------------------------------
# Backends: the same steps on NumPy/numba and on CuPy kernels


class _Cpu:
    xp = np
    base_limit = CPU_BASE

    def pred(self, succ):
        pred = np.full(len(succ), -1, dtype=succ.dtype)
        _cpu_pred(succ, pred)
        return pred

    def check(self, succ, pred):
        return int(_cpu_check(succ, pred))

    def sequential(self, nxt, prv, val, unit, op, dtype):
        out = np.empty(len(nxt), dtype=dtype)
        covered = _cpu_sequential(nxt, prv, val if val is not None else np.ones(1, dtype), unit, op, out)
        return out, covered

    def base(self, nxt, prv, val, unit, op, dtype):
        return self.sequential(nxt, prv, val, unit, op, dtype)

    def split(self, nxt, prv, val, unit, op, dtype, stride):
        n = len(nxt)
        idx = np.arange(n, dtype=nxt.dtype)
        extra = np.flatnonzero((prv < 0) & (idx % stride != 0)).astype(nxt.dtype)
        n_spl = (n + stride - 1) // stride + len(extra)
        link = np.empty_like(nxt)
        spl_id = np.empty_like(nxt)
        spl_elem = np.empty(n_spl, dtype=nxt.dtype)
        _cpu_link(nxt, prv, stride, extra, link, spl_id, spl_elem)
        local = np.empty(n, dtype=dtype)
        owner = np.empty(n, dtype=nxt.dtype)
        sub_val = np.empty(n_spl, dtype=dtype)
        sub_next = np.empty(n_spl, dtype=nxt.dtype)
        sub_prev = np.full(n_spl, -1, dtype=nxt.dtype)
        covered = _cpu_walk(link, val if val is not None else np.ones(1, dtype), unit, op, spl_id, spl_elem,
                            local, owner, sub_val, sub_next, sub_prev, numba.get_num_threads())
        return local, owner, sub_val, sub_next, sub_prev, int(covered)

    def finish(self, local, owner, sub_prev, sub_prefix, op):
        out = np.empty_like(local)
        _cpu_finish(local, owner, sub_prev, sub_prefix, op, out)
        return out

    def wyllie_round(self, prev, val, op, prev2, val2):
        return int(_cpu_wyllie_round(prev, val, op, prev2, val2))

    def shift(self, prv, incl, ident):
        out = np.empty_like(incl)
        _cpu_shift(prv, incl, ident, out)
        return out


_CUDA_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long",
               np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


class _Gpu:
    base_limit = 2 * GPU_BLOCK
    _module = None

    def __init__(self):
        import cupy

        self.xp = cupy

    @classmethod
    def _kernel(cls, name: str):
        import cupy

        if cls._module is None:
            names = []
            for i in ("int", "long long"):
                names += [f"lr_pred<{i}>", f"lr_check<{i}>", f"lr_link<{i}>"]
                for v in _CUDA_TYPES.values():
                    for op in range(3):
                        names += [f"lr_wyllie_round<{i}, {v}, {op}>", f"lr_block_wyllie<{i}, {v}, {op}>"]
                        names += [f"lr_finish<{i}, {v}, {op}, {p}>" for p in (0, 1)]
                        names += [f"lr_walk<{i}, {v}, {op}, {u}, {p}>" for u in (0, 1) for p in (0, 1)]
            src = kernel_source("graph_listrank.cu")
            cls._module = cupy.RawModule(code=src, options=("-std=c++17",), name_expressions=names)
        return cls._module.get_function(name)

    def _launch(self, name, n, args, threads=256):
        blocks = int(min(max((n + threads - 1) // threads, 1), 132 * 16))
        self._kernel(name)((blocks,), (threads,), args)

    @staticmethod
    def _t(dtype):
        return _CUDA_TYPES[np.dtype(dtype)]

    def pred(self, succ):
        cp = self.xp
        pred = cp.full(len(succ), -1, dtype=succ.dtype)
        n = succ.dtype.type(len(succ))
        self._launch(f"lr_pred<{self._t(succ.dtype)}>", len(succ), (succ, n, pred))
        return pred

    def check(self, succ, pred):
        cp = self.xp
        counts = cp.zeros(3, dtype=cp.uint64)
        self._launch(f"lr_check<{self._t(succ.dtype)}>", len(succ), (succ, pred, succ.dtype.type(len(succ)), counts))
        has_succ, has_pred, bad = (int(x) for x in counts.get())
        return bad + (has_succ - has_pred)

    def sequential(self, nxt, prv, val, unit, op, dtype):
        out, covered = _Cpu().sequential(nxt.get(), prv.get(), None if val is None else val.get(), unit, op, dtype)
        return self.xp.asarray(out), covered

    def base(self, nxt, prv, val, unit, op, dtype):
        """One block, Wyllie pointer jumping in shared memory (n <= 2 * GPU_BLOCK)."""
        cp = self.xp
        n = len(nxt)
        if val is None:
            val = cp.ones(n, dtype=dtype)
        out = cp.empty(n, dtype=dtype)
        ok = cp.zeros(1, dtype=cp.int32)
        if n:
            shared = 2 * GPU_BLOCK * (np.dtype(dtype).itemsize + 4)
            self._kernel(f"lr_block_wyllie<{self._t(nxt.dtype)}, {self._t(dtype)}, {op}>")(
                (1,), (GPU_BLOCK,), (prv, val, np.int32(n), out, ok), shared_mem=shared)
            covered = n if int(ok.get()[0]) else 0
        else:
            covered = 0
        return out, covered

    def split(self, nxt, prv, val, unit, op, dtype, stride):
        cp = self.xp
        n = len(nxt)
        it = nxt.dtype.type
        n_regular = (n + stride - 1) // stride
        n_heads = n - int(cp.count_nonzero(nxt >= 0))
        cap = n_regular + n_heads
        link = cp.empty_like(nxt)
        spl_id = cp.empty_like(nxt)
        spl_elem = cp.empty(cap, dtype=nxt.dtype)
        counter = cp.zeros(1, dtype=cp.uint64)
        I = self._t(nxt.dtype)
        self._launch(f"lr_link<{I}>", n, (nxt, prv, it(n), it(stride), it(n_regular), link, spl_id,
                                          spl_elem, counter))
        n_spl = n_regular + int(counter.get()[0])
        spl_elem = spl_elem[:n_spl]
        pack = nxt.dtype.itemsize == 4 and np.dtype(dtype).itemsize == 4
        if pack:                           # one 64-bit cell (owner, local prefix) per element
            cells = cp.empty(n, dtype=cp.uint64)
        else:
            cells = cp.empty(1, dtype=cp.uint64)
            local = cp.empty(n, dtype=dtype)
            owner = cp.empty(n, dtype=nxt.dtype)
        sub_val = cp.empty(n_spl, dtype=dtype)
        sub_next = cp.empty(n_spl, dtype=nxt.dtype)
        sub_prev = cp.full(n_spl, -1, dtype=nxt.dtype)
        covered = cp.zeros(1, dtype=cp.uint64)
        threads = 128
        dummy_v = sub_val                  # stands in for the unused value / local arrays
        self._kernel(f"lr_walk<{I}, {self._t(dtype)}, {op}, {int(unit)}, {int(pack)}>")(
            ((n_spl + threads - 1) // threads,), (threads,),
            (link, val if val is not None else dummy_v, spl_id, spl_elem, it(n_spl),
             dummy_v if pack else local, sub_next if pack else owner, cells,
             sub_val, sub_next, sub_prev, covered))
        parts = (cells, n, dtype) if pack else (local, owner)
        return parts, None, sub_val, sub_next, sub_prev, int(covered.get()[0])

    def finish(self, local, owner, sub_prev, sub_prefix, op):
        cp = self.xp
        if len(local) == 3:        # packed cells
            cells, n, dtype = local
            out = cp.empty(n, dtype=dtype)
            args = (out, sub_prev, cells, sub_prev, sub_prefix, sub_prev.dtype.type(n), out)
            name = f"lr_finish<{self._t(sub_prev.dtype)}, {self._t(dtype)}, {op}, 1>"
        else:
            loc, own = local
            n = len(loc)
            out = cp.empty_like(loc)
            args = (loc, own, cp.empty(1, dtype=cp.uint64), sub_prev, sub_prefix, own.dtype.type(n), out)
            name = f"lr_finish<{self._t(own.dtype)}, {self._t(loc.dtype)}, {op}, 0>"
        self._launch(name, n, args)
        return out

    def wyllie_round(self, prev, val, op, prev2, val2):
        active = self.xp.zeros(1, dtype=self.xp.uint64)
        self._launch(f"lr_wyllie_round<{self._t(prev.dtype)}, {self._t(val.dtype)}, {op}>", len(prev),
                     (prev, val, prev.dtype.type(len(prev)), prev2, val2, active))
        return int(active.get()[0])

    def shift(self, prv, incl, ident):
        cp = self.xp
        return cp.where(prv >= 0, incl[cp.maximum(prv, 0)], incl.dtype.type(ident))


# ----------------------------------------------------------------------------------------------
# Algorithms (backend-independent): inclusive prefix along ``nxt`` (``prv`` = predecessors)


def _cycle_error():
    return InputError("successor array has a cycle (some elements are not reachable from a head)")


def _wyllie(be, nxt, prv, val, unit, op, dtype):
    n = len(prv)
    xp = be.xp
    v = xp.ones(n, dtype=dtype) if unit else val.astype(dtype, copy=True)
    p = prv.copy()
    p2, v2 = xp.empty_like(p), xp.empty_like(v)
    rounds = 0
    active = int(xp.count_nonzero(p >= 0))
    while active:
        if rounds > math.ceil(math.log2(max(n, 2))) + 1:
            raise _cycle_error()
        active = be.wyllie_round(p, v, op, p2, v2)
        p, p2, v, v2 = p2, p, v2, v
        rounds += 1
    return v


def _hj(be, nxt, prv, val, unit, op, dtype, stride, recursive):
    n = len(nxt)
    if n <= be.base_limit:
        out, covered = be.base(nxt, prv, val, unit, op, dtype)
        if covered != n:
            raise _cycle_error()
        return out
    s = stride(n) if callable(stride) else int(stride)
    if s < 2:
        raise InputError(f"stride must be >= 2, got {s}")
    local, owner, sub_val, sub_next, sub_prev, covered = be.split(nxt, prv, val, unit, op, dtype, s)
    if covered != n:
        raise _cycle_error()
    if recursive and 2 * len(sub_next) <= n:
        sub_prefix = _hj(be, sub_next, sub_prev, sub_val, False, op, dtype, stride, True)
    elif recursive:
        # Many short lists: every head is a splitter, so the reduced lists barely shrink and
        # recursing again would never reach the base case. They are short, so pointer jumping
        # (O(log longest) rounds) ranks them in parallel.
        sub_prefix = _wyllie(be, sub_next, sub_prev, sub_val, False, op, dtype)
    else:
        sub_prefix, covered = be.sequential(sub_next, sub_prev, sub_val, False, op, dtype)
        if covered != len(sub_next):
            raise _cycle_error()
    return be.finish(local, owner, sub_prev, sub_prefix, op)


def _prefix(succ, values, op: int, origin: str, method: str, stride, check: bool, device):
    if method not in METHODS:
        raise InputError(f"unknown list-ranking method {method!r}: choose one of {', '.join(METHODS)}")
    if origin not in ("head", "tail"):
        raise InputError(f"origin must be 'head' or 'tail', got {origin!r}")
    dev = device_of(succ, values, device=device)
    be = _Gpu() if dev == "gpu" else _Cpu()
    xp = be.xp
    succ = to_device(succ, dev)
    if succ.ndim != 1:
        raise InputError("successor array must be 1-D")
    if succ.dtype.kind not in "iu":
        raise InputError(f"successor array must hold integers, got {succ.dtype}")
    n = len(succ)
    idt = index_dtype(n + 1)
    succ = succ.astype(idt, copy=False)
    unit = values is None
    if unit:
        dtype = idt
        val = None
    else:
        val = to_device(values, dev)
        if val.shape != succ.shape:
            raise InputError("values must have the length of the successor array")
        dtype = val.dtype if val.dtype in _CUDA_TYPES else (np.float64 if val.dtype.kind == "f" else np.int64)
        val = val.astype(dtype, copy=False)
    if n == 0:
        return xp.empty(0, dtype=dtype), succ, succ
    pred = be.pred(succ)
    if check and be.check(succ, pred):
        raise InputError("malformed successor array: ids out of range (use -1 for a tail) or "
                         "elements sharing one successor")
    nxt, prv = (succ, pred) if origin == "head" else (pred, succ)
    stride = stride or auto_stride
    if method == "wyllie":
        out = _wyllie(be, nxt, prv, val, unit, op, dtype)
    elif method == "sequential":
        out, covered = be.sequential(nxt, prv, val, unit, op, dtype)
        if covered != n:
            raise _cycle_error()
    else:
        out = _hj(be, nxt, prv, val, unit, op, dtype, stride, recursive=method != "helman_jaja")
    return out, nxt, prv


def list_rank(succ, *, method: str = "auto", origin: str = "head", stride=None, check: bool = True,
              device: str | None = None):
    """Rank of every element of the lists in ``succ`` (module docstring).

    Parameters
    ----------
    succ : 1-D integer array
        The successor of each element; -1 at a tail (NumPy or CuPy).
    method : {"auto", "recursive_hj", "helman_jaja", "wyllie", "sequential"}
        ``auto`` is ``recursive_hj``.
    origin : {"head", "tail"}
        The position from the head (head = 0) or the distance to the tail (tail = 0).
    stride : int or callable, optional
        Elements per splitter (int or n -> int) for the Helman-JaJa methods.
    check : bool
        False skips the validation pass (the caller guarantees a well-formed forest of lists).
    device : {"cpu", "gpu"}, optional
        Default: the input's.

    Returns
    -------
    ranks : 1-D int64 array
        On the input's device unless ``device`` is given.

    Examples
    --------
    >>> import numpy as np
    >>> list_rank(np.array([2, -1, 1])).tolist()  # the list 0 -> 2 -> 1
    [0, 2, 1]
    """
    out, _, _ = _prefix(succ, None, 0, origin, method, stride, check, device)
    return out - out.dtype.type(1)


def list_scan(succ, values, op: str = "sum", *, exclusive: bool = False, origin: str = "head",
              method: str = "auto", stride=None, check: bool = True, device: str | None = None):
    """Prefix ``op`` of ``values`` along every list of ``succ`` (module docstring).

    Parameters
    ----------
    succ : 1-D integer array
        The successor of each element; -1 at a tail (NumPy or CuPy).
    values : 1-D array
        One value per element.
    op : {"sum", "min", "max"}
    exclusive : bool
        Leave each element's own value out: the head's entry is then the identity (0; +inf or the
        dtype's maximum for "min"; -inf or its minimum for "max").
    origin : {"head", "tail"}
        Scan from the head or from the tail.
    method, stride, check, device
        As :func:`list_rank`.

    Returns
    -------
    scanned : 1-D array
        On the input's device unless ``device`` is given.

    Examples
    --------
    >>> list_scan(np.array([2, -1, 1]), np.array([1, 10, 100])).tolist()  # the list 0 -> 2 -> 1
    [1, 111, 101]
    """
    if op not in OPS:
        raise InputError(f"unknown scan op {op!r}: choose one of {', '.join(OPS)}")
    code = OPS[op]
    out, _, prv = _prefix(succ, values, code, origin, method, stride, check, device)
    if exclusive and len(out):
        be = _Gpu() if not isinstance(out, np.ndarray) else _Cpu()
        out = be.shift(prv, out, _identity(code, out.dtype))
    return out
