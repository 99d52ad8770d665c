"""Terrain pipelines on the DEM grid graph: minimum spanning forest (``mst``), shortest paths (``sssp``)."""
from .mst import MSTResult, mst  # noqa: F401
from .sssp import SSSPResult, sssp  # noqa: F401
