"""Edge-list input and output for the general-graph commands.

Formats:
- CSV ``u,v[,w]`` (comma, whitespace or semicolon separated), with or without a header line; this
  covers the Kruskal report's edge lists (source, target, weight) and their ``*_gt.csv`` ground
  truth files.
- ``.npz`` holding arrays ``u``/``v``[/``w``] (aliases ``src``/``dst``/``weight``, ``source``/
  ``target``), or ``indptr``/``indices``[/``data``] (CSR); loaded with ``allow_pickle=False``.
Vertex ids are non-negative integers; the vertex count is ``max id + 1`` unless given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_file
from ..errors import InputError

_ALIASES = (("u", "v", "w"), ("src", "dst", "weight"), ("source", "target", "weight"))


@dataclass
class EdgeList:
    """Edges ``u[i] -- v[i]`` with optional weights ``w[i]`` on ``n`` vertices (ids 0..n-1)."""

    u: np.ndarray
    v: np.ndarray
    w: np.ndarray | None
    n: int

    @property
    def m(self) -> int:
        return len(self.u)

    def to_csr(self, symmetric: bool = True):
        """scipy CSR adjacency (both directions when ``symmetric``); weights 1 when unweighted."""
        import scipy.sparse as sp

        u, v = self.u, self.v
        w = self.w if self.w is not None else np.ones(len(u), dtype=np.float64)
        if symmetric:
            u, v, w = np.concatenate([u, v]), np.concatenate([v, u]), np.concatenate([w, w])
        return sp.csr_matrix((w, (u, v)), shape=(self.n, self.n))


def _check_ids(u: np.ndarray, v: np.ndarray, n: int | None, where: str) -> int:
    if len(u) and (u.min() < 0 or v.min() < 0):
        raise InputError(f"{where}: negative vertex id")
    top = int(max(u.max(), v.max())) + 1 if len(u) else 0
    if n is None:
        n = top
    elif top > n:
        raise InputError(f"{where}: vertex id {top - 1} out of range for {n} vertices")
    return n


def _as_ids(x: np.ndarray, where: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind == "f":
        if not np.all(np.isfinite(x)) or np.any(x != np.round(x)):
            raise InputError(f"{where}: vertex ids must be integers")
    elif x.dtype.kind not in "iu":
        raise InputError(f"{where}: vertex ids must be integers, got {x.dtype}")
    return x.astype(np.int64)


def _check_weights(w: np.ndarray, where: str) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype.kind not in "iuf":
        raise InputError(f"{where}: weights must be numbers, got {w.dtype}")
    if w.dtype.kind == "f" and np.isnan(w).any():
        raise InputError(f"{where}: NaN weight")
    return w


def read_edge_list(path, n: int | None = None) -> EdgeList:
    """Read a CSV or .npz edge list (see module docstring). Raises InputError on malformed files."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() == ".npz":
        return _read_npz(path, n)
    return _read_csv(path, n)


def _read_npz(path: Path, n: int | None) -> EdgeList:
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{path}: not a readable .npz file ({exc})") from None
    with data:
        keys = set(data.files)
        if {"indptr", "indices"} <= keys:
            indptr, indices = _as_ids(data["indptr"], str(path)), _as_ids(data["indices"], str(path))
            if len(indptr) == 0 or indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != len(indices):
                raise InputError(f"{path}: malformed CSR indptr")
            u = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
            w = _check_weights(data["data"], str(path)) if "data" in keys else None
            n = max(n or 0, len(indptr) - 1)
            return EdgeList(u, indices, w, _check_ids(u, indices, n, str(path)))
        for a, b, c in _ALIASES:
            if {a, b} <= keys:
                u, v = _as_ids(data[a], str(path)), _as_ids(data[b], str(path))
                if u.shape != v.shape or u.ndim != 1:
                    raise InputError(f"{path}: arrays {a!r} and {b!r} must be 1-D of equal length")
                w = _check_weights(data[c], str(path)) if c in keys else None
                if w is not None and w.shape != u.shape:
                    raise InputError(f"{path}: weight array length differs from the edge count")
                return EdgeList(u, v, w, _check_ids(u, v, n, str(path)))
    raise InputError(f"{path}: .npz needs arrays u,v[,w] (or src,dst / source,target) or indptr,indices")


