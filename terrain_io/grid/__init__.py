"""Terrain pipelines on the DEM grid graph: minimum spanning forest (``mst``), shortest paths
(``sssp`` on a store, ``cost_distance`` on an in-memory array)."""
from .mst import MSTResult, mst  # noqa: F401
from .sssp import SSSPResult, sssp  # noqa: F401
from .sssp.array import cost_distance  # noqa: F401
from .flow import flow_accumulation, flow_direction  # noqa: F401
