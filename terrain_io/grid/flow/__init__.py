"""Flow routing (``terrain flow``): D8 directions with flats resolved (Barnes, Lehman & Mulla 2014)
and flow accumulation, in core and tile by tile (:mod:`.pipeline`); codes in :mod:`.codes`, numba
kernels in :mod:`._cpu`, CuPy kernels in :mod:`._gpu`, in-memory rasters in :mod:`.array`."""
from .array import flow_accumulation, flow_direction  # noqa: F401
