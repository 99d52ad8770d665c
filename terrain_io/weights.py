"""Edge-weight models of the grid graph (DESIGN.md "Edge weights").

A DEM becomes a graph whose vertices are the valid cells, each joined to its 8 neighbours; a
weight model turns the two endpoint elevations (and, for some models, the step length) into an
edge weight. Models are named and pluggable: :func:`register` adds one, :func:`get` finds one by
name. Every model computes in float64 from the stored values, the same way on every backend, so
that the strict edge order (weight, smaller cell id, larger cell id) -- and with it the MST -- is
the same bit for bit on the CPU and the GPU.

Each model carries ``kind``, a small integer that the compiled kernels (numba, CUDA) switch on:
the kernels cannot call Python, so a new model adds its formula to :func:`edge_weight` (numba)
and to the CUDA sources, keyed by a new ``kind``. The SSSP models ``surface`` and ``cell`` of
the design will take kinds 2 and 3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from .errors import InputError

MAX = 0
ABSDIFF = 1
SURFACE = 2
CELL = 3

# The 8-neighbourhood, direction codes 0=E, 1=SE, 2=S, 3=SW, 4=W, 5=NW, 6=N, 7=NE (row grows
# southward; d and d ^ 4 are opposite). The CUDA kernels have the same in kernels/grid.cuh.
DR = np.array([0, 1, 1, 1, 0, -1, -1, -1], dtype=np.int64)
DC = np.array([1, 1, 0, -1, -1, -1, 0, 1], dtype=np.int64)


@dataclass(frozen=True)
class WeightModel:
    """A named edge-weight model.

    ``kind`` selects the formula in the compiled kernels; ``symmetric`` says w(a, b) == w(b, a);
    ``uses_step`` says the weight depends on the step length (cell size, diagonal or not).
    """

    name: str
    kind: int
    description: str
    symmetric: bool = True
    uses_step: bool = False

    def __call__(self, h_a, h_b, step=1.0):
        """Weights of edges with endpoint elevations ``h_a``, ``h_b`` (arrays), float64, NumPy."""
        return edge_weights(self.kind, np.asarray(h_a, dtype=np.float64), np.asarray(h_b, dtype=np.float64),
                            step)

    def fits_float32(self, dtype) -> bool:
        """True when every weight of this model on values of ``dtype`` is exactly a float32.

        Then a weight and a 32-bit edge code pack into one 64-bit key (the GPU's atomicMin).
        """
        dtype = np.dtype(dtype)
        small_int = dtype.kind in "iu" and dtype.itemsize <= 2  # |a - b| < 2**17 as well
        if self.kind == MAX:
            return dtype == np.float32 or small_int
        if self.kind == ABSDIFF:
            return small_int
        return False


_MODELS: dict[str, WeightModel] = {}


def register(model: WeightModel) -> WeightModel:
    """Add a model under its name (a new name only; kinds must be unique)."""
    if model.name in _MODELS or any(m.kind == model.kind for m in _MODELS.values()):
        raise ValueError(f"weight model {model.name!r} (kind {model.kind}) is already registered")
    _MODELS[model.name] = model
    return model


def get(name: str | WeightModel) -> WeightModel:
    """The model called ``name`` (a WeightModel passes through); InputError for unknown names."""
    if isinstance(name, WeightModel):
        return name
    try:
        return _MODELS[str(name).lower()]
    except KeyError:
        raise InputError(f"unknown weight model {name!r}: choose one of {', '.join(names())}") from None


def names() -> list[str]:
    return sorted(_MODELS)


register(WeightModel("max", MAX, "max(h_i, h_j): the height of the higher endpoint (terrain thesis, MST)"))
register(WeightModel("absdiff", ABSDIFF, "|h_i - h_j|: the height difference (terrain thesis, SSSP)"))
register(WeightModel("surface", SURFACE, "sqrt(step^2 + (h_i - h_j)^2): 3-D walking distance over the surface",
                     uses_step=True))
register(WeightModel("cell", CELL, "(c_i + c_j) / 2 * step over a cost raster c (GRASS r.cost, skimage MCP_Geometric)",
                     uses_step=True))


@numba.njit(inline="always", cache=True)
def edge_weight(kind, h_a, h_b, step):
    """The weight of one edge in float64 (compiled kernels call this; ``kind`` as in WeightModel)."""
    a = np.float64(h_a)
    b = np.float64(h_b)
    if kind == MAX:
        return a if a >= b else b
    if kind == SURFACE:
        return np.sqrt(step * step + (a - b) * (a - b))
    if kind == CELL:
        return (a + b) * 0.5 * step
    return abs(a - b)


def edge_weights(kind: int, h_a: np.ndarray, h_b: np.ndarray, step=1.0) -> np.ndarray:
    """Vectorised :func:`edge_weight` on NumPy float64 arrays."""
    if kind == MAX:
        return np.maximum(h_a, h_b)
    if kind == ABSDIFF:
        return np.abs(h_a - h_b)
    if kind == SURFACE:
        return np.sqrt(np.square(step) + np.square(h_a - h_b))
    if kind == CELL:
        return (h_a + h_b) * 0.5 * step
    raise ValueError(f"no weight formula for kind {kind}")
