"""Single-source shortest paths on a DEM's 8-connected grid graph (``terrain sssp``).

One home per method: :mod:`.engine` (the public :func:`sssp` and the choice of method),
:mod:`.incore` (the whole grid in memory; numba :mod:`._incore_cpu`, CuPy :mod:`._incore_gpu`),
:mod:`.pipeline` (the three phases of Gerritsen 2012, part III: docs/ARCHITECTURE.md#sssp-index-pipeline,
over the stored boundary index of
:mod:`.index`; kernels :mod:`._pipeline_cpu`, :mod:`._pipeline_gpu`, merge :mod:`._merge`) and
:mod:`.path` (tracing predecessors back to a source); what every method writes, and its types and
constants, in :mod:`.result`.
"""
from .engine import METHODS, sssp  # noqa: F401
from .result import SSSPResult  # noqa: F401
