"""Watersheds, basins, stream networks and HAND on flow directions (issue 30): numba kernels in
:mod:`._cpu`, in-memory rasters in :mod:`.array` (imported on first use)."""
import threading

from ...lazy import exports

exports(__name__, dict.fromkeys(("basins", "hand", "stream_links", "stream_order", "watershed"), ".array"))

_loading: dict = {}  # wide -> the thread loading the link kernels (one a process)


def start_link_kernels(wide: bool = False) -> threading.Thread:
    """The GPU route's CPU kernels of the links (their orders, :func:`._cpu.link_orders`; walks and
    points for the vectors) loaded from numba's cache in a background thread, once a process;
    ``wide``: magnitudes of a DEM of 2^32 cells or more (uint64). Here, importing neither numba nor
    the pipelines: ``terrain streams`` starts it with its first instruction, so that numba's import and
    the cache's loads (~0.45 s holding the GIL, 2-core VM) run beside the imports and the CUDA context's
    creation rather than beside the arrays' read, whose threads they starved of the GIL (H100: a
    read of 1.1-1.2 s in a fresh process against 0.35 s in a warm one). Errors are left to the route's
    own calls of the kernels."""
    if wide not in _loading:
        _loading[wide] = threading.Thread(target=_load, args=(wide,), name="link-kernels")  # (not a daemon:
        _loading[wide].start()  # never cut while numba writes its cache)
    return _loading[wide]


def _load(wide: bool) -> None:
    try:
        import numpy as np

        from . import _cpu

        _cpu.link_orders(np.zeros(1, np.uint32), np.zeros(1, np.uint8), np.zeros(1, np.uint64 if wide else np.uint32))
        one = np.zeros(1, np.int64)
        _cpu.walk_links(np.zeros((1, 1), np.uint8), 0, 0, 1, one, one.copy(), one.copy(), one.copy())
        _cpu.link_points(one, np.array([0, 1]), 1, np.zeros(6), np.zeros((2, 2)), np.zeros(25, np.uint8), np.zeros(1))
    except Exception:  # noqa: BLE001 -- the route's own calls of these kernels report it
        pass


def warm_gpu() -> None:
    """The GPU route's network kernels used once on a tiny grid (:func:`._gpu.warm_up`)."""
    from . import _gpu

    _gpu.warm_up()
