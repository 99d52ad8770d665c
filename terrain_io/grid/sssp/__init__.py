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


def warm_gpu(store, weight: str | None) -> None:
    """``terrain sssp``'s first GPU work made ready ahead, in ``start_gpu``'s thread once the CUDA
    context is made (as the MST's ``warm``): the engine run on a 3 x 3 raster of the store's type --
    its kernels loaded from CuPy's cache, CuPy's own first imports (~0.25 s at the solve's start
    else) -- and nvCOMP set up. Errors are left to the command."""
    import cupy as cp

    from ... import nvzstd
    from ...store import TerrainStore
    from .array import cost_distance

    dtype = TerrainStore.open(store, mode="r").dtype
    cost_distance(cp.ones((3, 3), dtype), (1, 1), weight=weight or "absdiff", device="gpu")
    nvzstd.decoder(), nvzstd.encoder()
