"""Minimum spanning forest of the DEM grid graph (``terrain mst``): the tiled pipeline in
:mod:`.pipeline`, numba kernels in :mod:`._cpu`, CuPy tile phase in :mod:`._gpu`."""
from .pipeline import MSTResult, edge_list, mst, read_edges  # noqa: F401
