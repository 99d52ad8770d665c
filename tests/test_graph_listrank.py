"""List ranking and list scan against a sequential walk (independent pure-Python reference)."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.backend import to_device, to_host
from terrain_io.errors import InputError
from terrain_io.graph import _csr, generate
from terrain_io.graph.listrank import list_rank, list_scan

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
METHODS = ["auto", "wyllie", "helman_jaja", "recursive_hj", "sequential"]


def walk_lists(succ):
    """Lists of element ids from head to tail, by a plain Python walk."""
    succ = np.asarray(succ)
    has_pred = np.zeros(len(succ), bool)
    has_pred[succ[succ >= 0]] = True
    lists = []
    for h in np.flatnonzero(~has_pred):
        seq, j = [], h
        while j >= 0:
            seq.append(j)
            j = succ[j]
        lists.append(seq)
    return lists


def reference_scan(succ, values, op, exclusive=False, origin="head"):
    fn = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]
    out = np.empty(len(succ), dtype=np.asarray(values).dtype)
    for seq in walk_lists(succ):
        if origin == "tail":
            seq = seq[::-1]
        acc = fn.accumulate(np.asarray(values)[seq])
        if exclusive:
            ident = {"sum": 0, "min": np.inf, "max": -np.inf}[op]
            if np.asarray(values).dtype.kind != "f" and op != "sum":
                info = np.iinfo(out.dtype)
                ident = info.max if op == "min" else info.min
            acc = np.concatenate([[ident], acc[:-1]])
        out[seq] = acc
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n,n_lists,ordered", [(1, 1, False), (7, 7, False), (3000, 1, False), (3000, 1, True),
                                               (50_000, 1, False), (50_000, 997, False), (50_000, 50, True)])
def test_rank_matches_walk(device, method, n, n_lists, ordered):
    succ = generate.random_list(n, n_lists, seed=n + n_lists, ordered=ordered)
    expected = np.empty(n, np.int64)
    for seq in walk_lists(succ):
        expected[seq] = np.arange(len(seq))
    got = list_rank(to_device(succ, device), method=method)
    assert type(got) is type(to_device(succ, device))
    np.testing.assert_array_equal(to_host(got), expected)
    lengths = np.empty(n, np.int64)
    for seq in walk_lists(succ):
        lengths[seq] = len(seq)
    tail = list_rank(to_device(succ, device), method=method, origin="tail")
    np.testing.assert_array_equal(to_host(tail), lengths - 1 - expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride", [2, 3, 64])
def test_rank_any_stride(device, stride):
    succ = generate.random_list(20_000, 13, seed=stride)
    ref = list_rank(succ, method="sequential")
    got = list_rank(to_device(succ, device), method="recursive_hj", stride=stride)
    np.testing.assert_array_equal(to_host(got), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "min", "max"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("exclusive,origin", [(False, "head"), (True, "head"), (False, "tail"), (True, "tail")])
def test_scan_matches_walk(device, op, dtype, exclusive, origin):
    rng = np.random.default_rng(5)
    succ = generate.random_list(20_000, 31, seed=3)
    values = rng.integers(-50, 50, len(succ)).astype(dtype)
    expected = reference_scan(succ, values, op, exclusive, origin)
    for method in ("auto", "wyllie", "helman_jaja"):
        got = list_scan(to_device(succ, device), to_device(values, device), op=op, exclusive=exclusive,
                        origin=origin, method=method)
        assert to_host(got).dtype == np.dtype(dtype)
        np.testing.assert_allclose(to_host(got), expected, rtol=1e-6)


def test_int64_index_path(monkeypatch):
    monkeypatch.setattr(_csr, "INT32_LIMIT", 1000)
    succ = generate.random_list(30_000, 3, seed=1)
    assert succ.dtype == np.int64
    ranks = list_rank(succ.astype(np.int64))
    assert ranks.dtype == np.int64
    monkeypatch.undo()
    np.testing.assert_array_equal(ranks, list_rank(succ.astype(np.int32), method="sequential"))


@pytest.mark.gpu
def test_int64_index_path_gpu(monkeypatch):
    monkeypatch.setattr(_csr, "INT32_LIMIT", 1000)
    succ = generate.random_list(30_000, 3, seed=1)
    got = list_rank(to_device(succ, "gpu"))
    assert got.dtype == np.int64
    monkeypatch.undo()
    np.testing.assert_array_equal(to_host(got), list_rank(succ, method="sequential"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_malformed_lists(device, method):
    ring = np.roll(np.arange(10_000), -1)          # one big cycle
    with pytest.raises(InputError, match="cycle"):
        list_rank(to_device(ring, device), method=method)
    ring_and_list = np.concatenate([np.roll(np.arange(5), -1), [6, 7, -1]])  # small cycle + a list
    with pytest.raises(InputError, match="cycle"):
        list_rank(to_device(ring_and_list, device), method=method)
    with pytest.raises(InputError, match="malformed"):
        list_rank(to_device(np.array([1, 2, 2, -1]), device), method=method)   # shared successor
    with pytest.raises(InputError, match="malformed"):
        list_rank(to_device(np.array([1, 5, -1]), device), method=method)      # out of range
    with pytest.raises(InputError, match="malformed"):
        list_rank(to_device(np.array([1, -7, -1]), device), method=method)     # bad tail marker


def test_empty_and_bad_args():
    assert len(list_rank(np.empty(0, np.int64))) == 0
    with pytest.raises(InputError):
        list_rank(np.zeros(3), method="auto")                  # float successors
    with pytest.raises(InputError):
        list_rank(np.array([-1]), method="nope")
    with pytest.raises(InputError):
        list_scan(np.array([-1]), np.ones(1), op="mul")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("list_length", [1, 2, 3])
def test_many_short_lists(device, list_length):
    """Lists so short that every head is a splitter: the reduced lists do not shrink (the recursive
    method once recursed until Python's stack ran out)."""
    n = 20_000 - 20_000 % list_length
    succ = generate.random_list(n, n // list_length, seed=list_length)
    expected = np.empty(n, np.int64)
    for seq in walk_lists(succ):
        expected[seq] = np.arange(len(seq))
    values = np.arange(n, dtype=np.float64)
    for method in ("auto", "recursive_hj", "helman_jaja"):
        np.testing.assert_array_equal(to_host(list_rank(to_device(succ, device), method=method)), expected)
        got = list_scan(to_device(succ, device), to_device(values, device), method=method)
        np.testing.assert_array_equal(to_host(got), reference_scan(succ, values, "sum"))
