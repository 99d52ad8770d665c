"""The depression hierarchy (``terrain depressions``): the tiled pipeline in :mod:`.pipeline`,
numba kernels in :mod:`._cpu`; blocks and boundary nodes are those of :mod:`..fill`."""
from .pipeline import TABLE_COLUMNS, DepressionsResult, depressions, read_basins, write_table  # noqa: F401