def _read_csv(path: Path, n: int | None) -> EdgeList:
    """Fast path for large files: one C-level parse (np.loadtxt) once the first lines show the layout;
    any irregular file goes through the line-by-line reader, which names the offending line."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        head = [line.strip() for _, line in zip(range(200), f)]
    data = [x for x in head if x and not x.startswith("#") and _split_fields(x)]
    if not data:
        return _read_csv_lines(path, n)
    skip = 0 if _numeric(_split_fields(data[0])[0]) else 1
    first = data[skip:skip + 100]
    seps = {sep for line in first for sep in (",", ";") if sep in line}
    widths = {len(_split_fields(line)) for line in first}
    if not first or len(seps) > 1 or len(widths) != 1 or widths.pop() not in (2, 3):
        return _read_csv_lines(path, n)
    try:
        arr = np.loadtxt(path, delimiter=seps.pop() if seps else None, comments="#", ndmin=2, dtype=np.float64,
                         skiprows=_header_row(path) + 1 if skip else 0)
    except ValueError:
        return _read_csv_lines(path, n)
    if arr.shape[0] == 0 or arr.shape[1] not in (2, 3):
        return _read_csv_lines(path, n)
    u, v = _as_ids(arr[:, 0], str(path)), _as_ids(arr[:, 1], str(path))
    w = _check_weights(arr[:, 2], str(path)) if arr.shape[1] == 3 else None
    if w is not None and np.all(w == np.round(w)) and not any(
            "." in f[2] or "e" in f[2].lower() for f in map(_split_fields, first)):
        w = w.astype(np.int64)
    return EdgeList(u, v, w, _check_ids(u, v, n, str(path)))


def _split_fields(line: str) -> list[str]:
    return [x for x in line.replace(";", ",").replace("\t", ",").replace(" ", ",").split(",") if x != ""]


def _header_row(path: Path) -> int:
    """Index (0-based, counting every line) of the header line: the first non-blank, non-comment line."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            if line.strip() and not line.strip().startswith("#"):
                return i
    return 0


def ground_truth_path(path) -> Path:
    """``XYZ_gt.csv`` beside ``XYZ.csv`` (the Kruskal report's ground-truth convention)."""
    path = Path(path)
    return path.with_name(f"{path.stem}_gt{path.suffix}")


def check_forest(forest: EdgeList, truth: EdgeList, distinct_weights: bool, rtol: float = 1e-9) -> list[str]:
    """Differences between a computed spanning forest and a ground-truth one ([] = they agree):
    forest size and total weight always, the edge set ({min, max} end pairs) when weights are distinct."""
    problems = []
    if forest.m != truth.m:
        problems.append(f"{forest.m} edges where the ground truth has {truth.m}")
    if (forest.w is None) != (truth.w is None):
        problems.append("one of the two forests has no weights")
    elif forest.w is not None:
        a, b = float(np.sum(forest.w, dtype=np.float64)), float(np.sum(truth.w, dtype=np.float64))
        if not np.isclose(a, b, rtol=rtol, atol=0.0):
            problems.append(f"total weight {a:.17g} where the ground truth has {b:.17g}")
    if distinct_weights and not problems:
        pairs = lambda e: set(zip(np.minimum(e.u, e.v).tolist(), np.maximum(e.u, e.v).tolist()))  # noqa: E731
        diff = pairs(forest) ^ pairs(truth)
        if diff:
            problems.append(f"{len(diff)} edges differ from the ground truth (weights are distinct)")
    return problems


def _read_csv_lines(path: Path, n: int | None) -> EdgeList:
    rows: list[list[str]] = []
    header_seen = False
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.replace(";", ",").replace("\t", ",").replace(" ", ",").split(",")
            fields = [x for x in fields if x != ""]
            if not fields:
                raise InputError(f"{path}:{lineno}: expected 'u,v' or 'u,v,w', got separators only")
            if not rows and not header_seen and not _numeric(fields[0]):
                header_seen = True
                continue  # the header line (only the first line may be one)
            if len(fields) not in (2, 3):
                raise InputError(f"{path}:{lineno}: expected 'u,v' or 'u,v,w', got {len(fields)} fields")
            if rows and len(fields) != len(rows[0]):
                raise InputError(f"{path}:{lineno}: {len(fields)} fields where earlier lines have {len(rows[0])}")
            if not all(_numeric(x) for x in fields):
                raise InputError(f"{path}:{lineno}: non-numeric field in {line!r}")
            rows.append(fields)
    if not rows:
        raise InputError(f"{path}: empty edge list")
    arr = np.array(rows, dtype=np.float64)
    u, v = _as_ids(arr[:, 0], str(path)), _as_ids(arr[:, 1], str(path))
    w = _check_weights(arr[:, 2], str(path)) if arr.shape[1] == 3 else None
    if w is not None and np.all(w == np.round(w)) and all("." not in r[2] and "e" not in r[2].lower() for r in rows[:100]):
        w = w.astype(np.int64)
    return EdgeList(u, v, w, _check_ids(u, v, n, str(path)))


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def write_edge_list(path, u, v, w=None, header: bool = True) -> None:
    """Write a CSV edge list ``source,target[,weight]`` atomically (temporary file, then rename)."""
    cols = [np.asarray(u), np.asarray(v)] + ([np.asarray(w)] if w is not None else [])
    names = "source,target" + (",weight" if w is not None else "")
    fmt = ["%d", "%d"] + (["%.17g" if np.asarray(w).dtype.kind == "f" else "%d"] if w is not None else [])
    with atomic_file(path) as tmp:
        np.savetxt(tmp, np.column_stack(cols).astype(object) if w is not None else np.column_stack(cols),
                   delimiter=",", fmt=fmt, header=names if header else "", comments="")
