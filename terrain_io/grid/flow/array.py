"""``flow_direction`` and ``flow_accumulation`` on in-memory rasters, beside ``cost_distance``:
NumPy (numba kernels of :mod:`._cpu`), CuPy (:mod:`._gpu`) or xarray DataArrays of them (the
same kind comes back, coordinates and attributes kept). The answers are those of ``terrain flow``
on a store of the same values (the codes and the definitions of :mod:`.codes` and :mod:`._cpu`).
"""
from __future__ import annotations

import numpy as np

from ...backend import device_of
from ...errors import InputError
from ...rasters import coordinate_steps, is_dataarray, like, unwrapped
from .codes import NODATA

CONDITIONS = ("none", "fill")
DIRECTION_CODES = "0=E,1=SE,2=S,3=SW,4=W,5=NW,6=N,7=NE; 8 drains out of the DEM; 9 no outflow; 255 nodata"


def flow_direction(dem, *, cell_size=None, nodata=None, outlets: str = "edge+nodata", condition: str = "none",
                   device: str | None = None):
    """D8 flow directions with flats resolved (Barnes, Lehman & Mulla 2014).

    Parameters
    ----------
    dem : numpy.ndarray, cupy.ndarray or xarray.DataArray
        2-D elevations, dims (y, x), rows growing southward; NaN or ``nodata`` marks no data.
    cell_size : (dx, dy), optional
        Column and row steps for the slopes; default a DataArray's x/y spacing, else (1, 1).
    nodata : number, optional
        A value that marks no data (besides NaN).
    outlets : {"edge+nodata", "edge"}
        Cells that drain out of the DEM: those on its edge and next to nodata, or on its edge only.
    condition : {"none", "fill"}
        ``fill`` fills the depressions first (as ``terrain fill``; on the CPU), ``none`` routes the
        values as they are (pits become SINK).
    device : {"cpu", "gpu"}, optional
        Default: the input's (CuPy -> GPU).

    Returns
    -------
    uint8 codes of the input's kind: 0..7 to the neighbour E, SE, S, SW, W, NW, N, NE; 8 drains out
    of the DEM; 9 no outflow; 255 nodata.

    Examples
    --------
    >>> flow_direction(np.array([[3.0, 2.0, 1.0]]))
    array([[0, 0, 8]], dtype=uint8)
    """
    if outlets not in ("edge+nodata", "edge"):
        raise InputError(f"outlets must be edge+nodata or edge, got {outlets!r}")
    if condition not in CONDITIONS:
        raise InputError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    template, data = unwrapped(dem, "the DEM")
    dev = device_of(data, device=device)
    xp = _module(dev)
    vals = xp.asarray(data)
    if vals.dtype.kind not in "iuf":
        raise InputError(f"cannot route a DEM of dtype {vals.dtype}")
    valid = ~xp.isnan(vals) if vals.dtype.kind == "f" else xp.ones(vals.shape, bool)
    if nodata is not None:
        valid &= vals != nodata
    if not bool(valid.any()):
        raise InputError("the DEM holds no data: every cell is nodata")
    if condition == "fill":
        vals = xp.asarray(_filled(vals, valid, outlets))
    dx, dy = cell_size if cell_size is not None else coordinate_steps(template)
    code = _backend(dev).directions(vals, valid, float(dx), float(dy), outlets)
    return like(template, code, "direction", {"codes": DIRECTION_CODES, "outlets": outlets, "condition": condition})


def flow_accumulation(direction, weights=None, *, include_self: bool = True, device: str | None = None):
    """Flow accumulation over direction codes (those of :func:`flow_direction`).

    Parameters
    ----------
    direction : numpy.ndarray, cupy.ndarray or xarray.DataArray
        uint8 codes (0..7, 8, 9, 255 as :func:`flow_direction` writes them).
    weights : array of the same shape, optional
        A weight per cell (rainfall, area): finite and >= 0 at every cell with a direction.
    include_self : bool
        Count the cell itself (TauDEM, Whitebox, pysheds); False for the ESRI convention.
    device : {"cpu", "gpu"}, optional
        Default: the input's (CuPy -> GPU).

    Returns
    -------
    The number of cells whose flow passes through each cell (uint64), or the sum of their
    ``weights`` (float64: the exact sum correctly rounded, the same bits on every device and tiling); 0 at nodata.

    Examples
    --------
    >>> flow_accumulation(np.array([[0, 0, 8]], np.uint8))
    array([[1, 2, 3]], dtype=uint64)
    """
    template, data = unwrapped(direction, "the directions")
    dev = device_of(data, device=device)
    xp = _module(dev)
    code = xp.asarray(data)
    if code.dtype.kind not in "iu" or bool((((code < 0) | (code > 9)) & (code != NODATA)).any()):
        raise InputError("directions must be integer codes 0..9 or 255 (flow_direction's)")
    code = code.astype(np.uint8, copy=False)
    w = None
    if weights is not None:
        w = xp.asarray(weights.data if is_dataarray(weights) else weights, dtype=np.float64)
        check_weights(w, code != NODATA, code.shape)
    acc = _backend(dev).accumulation(code, w, include_self)
    units = "cells" if weights is None else "sum of weights"
    if template is not None:  # the directions' own attributes do not describe an accumulation
        template = template.copy(deep=False)
        template.attrs.pop("codes", None)
    return like(template, acc, "accumulation", {"units": units, "include_self": include_self})


def check_weights(w, valid, shape) -> None:
    """A weights raster of the DEM's shape, finite and >= 0 at valid cells (one error line otherwise)."""
    if tuple(w.shape) != tuple(shape):
        raise InputError(f"the weights raster has shape {tuple(w.shape)}, the DEM {tuple(shape)}")
    bad = valid & ~(w >= 0)  # NaN fails too
    bad |= valid & (w == np.inf)
    n = int(bad.sum())
    if n:
        raise InputError(f"{n:,} valid cells have negative, NaN or infinite weights (weights must be finite and >= 0)")


def _filled(vals, valid, outlets):
    """The depression-filled DEM (terrain fill's definition), on the CPU."""
    from ...backend import to_host
    from ..fill import fill_array

    host = to_host(vals)
    if host.dtype.kind == "f":
        host = np.where(to_host(valid), host, np.nan)
        filled, _ = fill_array(host, outlets=outlets)
    else:
        nodata = _free_value(host, to_host(valid))
        filled, _ = fill_array(np.where(to_host(valid), host, nodata), outlets=outlets, nodata=nodata)
    return filled


def _free_value(host, valid):
    """An integer that no valid cell holds (the nodata of a temporary store)."""
    info = np.iinfo(host.dtype)
    for v in (info.min, info.max):
        if not (host[valid] == v).any():
            return v
    raise InputError("condition='fill' on an integer DEM that uses both ends of its dtype's range: pass floats")


def _module(dev: str):
    if dev == "gpu":
        import cupy

        return cupy
    return np


def _backend(dev: str):
    if dev == "gpu":
        from . import _gpu  # CuPy kernels: imported only for GPU work

        return _gpu
    from . import _cpu

    return _cpu
