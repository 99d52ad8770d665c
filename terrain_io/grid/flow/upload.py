"""Whole arrays of a store read into the GPU, shard by shard in threads (``terrain flow``'s reader;
the hydrology's GPU route shares it). Imports neither numba nor the pipelines: a GPU command that
needs no CPU kernel starts without them."""
from __future__ import annotations

import concurrent.futures
import os
import threading

from .array import check_weights


def threads(store) -> int:
    """Reader (or writer) threads for ``store``: one a core, at most one a shard."""
    return max(1, min(os.cpu_count() or 1, len(list(store.shards()))))


def upload_held(store, source, wsrc, convert=None, timings=None):
    """The DEM (and the weights, checked) on the GPU: shards read in parallel threads, each uploaded
    as it arrives, so that the host holds a few shards and reading overlaps the copies. ``convert``
    (dtype, function of a block): each block converted in its reader thread before the upload (the
    hydrology's stream mask of the accumulation: an eighth of its bytes to copy). Where nvCOMP is
    installed, the DEM's chunks are decoded on the GPU instead (:func:`terrain_io.pinned.read_device`:
    only their zstd frames cross the bus; ``convert`` applied there; ``timings``: its parts)."""
    import cupy

    from ...pinned import read_device

    z_d = read_device(store, source, threads(store), convert, timings=timings) if wsrc is None else None
    if z_d is not None:
        return z_d, None
    dtype = (store.elevation if source == "elevation" else store.group[source]).dtype
    z_d = cupy.empty(store.shape, dtype if convert is None else convert[0])
    w_d = cupy.empty(store.shape, cupy.float64) if wsrc is not None else None
    lock = threading.Lock()  # a raster file's handle is not shared between threads

    def one(win):
        block = store.read(win, source)
        if w_d is not None:
            with lock:
                w = wsrc.read(win)
            check_weights(w, store.valid(block), w.shape)
            w_d[win.slices] = cupy.asarray(w)
        z_d[win.slices] = cupy.asarray(block if convert is None else convert[1](block))

    with concurrent.futures.ThreadPoolExecutor(threads(store)) as pool:
        list(pool.map(one, store.shards()))
    return z_d, w_d
