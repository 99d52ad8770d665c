"""Terrain pipelines on the DEM grid graph: minimum spanning forest (``mst``), shortest paths
(``sssp`` on a store, ``cost_distance`` on an in-memory array), each imported on first use."""
from ..lazy import exports

exports(__name__, {"mst": ".mst", "MSTResult": ".mst", "sssp": ".sssp", "SSSPResult": ".sssp",
                   "cost_distance": ".sssp.array", "flow_accumulation": ".flow", "flow_direction": ".flow"},
        shadowed=("mst", "sssp"))
