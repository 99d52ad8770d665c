"""The weight models' formulas for the CPU's kernels (numba): :func:`edge_weight` and what it calls,
keyed by :attr:`terrain_io.weights.WeightModel.kind` (the models themselves: :mod:`terrain_io.weights`;
the CUDA kernels' formulas: kernels/grid.cuh). Apart from the models so that the GPU's routes, which
compile none of these, do not import numba (~0.3-0.6 s of a command's start)."""
from __future__ import annotations

import numba
import numpy as np

from numba import types
from numba.extending import intrinsic

from .weights import ABSDIFF, CELL, MAX, SURFACE, WALK, WALK_FRICTION

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
