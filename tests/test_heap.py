"""The grid kernels' 4-ary heap (terrain_io.grid._heap_cpu) against Python's heapq."""
import heapq

import numba
import numpy as np
import pytest

from terrain_io.grid._heap_cpu import heap_pop, heap_push, heap_replace


@numba.njit
def _run(ops, keys, items):
    """ops[i]: 0 push (keys[i], items[i]); 1 pop; 2 pop and push (keys[i], items[i]) by heap_replace.
    Returns what was popped, in order, then the rest drained."""
    hk = np.empty(ops.size + 1, np.float64)
    hv = np.empty(ops.size + 1, np.int64)
    out_k = np.empty(ops.size, np.float64)
    out_v = np.empty(ops.size, np.int64)
    n = m = 0
    for i in range(ops.size):
        if ops[i] == 0 or n == 0:
            heap_push(hk, hv, n, keys[i], items[i])
            n += 1
            continue
        out_k[m] = hk[0]
        out_v[m] = hv[0]
        m += 1
        if ops[i] == 1:
            heap_pop(hk, hv, n)
            n -= 1
        else:
            heap_replace(hk, hv, n, keys[i], items[i])
    while n > 0:
        out_k[m] = hk[0]
        out_v[m] = hv[0]
        m += 1
        heap_pop(hk, hv, n)
        n -= 1
    return out_k[:m], out_v[:m]


def _reference(ops, keys, items):
    heap, out = [], []
    for op, k, v in zip(ops, keys, items):
        if op == 0 or not heap:
            heapq.heappush(heap, (k, v))
        elif op == 1:
            out.append(heapq.heappop(heap))
        else:
            out.append(heapq.heapreplace(heap, (k, v)))
    while heap:
        out.append(heapq.heappop(heap))
    return out


@pytest.mark.parametrize("ties", [False, True])
def test_heap_pops_in_key_order_like_heapq(ties):
    rng = np.random.default_rng(7)
    size = 5000
    ops = rng.choice([0, 0, 1, 2], size=size).astype(np.int64)
    keys = (rng.integers(0, 20, size) if ties else rng.permutation(size)).astype(np.float64)
    items = np.arange(size, dtype=np.int64)
    got_k, got_v = _run(ops, keys, items)
    ref = _reference(ops.tolist(), keys.tolist(), items.tolist())
    assert got_k.tolist() == [k for k, _ in ref]
    if not ties:  # distinct keys: the same item at every step
        assert got_v.tolist() == [v for _, v in ref]
    else:  # equal keys may come out in another order, but every item once
        assert sorted(got_v.tolist()) == sorted(v for _, v in ref)
