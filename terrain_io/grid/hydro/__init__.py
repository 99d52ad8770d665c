"""Watersheds, basins, stream networks and HAND on flow directions (issue 30): numba kernels in
:mod:`._cpu`, in-memory rasters in :mod:`.array` (imported on first use)."""
from ...lazy import exports

exports(__name__, dict.fromkeys(("basins", "hand", "stream_links", "stream_order", "watershed"), ".array"))
