"""The basin table (``basins --table``, the polygons' fields) as a :class:`terrain_io.tables.Table`.

Issue 34: the basin table of a DEM routed with its pits kept has a row every ~15 cells (65536^2: 293 M
basins); built whole -- eight columns of 8 bytes -- it took 64 bytes a basin and the run peaked at
21.5 GiB under ``--memory 16GB``. :func:`basin_table` holds each basin's terminal cell and cell count
(``BASIN_BYTES``) and derives id, row, column, centre and area a block at a time.
"""
from __future__ import annotations

import numpy as np

from ...tables import Table, cell_columns, row_ids

BASIN_BYTES = 16  # the basin table held: each basin's terminal cell and cell count (int64)


def basin_table(store, outlet: np.ndarray, counts: np.ndarray) -> Table:
    """The basin table of the terminal cells ``outlet`` (flat indices, row-major; index = id - 1)
    and their basins' cell ``counts``: id, outlet_row, outlet_col, outlet_x, outlet_y (the cell's
    centre in the store's CRS), cells, area_m2 -- all but cells derived on access."""
    dx, dy = store.metric_cell_size
    return Table(len(outlet), {"id": row_ids, **cell_columns(store, outlet, "outlet"), "cells": counts,
                               "area_m2": lambda s: counts[s] * dx * dy})
