"""Edge-weight models of the grid graph (docs/ARCHITECTURE.md#edge-weights).

A DEM becomes a graph whose vertices are the valid cells, each joined to its 8 neighbours; a
weight model turns the two endpoint elevations (and, for some models, the step length) into an
edge weight. Models are named and pluggable: :func:`register` adds one, :func:`get` finds one by
name. Every model computes in float64 from the stored values, the same way on every backend, so
that the strict edge order (weight, smaller cell id, larger cell id) -- and with it the MST -- is
the same bit for bit on the CPU and the GPU.

Each model carries ``kind``, a small integer that the compiled kernels (numba, CUDA) switch on:
the kernels cannot call Python, so a new model adds its formula to :func:`edge_weight` (numba)
and to the CUDA sources (kernels/grid.cuh), keyed by a new ``kind``.

``walk`` is directed: w(a, b) is the time to walk from a to b, which differs from b to a. The
kernels always call the weight with the edge's tail first. ``walk_friction`` (``--weight walk
--cost FRICTION``) needs two numbers a cell: its values pack the float32 elevation and friction into
the two halves of one float64 (:func:`pack_walk_friction`), so every kernel, line and index keeps
one value a cell; a packed value is never NaN, and a cell that is no vertex is NaN as always.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from numba import types
from numba.extending import intrinsic

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

# exp for the walk model from + - * / alone, so that numba and CUDA round every step alike and give
# the same bits (libm's and CUDA's exp may differ in the last place): Cody-Waite reduction
# x = k ln2 + r, |r| <= ln2 / 2, and the Taylor series of e^r to degree 13 (error < 1e-17).
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # trailing zeros: k * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
_EXP_TAYLOR = tuple(float.fromhex(h) for h in (  # 1/n! for n = 13 down to 2 (the same literals in grid.cuh)
    "0x1.6124613a86d09p-33", "0x1.1eed8eff8d898p-29", "0x1.ae64567f544e4p-26", "0x1.27e4fb7789f5cp-22",
    "0x1.71de3a556c734p-19", "0x1.a01a01a01a01ap-16", "0x1.a01a01a01a01ap-13", "0x1.6c16c16c16c17p-10",
    "0x1.1111111111111p-7", "0x1.5555555555555p-5", "0x1.5555555555555p-3", "0x1.0000000000000p-1"))


@numba.njit(inline="always", cache=True)
def portable_exp(x):
    """e^x for 0 <= x, the same bits on every device (module comment above); +inf beyond 709."""
    if x > 709.0:
        return np.inf
    k = np.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = _EXP_TAYLOR[0]
    for c in _EXP_TAYLOR[1:]:
        p = p * r + c
    p = (p * r + 1.0) * r + 1.0
    return np.ldexp(p, np.int64(k))


@numba.njit(cache=True)  # a call, not inlined into every edge_weight site: seconds less to compile
def walk_time(a, b, step):
    """Seconds to walk ``step`` metres from height a to height b (Tobler 1993, the hiking function)."""
    slope = (b - a) / step + 0.05
    return step * 0.6 * portable_exp(3.5 * abs(slope))  # 3.6 s/km-per-h * step / 6 km/h = 0.6 step


def _bitcast(name: str, source, target, doc: str):
    """A numba intrinsic ``name(x)``: the ``target`` value with the bits of the ``source`` value x
    (an LLVM bitcast, no memory round trip)."""
    def typer(typingctx, x):
        if x != source:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


float64_bits = _bitcast("float64_bits", types.float64, types.int64, "The IEEE-754 bits of a float64 as an int64.")
_float32_of_bits = _bitcast("_float32_of_bits", types.int32, types.float32,
                            "The float32 whose IEEE-754 bits are the int32 ``x``.")


@numba.njit(inline="always", cache=True)
def unpack_walk_friction(x):
    """(elevation, friction) of a packed value (:func:`pack_walk_friction`), as float64."""
    bits = float64_bits(x)
    return (np.float64(_float32_of_bits(np.int32(bits >> 32))),
            np.float64(_float32_of_bits(np.int32(bits & 0xFFFFFFFF))))


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
    if kind == WALK:
        return walk_time(a, b, step)
    if kind == WALK_FRICTION:  # the time times the mean friction of the two cells
        ha, fa = unpack_walk_friction(a)
        hb, fb = unpack_walk_friction(b)
        return walk_time(ha, hb, step) * ((fa + fb) * 0.5)
    return abs(a - b)


@numba.njit(cache=True)
def _compiled_weights(kind, h_a, h_b, step):
    out = np.empty(h_a.size)
    for i in range(h_a.size):
        out[i] = edge_weight(kind, h_a[i], h_b[i], step[i])
    return out


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
    if kind in (WALK, WALK_FRICTION):  # the compiled formula itself: the same bits as the kernels
        h_a, h_b, step = np.broadcast_arrays(h_a, h_b, np.asarray(step, dtype=np.float64))
        return _compiled_weights(kind, h_a.ravel(), h_b.ravel(), step.ravel()).reshape(h_a.shape)
    raise ValueError(f"no weight formula for kind {kind}")
