"""Tables of one row a basin or a link (``basins --table``, ``streams --table``, the polygons' fields):
the columns that define a table held, the rest derived from them a block of rows at a time where they
are used, and the tables' CSV.

Issue 34: the basin table of a DEM routed with its pits kept has a row every ~15 cells (65536^2: 293 M
basins); built whole -- eight columns of 8 bytes -- it took 64 bytes a basin and the run peaked at
21.5 GiB under ``--memory 16GB``, then wrote its CSV through a Python loop a row at a time.
:func:`basin_table` holds each basin's terminal cell and cell count (``BASIN_BYTES``) and derives id,
row, column, centre and area a block at a time; :func:`write_csv` formats a block of rows with NumPy.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

BASIN_BYTES = 16  # the basin table held: each basin's terminal cell and cell count (int64)
TABLE_ROWS = 16384  # rows a block: its derived columns and their text (~150 bytes a row at most) at a time


class Table(Mapping):
    """``rows`` rows of named columns, each held (a 1-D array) or derived (a function of a slice of
    rows giving that block of the column). As a Mapping, ``table[name]`` is the whole column (derived
    on access); :meth:`blocks` gives every column a block of rows at a time."""

    def __init__(self, rows: int, columns: dict):
        self.rows, self._columns = rows, dict(columns)

    @classmethod
    def of(cls, table: Mapping) -> "Table":
        """``table`` as a Table: a Table, or a Mapping of equal-length arrays (held columns)."""
        if isinstance(table, Table):
            return table
        rows = len(next(iter(table.values()))) if table else 0
        return cls(rows, table)

    def block(self, name: str, rows: slice) -> np.ndarray:
        """Rows ``rows`` (a slice with a start and a stop) of column ``name``."""
        column = self._columns[name]
        return np.asarray(column(rows) if callable(column) else column[rows])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.block(name, slice(0, self.rows))

    def __iter__(self):
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def dtype(self, name: str) -> np.dtype:
        """Column ``name``'s type, without deriving it."""
        return self.block(name, slice(0, 0)).dtype

    def without(self, *names: str) -> "Table":
        return Table(self.rows, {k: v for k, v in self._columns.items() if k not in names})

    def blocks(self, rows: int = TABLE_ROWS) -> Iterator[tuple[slice, dict]]:
        """(the rows, name -> that block of the column) of every block of ``rows`` rows, in order."""
        for s in range(0, self.rows, rows):
            sl = slice(s, min(s + rows, self.rows))
            yield sl, {k: self.block(k, sl) for k in self._columns}


def basin_table(store, outlet: np.ndarray, counts: np.ndarray) -> Table:
    """The basin table of the terminal cells ``outlet`` (flat indices, row-major; index = id - 1)
    and their basins' cell ``counts``: id, outlet_row, outlet_col, outlet_x, outlet_y (the cell's
    centre in the store's CRS), cells, area_m2 -- all but cells derived on access."""
    cols = store.shape[1]
    dx, dy = store.metric_cell_size
    to_map = store.cell_to_map

    def cell(i: int):
        return lambda s: np.divmod(outlet[s], cols)[i]

    def centre(i: int):
        return lambda s: to_map(*np.divmod(outlet[s], cols))[i]

    return Table(len(outlet), {"id": lambda s: np.arange(s.start + 1, s.stop + 1), "outlet_row": cell(0),
                               "outlet_col": cell(1), "outlet_x": centre(0), "outlet_y": centre(1), "cells": counts,
                               "area_m2": lambda s: counts[s] * dx * dy})


def _text(values: np.ndarray) -> np.ndarray:
    """Each value as Python's ``str`` of its ``.item()`` writes it (bytes): integers, ``True``/``False``,
    floats as float64 in their shortest repr (NumPy's Dragon4 gives repr's digits); a block's
    distinct floats (by their bits: -0.0 stays apart from 0.0) formatted once. The strings as wide
    as the longest (NumPy's are as wide as the type's longest: 21 bytes an int64, 32 a float)."""
    if values.dtype.kind != "f":
        text = values.astype("S")
    else:
        bits = np.ascontiguousarray(values, np.float64).view(np.uint64)
        distinct, at = np.unique(bits, return_inverse=True)
        text = distinct.view(np.float64).astype("S")[at.reshape(-1)]
    return text.astype(f"S{max(1, int(np.char.str_len(text).max(initial=0)))}")


def write_csv(table: Mapping, path, progress: bool = False) -> Path:
    """``table`` (a :class:`Table` or a Mapping of columns) as CSV: the column names, then a line a row,
    the same bytes as Python's csv module writing each value's ``.item()`` (floats by ``repr``; lines
    end in CRLF) -- formatted a block of ``TABLE_ROWS`` rows at a time by NumPy, written under a
    temporary name renamed when complete."""
    from ...atomic import atomic_file
    from ...progress import progress_bar

    path, table = Path(path), Table.of(table)
    with atomic_file(path) as tmp, open(tmp, "wb") as f, progress_bar(progress, table.rows, "table", unit="row") as bar:
        f.write(",".join(table).encode() + b"\r\n")
        for rows, block in table.blocks():
            line = None
            for values in block.values():
                text = _text(values)
                line = text if line is None else np.char.add(np.char.add(line, b","), text)
            f.write(b"\r\n".join(line.tolist()) + b"\r\n")
            bar.update(rows.stop - rows.start)
    return path
