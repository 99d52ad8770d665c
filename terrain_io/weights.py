"""Edge-weight models of the grid graph (docs/ARCHITECTURE.md#edge-weights).

A DEM becomes a graph whose vertices are the valid cells, each joined to its 8 neighbours; a
weight model turns the two endpoint elevations (and, for some models, the step length) into an
edge weight. Models are named and pluggable: :func:`register` adds one, :func:`get` finds one by
name. Every model computes in float64 from the stored values, the same way on every backend, so
that the strict edge order (weight, smaller cell id, larger cell id) -- and with it the MST -- is
the same bit for bit on the CPU and the GPU.

Each model carries ``kind``, a small integer that the compiled kernels (numba, CUDA) switch on:
the kernels cannot call Python, so a new model adds its formula to
:func:`terrain_io._weights_cpu.edge_weight` (numba; a module of its own, so that the GPU's routes
do not import numba) and to the CUDA sources (kernels/grid.cuh), keyed by a new ``kind``.

``walk`` is directed: w(a, b) is the time to walk from a to b, which differs from b to a. The
kernels always call the weight with the edge's tail first. ``walk_friction`` (``--weight walk
--cost FRICTION``) needs two numbers a cell: its values pack the float32 elevation and friction into
the two halves of one float64 (:func:`pack_walk_friction`), so every kernel, line and index keeps
one value a cell; a packed value is never NaN, and a cell that is no vertex is NaN as always.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError

MAX = 0
ABSDIFF = 1
SURFACE = 2
CELL = 3
WALK = 4
WALK_FRICTION = 5

# The 8-neighbourhood, direction codes 0=E, 1=SE, 2=S, 3=SW, 4=W, 5=NW, 6=N, 7=NE (row grows
# southward; d and d ^ 4 are opposite). The CUDA kernels have the same in kernels/grid.cuh.
DR = np.array([0, 1, 1, 1, 0, -1, -1, -1], dtype=np.int64)
DC = np.array([1, 1, 0, -1, -1, -1, 0, 1], dtype=np.int64)


def steps_of(dx: float, dy: float) -> np.ndarray:
    """Step lengths of the 8 directions (DR, DC) for cell size (dx, dy)."""
    diag = float(np.hypot(dx, dy))
    return np.array([dx, diag, dy, diag, dx, diag, dy, diag], dtype=np.float64)


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


def sssp_model(name: str | WeightModel) -> WeightModel:
    """The model called ``name`` if shortest paths may use it (not ``max``); else InputError."""
    model = get(name)
    if model.kind == MAX:
        usable = ", ".join(n for n in names() if _MODELS[n].kind != MAX)
        raise InputError(f"weight model {model.name!r} is not an SSSP model: use {usable}")
    return model


register(WeightModel("max", MAX, "max(h_i, h_j): the height of the higher endpoint (the MST default)"))
register(WeightModel("absdiff", ABSDIFF, "|h_i - h_j|: the height difference (the SSSP default)"))
register(WeightModel("surface", SURFACE, "sqrt(step^2 + (h_i - h_j)^2): 3-D walking distance over the surface",
                     uses_step=True))
register(WeightModel("cell", CELL, "(c_i + c_j) / 2 * step over a cost raster c (GRASS r.cost, skimage MCP_Geometric)",
                     uses_step=True))
register(WeightModel("walk", WALK, "walking time in seconds from i to j: step / v with Tobler's hiking function "
                     "v = 6 exp(-3.5 |dh / step + 0.05|) km/h, dh = h_j - h_i (directed)",
                     symmetric=False, uses_step=True))
register(WeightModel("walk_friction", WALK_FRICTION, "walk's time times the mean (f_i + f_j) / 2 of a friction "
                     "raster f (--weight walk --cost FRICTION)", symmetric=False, uses_step=True))

def unusable_costs(cost) -> dict[str, int]:
    """How many ``cost`` values (NumPy or CuPy; the cells with data) make their cell a barrier -- no
    vertex, as GRASS r.cost treats null cost cells: nodata or NaN, negative, +inf."""
    return {"nodata or NaN": int((cost != cost).sum()), "negative": int((cost < 0).sum()),
            "infinite": int((cost == np.inf).sum())}


def note_barriers(counts: dict[str, int], label: str, stacklevel: int = 3) -> None:
    """One note (:class:`~terrain_io.errors.TerrainNote`) counting the barriers of
    :func:`unusable_costs`, if any."""
    n = sum(counts.values())
    if n:
        import warnings

        from .errors import TerrainNote

        parts = ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)
        warnings.warn(f"{label}: {n:,} cell{'s' if n > 1 else ''} of the DEM's data ha{'ve' if n > 1 else 's'} no "
                      f"usable cost ({parts}): barriers, not crossed", TerrainNote, stacklevel=stacklevel + 1)


def pack_walk_friction(elevation: np.ndarray, friction: np.ndarray) -> np.ndarray:
    """float64 values whose high half is the float32 elevation and low half the float32 friction;
    NaN where either is NaN. The high half is a finite float32, so the double is finite: its
    exponent field holds the float32's exponent, never all ones."""
    elevation, friction = elevation.astype(np.float32), friction.astype(np.float32)  # NumPy or CuPy
    hi = elevation.view(np.uint32).astype(np.uint64) << np.uint64(32)
    out = (hi | friction.view(np.uint32).astype(np.uint64)).view(np.float64)
    out[(elevation != elevation) | (friction != friction)] = np.nan
    return out
