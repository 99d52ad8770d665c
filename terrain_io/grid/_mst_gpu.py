"""GPU tile phase of the grid MST: Boruvka on all tiles of a batch at once (CuPy RawModule).

Harish et al.'s data-parallel Boruvka as used by the terrain thesis (part II ch. 3), with the
strict edge order packed into 64-bit atomicMin keys (a float32 weight and a 22-bit edge code
instead of the thesis's 32-bit key with 10-bit weights), or, for float64 weights, two atomic
passes (weight, then code). Kernels: ``terrain_io/kernels/mst_tile.cu``. The result is the
tiles' spanning forests as a bitmask, bit for bit what the numba Kruskal computes; the CPU then
contracts them (``_mst_cpu.contract_tile``).

Transfers use pinned host buffers and a non-blocking stream; the pipeline calls :meth:`forest`
from a worker thread, so the GPU works on one batch while the CPU reads the next one from the
store and contracts the previous one.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_CTYPES = {"float32": "float", "float64": "double", "int8": "signed char", "uint8": "unsigned char",
           "int16": "short", "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int"}
_SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "mst_tile.cu"
_BLOCK = 256


class GpuTileForest:
    """Spanning forests of every T x T tile of a batch, computed on the GPU."""

    def __init__(self, tile: int, model, dtype):
        import cupy as cp

        dtype = np.dtype(dtype)
        if dtype.name not in _CTYPES:
            from ..errors import InputError

            raise InputError(f"GPU MST: unsupported elevation type {dtype}")
        self.cp = cp
        self.tile = int(tile)
        self.packed = model.fits_float32(dtype)
        options = (f"-DVAL_T={_CTYPES[dtype.name]}", f"-DKIND={model.kind}", f"-DPACKED={int(self.packed)}")
        module = cp.RawModule(code=_SOURCE.read_text(), options=options)
        self.k = {name: module.get_function(name)
                  for name in ("find_min", "find_min_code", "hook", "break_pairs", "find_roots")}
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.lock = threading.Lock()
        self._pinned: dict = {}
        self.kernel_seconds = 0.0  # GPU time of the Boruvka loops (CUDA events)
        self.rounds = 0

    def _pin(self, name, shape, dtype):
        import cupyx

        key = (name, tuple(shape), np.dtype(dtype).str)
        buf = self._pinned.get(key)
        if buf is None:
            buf = self._pinned[key] = cupyx.empty_pinned(shape, dtype)
        return buf

    def forest(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """uint8 bitmask (bit d: forward direction d) of the tiles' minimum spanning forests."""
        cp = self.cp
        H, W = values.shape
        n = H * W
        T = np.int32(self.tile)
        grid = ((n + _BLOCK - 1) // _BLOCK,)
        with self.lock, self.stream:
            h_vals = self._pin("vals", values.shape, values.dtype)
            h_valid = self._pin("valid", valid.shape, np.bool_)
            h_vals[...] = values
            h_valid[...] = valid
            d_vals = cp.empty(values.shape, values.dtype)
            d_valid = cp.empty(valid.shape, cp.bool_)
            d_vals.set(h_vals, stream=self.stream)
            d_valid.set(h_valid, stream=self.stream)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(self.stream)
            comp = cp.where(d_valid.ravel(), cp.arange(n, dtype=cp.int32), cp.int32(-1))
            parent = comp.copy()
            bits = cp.zeros(n, dtype=cp.uint32)
            best = cp.empty(n, dtype=cp.uint64)
            best_code = cp.empty(n if not self.packed else 1, dtype=cp.uint32)
            changed = cp.zeros(1, dtype=cp.int32)
            h_changed = self._pin("changed", (1,), np.int32)
            args_dim = (np.int32(H), np.int32(W), T)
            while True:
                best.fill(np.uint64(0xFFFFFFFFFFFFFFFF))
                self.k["find_min"](grid, (_BLOCK,), (d_vals, d_valid, comp, best) + args_dim)
                if not self.packed:
                    best_code.fill(np.uint32(0xFFFFFFFF))
                    self.k["find_min_code"](grid, (_BLOCK,), (d_vals, d_valid, comp, best, best_code) + args_dim)
                changed.fill(0)
                self.k["hook"](grid, (_BLOCK,), (comp, best, best_code, parent, bits, changed) + args_dim)
                if not self._flag(changed, h_changed):
                    break
                self.rounds += 1
                self.k["break_pairs"](grid, (_BLOCK,), (comp, parent, np.int64(n)))
                self.k["find_roots"](grid, (_BLOCK,), (parent, np.int64(n)))
                comp[...] = parent
            out = bits.astype(cp.uint8).reshape(H, W)
            stop.record(self.stream)
            h_bits = self._pin("bits", (H, W), np.uint8)
            out.get(out=h_bits, stream=self.stream)
            self.stream.synchronize()
            self.kernel_seconds += cp.cuda.get_elapsed_time(start, stop) / 1000.0
            return np.array(h_bits)

    def _flag(self, changed, h_changed) -> bool:
        changed.get(out=h_changed, stream=self.stream)
        self.stream.synchronize()
        return bool(h_changed[0])
