"""Depression filling (``terrain fill``): the tiled pipeline in :mod:`.pipeline`, numba kernels in
:mod:`._cpu`, the in-core CuPy route in :mod:`._gpu`; :mod:`._tiled` holds what fill and the
depression hierarchy share (outlets, boundary-graph geometry, halo reads)."""
from .pipeline import TABLE_COLUMNS, FillResult, fill, fill_array, read_fill, write_table  # noqa: F401
