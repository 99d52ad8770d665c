"""Tables of one row an item (a depression, a basin, a link, a graph's vertex) and their CSV: the one
writer of every ``--table`` and of the graph commands' CSV.

A :class:`Table` holds the columns that define it and derives the rest from them a block of rows at a
time where they are used (issue 34: a 65536^2 basin table built whole took 64 bytes a basin);
:func:`write_csv` formats a block of rows with NumPy -- the bytes of Python's csv module writing each
value's ``.item()``, without its Python loop a row at a time.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

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


def row_ids(rows: slice) -> np.ndarray:
    """The ids of rows ``rows`` of a table numbered 1.. (a derived ``id`` column)."""
    return np.arange(rows.start + 1, rows.stop + 1)


def cell_columns(store, cells: np.ndarray, name: str) -> dict:
    """The derived columns ``NAME_row``, ``NAME_col`` (of the row-major cell ids ``cells``) and
    ``NAME_x``, ``NAME_y`` (the cells' centres in ``store``'s CRS) of a :class:`Table`; -1 and NaN
    where a cell id is negative (none)."""
    cols = store.shape[1]

    def column(i: int, centre: bool):
        def block(rows: slice) -> np.ndarray:
            at = cells[rows]
            has = at >= 0
            rc = np.divmod(at if has.all() else np.where(has, at, 0), cols)
            v = store.cell_to_map(*rc)[i] if centre else rc[i]
            return v if has.all() else np.where(has, v, np.nan if centre else -1)
        return block

    return {f"{name}_row": column(0, False), f"{name}_col": column(1, False), f"{name}_x": column(0, True),
            f"{name}_y": column(1, True)}


def _text(values: np.ndarray) -> np.ndarray:
    """Each value as Python's ``str`` of its ``.item()`` writes it (bytes): integers, ``True``/``False``,
    ASCII strings, floats as float64 in their shortest repr (NumPy's Dragon4 gives repr's digits); a
    block's distinct floats (by their bits: -0.0 stays apart from 0.0) formatted once. The strings as
    wide as the longest (NumPy's are as wide as the type's longest: 21 bytes an int64, 32 a float)."""
    if values.dtype.kind != "f":
        text = values.astype("S")
    else:
        bits = np.ascontiguousarray(values, np.float64).view(np.uint64)
        distinct, at = np.unique(bits, return_inverse=True)
        text = distinct.view(np.float64).astype("S")[at.reshape(-1)]
    return text.astype(f"S{max(1, int(np.char.str_len(text).max(initial=0)))}")


def write_csv(table: Mapping, path, progress: bool = False, newline: bytes = b"\r\n") -> Path:
    """``table`` (a :class:`Table` or a Mapping of columns) as CSV: the column names, then a line a row,
    the same bytes as Python's csv module writing each value's ``.item()`` (floats by ``repr``; lines
    end in CRLF, or ``newline``) -- formatted a block of ``TABLE_ROWS`` rows at a time by NumPy, written
    under a temporary name renamed when complete. Values are numbers, booleans or ASCII words without a
    comma or quote (nothing the csv module would quote)."""
    from .atomic import atomic_file
    from .progress import progress_bar

    path, table = Path(path), Table.of(table)
    with atomic_file(path) as tmp, open(tmp, "wb") as f, progress_bar(progress, table.rows, "table", unit="row") as bar:
        f.write(",".join(table).encode() + newline)
        for rows, block in table.blocks():
            line = None
            for values in block.values():
                text = _text(values)
                line = text if line is None else np.char.add(np.char.add(line, b","), text)
            f.write(newline.join(line.tolist()) + newline)
            bar.update(rows.stop - rows.start)
    return path
