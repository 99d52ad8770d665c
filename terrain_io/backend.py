"""Array-module and kernel selection: CuPy when a CUDA device is usable, else NumPy + numba.

In the manner of xarray-spatial's dispatch: public functions take ``device="auto"|"cpu"|"gpu"``
(or follow their input arrays) and call the matching implementation.
"""
from __future__ import annotations

import functools
import importlib
import os
import re
from pathlib import Path

import numpy as np

from .errors import DeviceError

DEVICES = ("auto", "cpu", "gpu")
KERNELS = Path(__file__).resolve().parent / "kernels"
EXACT_OPTIONS = ("--std=c++17", "--fmad=false")  # NVRTC options: no FMA contraction, the CPU's rounding bit for bit


def kernel_source(name: str) -> str:
    """The CUDA source ``terrain_io/kernels/<name>`` with its ``#include "x.cuh"`` lines replaced by
    those files: CuPy caches compiled kernels by their source text, so an edited header must be
    part of it (an include path would leave stale binaries in the cache)."""
    return re.sub(r'^#include "([\w.]+\.cuh)"$', lambda m: (KERNELS / m.group(1)).read_text(),
                  (KERNELS / name).read_text(), flags=re.M)


def kernel_struct(*fields) -> np.ndarray:
    """A struct argument of a CUDA kernel, passed by value: one 8-byte member per field, in order --
    a CuPy array gives its device pointer, a number an int64 (declare the members as pointers and
    ``long long``, so the C layout has no padding). CuPy passes a one-element NumPy array by value."""
    words = [f.data.ptr if hasattr(getattr(f, "data", None), "ptr") else int(f) for f in fields]
    return np.array([w & (2**64 - 1) for w in words], np.uint64).view(np.dtype((np.void, 8 * len(words))))


@functools.cache
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (``TERRAIN_DISABLE_GPU=1`` hides it)."""
    if os.environ.get("TERRAIN_DISABLE_GPU"):
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, CUDARuntimeError, missing driver libraries
        return False


def gpu_free_bytes() -> float:
    """The GPU memory a solve may take: 90% of the free memory and of what CuPy's pool holds unused."""
    import cupy

    free, _ = cupy.cuda.Device().mem_info
    return 0.9 * (free + cupy.get_default_memory_pool().free_bytes())


def start_gpu(device: str | None = "auto", then=None) -> None:
    """Where ``device`` may resolve to the GPU, look for it and create its CUDA context in a background
    thread: the driver's set-up (cuInit 0.2 s, the context 0.3 s on the H100, the GIL released) then
    overlaps the imports and the store's opening that come before a command's first GPU work;
    ``then()`` runs in that thread once the context is made (a command's first use of its kernels,
    ahead). Errors are left to that work."""
    import threading

    def create():
        try:
            if gpu_available():
                import cupy

                cupy.cuda.runtime.free(0)  # cudaFree(NULL): the primary context
                if then is not None:
                    then()
        except Exception:  # noqa: BLE001 -- the command's own GPU calls report it
            pass

    if (device or "auto").lower() in ("auto", "gpu"):
        threading.Thread(target=create, name="cuda-context", daemon=True).start()


def resolve_device(device: str | None = "auto") -> str:
    """Map ``auto|cpu|gpu`` to ``cpu`` or ``gpu``; a clear error for ``gpu`` without a usable GPU."""
    device = (device or "auto").lower()
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "gpu" if gpu_available() else "cpu"
    if device == "gpu" and not gpu_available():
        raise DeviceError("--device gpu: no usable CUDA GPU (CuPy missing or no device); use --device cpu")
    return device


def array_module(device: str):
    """numpy for ``cpu``, cupy for ``gpu`` (``device`` as returned by :func:`resolve_device`)."""
    if resolve_device(device) == "gpu":
        import cupy

        return cupy
    return np


def is_cupy(x) -> bool:
    """True when ``x`` is a CuPy array (without importing CuPy when it is not loaded)."""
    return type(x).__module__.startswith("cupy")


def device_of(*arrays, device: str | None = None) -> str:
    """The device to compute on: ``device`` if given (resolved), else the inputs' (``gpu`` if any is CuPy)."""
    if device is None:
        return "gpu" if any(is_cupy(a) for a in arrays) else "cpu"
    return resolve_device(device)


def to_device(x, device: str):
    """Copy ``x`` to ``device`` (no copy when it is already there)."""
    if resolve_device(device) == "gpu":
        import cupy

        return cupy.asarray(x)
    return to_host(x)


def to_host(x):
    """A NumPy array of ``x`` (CuPy arrays are copied back from the GPU)."""
    if is_cupy(x):
        return x.get()
    return np.asarray(x)


class Dispatch:
    """One operation's implementations by device (``cpu``, ``gpu``), in the manner of xarray-spatial's
    ``ArrayTypeFunctionMapping``: the table is written once beside the operation, instead of an
    ``if device == "gpu": from ._x_gpu import ...`` in each pipeline. Every entry takes the same
    arguments. An entry is a function, or ``"package.module:name"`` imported on first use (so a
    CuPy module loads only when a GPU run asks for it); a device without an entry is refused."""

    def __init__(self, operation: str, **by_device):
        if set(by_device) - {"cpu", "gpu"}:
            raise ValueError(f"{operation}: devices are cpu and gpu, got {sorted(by_device)}")
        self.operation = operation
        self._by_device = by_device

    def __getitem__(self, device: str):
        impl = self._by_device.get(device)
        if impl is None:
            raise DeviceError(f"{self.operation} has no {device.upper()} implementation: use --device cpu")
        if isinstance(impl, str):
            module, _, name = impl.partition(":")
            impl = self._by_device[device] = getattr(importlib.import_module(module), name)
        return impl
