"""In-memory algorithms for general graphs, on NumPy (numba) or CuPy arrays.

Plain array API in the manner of scipy.sparse.csgraph: inputs are NumPy or CuPy arrays (successor
arrays, CSR ``indptr/indices``, edge lists) or scipy/cupyx sparse matrices; results come back on
the input's device unless ``device=`` says otherwise.
"""

from .apsp import NegativeCycleError, apsp, minplus, reconstruct_path  # noqa: E402,F401
from .mst import SpanningForest, minimum_spanning_forest  # noqa: E402,F401
from . import generate  # noqa: E402,F401
from .bfs import bfs  # noqa: E402,F401
from .components import connected_components  # noqa: E402,F401
from .listrank import list_rank, list_scan  # noqa: E402,F401
