"""Watersheds, basins, stream networks and HAND on flow directions (issue 30): numba kernels in
:mod:`._cpu`, in-memory rasters in :mod:`.array`."""
from .array import basins, hand, stream_links, stream_order, watershed  # noqa: F401
