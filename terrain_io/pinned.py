"""Page-locked (pinned) host buffers for the in-core GPU pipelines' bands of shard rows (``fill``,
``sssp --method incore``), made once a run and reused for every band.

A band copied to or from a fresh NumPy array crosses the bus twice slower or worse: the driver stages
a pageable copy through its own pinned buffer, and the new array's pages fault in on first touch.
Into a pinned buffer the copy is one DMA; the shard threads decode into it and encode from views of
it directly. Kept sets: a band's writers still read set k while the next band comes back into set
k + 1 (``sets`` = bands in flight + 1); a buffer copied to the GPU is refilled only after
:meth:`PinnedBands.uploaded`.
"""
from __future__ import annotations

import math

import numpy as np


class PinnedBands:
    """Pinned host buffers by (set, name), grown on demand: :meth:`buffer` and :meth:`download`."""

    def __init__(self, sets: int = 2):
        self.sets = max(1, int(sets))
        self._buffers: dict = {}

    def buffer(self, band: int, name, shape, dtype) -> np.ndarray:
        """A pinned array of ``shape`` and ``dtype`` for ``band`` (its set: band % sets), reused: a
        view of the set's buffer for ``name``, which holds what it held before."""
        import cupyx

        dtype, n = np.dtype(dtype), math.prod(shape)
        key = (band % self.sets, name)
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != dtype or buf.size < n:
            buf = self._buffers[key] = cupyx.empty_pinned(n, dtype)
        return buf[:n].reshape(shape)

    def download(self, band: int, arrays) -> list[np.ndarray]:
        """Device arrays -> their pinned host copies (views valid until band + sets reuses the set);
        every copy is complete when this returns."""
        import cupy

        out = []
        for i, a in enumerate(arrays):
            host = self.buffer(band, i, a.shape, a.dtype)
            a.get(out=host)
            out.append(host)
        cupy.cuda.Device().synchronize()
        return out

    @staticmethod
    def uploaded() -> None:
        """Wait until every copy queued to the GPU is done: CuPy copies from a pinned array
        asynchronously, straight from it, so a band's buffer is refilled only after this (measured: a
        32768^2 fill whose next band was decoded into the buffer under the copy read other values)."""
        import cupy

        cupy.cuda.Device().synchronize()

    def close(self) -> None:
        self._buffers.clear()
