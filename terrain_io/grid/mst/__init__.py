"""Minimum spanning forest of the DEM grid graph (``terrain mst``): the tiled pipeline in
:mod:`.pipeline`, numba kernels in :mod:`._cpu`, CuPy tile phase in :mod:`._gpu`."""
from .pipeline import MSTResult, edge_list, mst, read_edges  # noqa: F401


def warm_gpu(store, weight: str) -> None:
    """``terrain mst``'s first GPU work made ready ahead, in ``start_gpu``'s thread (:func:`._gpu.warm`)."""
    from . import _gpu

    _gpu.warm(store, weight)
