"""``watershed``, ``basins``, ``stream_order``, ``stream_links`` and ``hand`` on in-memory rasters,
beside ``flow_direction`` / ``flow_accumulation``: NumPy, xarray DataArrays of them (the same kind
comes back, coordinates and attributes kept) or CuPy (computed on the GPU by :mod:`._gpu`'s pointer
jumping: the same bytes as the numba kernels of :mod:`._cpu`). Definitions in
:mod:`._cpu`; directions are :mod:`..flow.codes`' (``flow_direction``'s)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...backend import is_cupy, to_host
from ...errors import InputError
from ...rasters import is_dataarray
from ..flow.codes import NODATA
from . import _cpu

METHODS = ("strahler", "shreve")


class BasinTable(NamedTuple):
    """One row per basin, index i = basin id i + 1: its terminal cell (``row``, ``col``: the cell
    coded OUTLET or SINK, or pointing off the DEM) and its number of ``cells``."""

    id: np.ndarray
    row: np.ndarray
    col: np.ndarray
    cells: np.ndarray


class LinkTable(NamedTuple):
    """One row per stream link, index i = link id i + 1: head and last cell (row, col), the
    ``downstream`` link (0 where the flow path ends), ``cells``, ``strahler`` order, ``shreve`` magnitude."""

    id: np.ndarray
    head_row: np.ndarray
    head_col: np.ndarray
    tail_row: np.ndarray
    tail_col: np.ndarray
    downstream: np.ndarray
    cells: np.ndarray
    strahler: np.ndarray
    shreve: np.ndarray


def watershed(direction, outlets):
    """Watershed labels of outlet cells (ESRI Watershed, Whitebox Watershed).

    Parameters
    ----------
    direction : numpy.ndarray, cupy.ndarray or xarray.DataArray
        Flow direction codes (:func:`~terrain_io.grid.flow.flow_direction`).
    outlets : sequence of (row, col)
        Outlet cells, distinct and valid.

    Returns
    -------
    uint32 labels of the input's kind: i + 1 where a cell's flow path reaches ``outlets[i]`` before
    any other outlet (a nested outlet splits its parent's area), 0 elsewhere and at nodata.

    Examples
    --------
    >>> watershed(np.array([[0, 0, 0, 8]], np.uint8), [(0, 3), (0, 1)])
    array([[2, 2, 1, 1]], dtype=uint32)
    """
    template, code, K = _codes(direction)
    cells = _outlet_cells(outlets, code)
    return _like(template, direction, K.label_outlets(code, cells), "watershed", {"outlets": len(cells)})


def basins(direction):
    """Every drainage basin: one per terminal cell (OUTLET, SINK, or a code that leaves the DEM).

    Parameters
    ----------
    direction : numpy.ndarray, cupy.ndarray or xarray.DataArray
        Flow direction codes (:func:`~terrain_io.grid.flow.flow_direction`).

    Returns
    -------
    label : uint32 labels of the input's kind, 1, 2, ... in row-major order of the basins'
        terminal cells, 0 at nodata.
    table : :class:`BasinTable` (NumPy arrays).

    Examples
    --------
    >>> label, table = basins(np.array([[8, 4, 0, 8]], np.uint8))
    >>> label, table.cells
    (array([[1, 1, 2, 2]], dtype=uint32), array([2, 2]))
    """
    template, code, K = _codes(direction)
    label, outlet, cells = K.label_basins(code)
    outlet, cells = to_host(outlet), to_host(cells)
    row, col = np.divmod(outlet, code.shape[1])
    table = BasinTable(np.arange(1, len(outlet) + 1, dtype=np.uint32), row, col, cells)
    return _like(template, direction, label, "basin", {}), table


def stream_order(direction, accumulation, threshold, *, method: str = "strahler"):
    """Stream order of the cells whose accumulation reaches ``threshold``.

    Strahler (1957): 1 at a stream cell with no stream donor, else its donors' largest order, plus
    one where two or more donors hold it. Shreve (1966): 1 at a source, else the sum of its
    donors' magnitudes.

    Parameters
    ----------
    direction : numpy.ndarray, cupy.ndarray or xarray.DataArray
        Flow direction codes (:func:`~terrain_io.grid.flow.flow_direction`).
    accumulation : array of the same shape
        Flow accumulation (:func:`~terrain_io.grid.flow.flow_accumulation`, or any upstream measure).
    threshold : float
        A cell is on a stream where ``accumulation >= threshold`` (> 0).
    method : {"strahler", "shreve"}

    Returns
    -------
    uint8 Strahler orders or uint32 Shreve magnitudes (uint64 from 2^32 cells), 0 off the network.

    Examples
    --------
    >>> d = np.array([[0, 0, 8], [0, 6, 6]], np.uint8)  # two first-order streams meet at (0, 1)
    >>> stream_order(d, np.array([[1, 4, 6], [1, 2, 1]]), 1)
    array([[1, 2, 2],
           [1, 1, 1]], dtype=uint8)
    """
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    template, code, acc, K = _network_inputs(direction, accumulation, threshold)
    net = K.stream_network(code, acc, threshold)
    values = (net.strahler if method == "strahler" else net.shreve)[...]  # the GPU's: gathered per link
    return _like(template, direction, values, "stream_order", {"method": method, "threshold": threshold})


def stream_links(direction, accumulation, threshold):
    """Stream links: a link runs from a head (a source or a junction: a stream cell without
    exactly one stream donor) down to the cell above the next head or the end of its flow path.

    Parameters
    ----------
    direction, accumulation, threshold
        As :func:`stream_order`.

    Returns
    -------
    link : uint32 link ids of the input's kind, 1, 2, ... in row-major order of the links' heads,
        0 off the network.
    table : :class:`LinkTable` (NumPy arrays).
    """
    template, code, acc, K = _network_inputs(direction, accumulation, threshold)
    net = K.stream_network(code, acc, threshold)
    t = net.links
    w = code.shape[1]
    hr, hc = np.divmod(t.head, w)
    tr, tc = np.divmod(t.tail, w)
    table = LinkTable(np.arange(1, len(t.head) + 1, dtype=np.uint32), hr, hc, tr, tc, t.downstream, t.cells,
                      t.strahler, t.shreve)
    return _like(template, direction, net.link, "stream_link", {"threshold": threshold}), table


def hand(direction, elevation, accumulation, threshold, *, drainage: bool = False):
    """Height above the nearest drainage (HAND; Nobre et al. 2011, Rennó et al. 2008).

    Parameters
    ----------
    direction : numpy.ndarray, cupy.ndarray or xarray.DataArray
        Flow direction codes (:func:`~terrain_io.grid.flow.flow_direction`).
    elevation : array of the same shape
        The elevations the directions were routed on (the filled DEM where it was filled).
    accumulation, threshold
        The stream cells, as :func:`stream_order`.
    drainage : bool
        Also return the link id (:func:`stream_links`) of each cell's drainage cell.

    Returns
    -------
    float32 heights of the input's kind: a cell's elevation minus that of the first stream cell on
    its flow path (0 on streams); NaN where the path meets no stream and at nodata. With
    ``drainage``: (height, uint32 link ids, 0 where none).

    Examples
    --------
    >>> hand(np.array([[0, 0, 8]], np.uint8), np.array([[5.0, 3.0, 2.0]]), np.array([[1, 2, 3]]), 2)
    array([[2., 0., 0.]], dtype=float32)
    """
    template, code, acc, K = _network_inputs(direction, accumulation, threshold)
    z = _on(elevation, K)
    if z.shape != code.shape or z.dtype.kind not in "iuf":
        raise InputError(f"elevation must be a numeric raster of shape {code.shape}, got {z.dtype} {z.shape}")
    net = K.stream_network(code, acc, threshold)
    height, link = K.height_above_drainage(code, z, net)
    height = _like(template, direction, height, "hand", {"threshold": threshold})
    if drainage:
        return height, _like(template, direction, link, "drainage", {"threshold": threshold})
    return height


def _kernels(data):
    """:mod:`._gpu` for CuPy data, else :mod:`._cpu`."""
    if is_cupy(data):
        from . import _gpu

        return _gpu
    return _cpu


def _on(x, K):
    """The raster ``x`` (a DataArray's data) as an array of the kernels' device."""
    data = x.data if is_dataarray(x) else x
    if K is _cpu:
        return to_host(data)
    import cupy

    return cupy.asarray(data)


def _codes(direction):
    template = direction if is_dataarray(direction) else None
    K = _kernels(direction.data if template is not None else direction)
    code = _on(direction, K)
    if code.ndim != 2:
        raise InputError(f"the directions must be a 2-D array, got shape {code.shape}")
    if code.dtype.kind not in "iu" or bool((((code < 0) | (code > 9)) & (code != NODATA)).any()):
        raise InputError("directions must be integer codes 0..9 or 255 (flow_direction's)")
    xp = np if K is _cpu else __import__("cupy")
    return template, xp.ascontiguousarray(code, np.uint8), K


def _network_inputs(direction, accumulation, threshold):
    template, code, K = _codes(direction)
    acc = _on(accumulation, K)
    if acc.shape != code.shape:
        raise InputError(f"the accumulation has shape {acc.shape}, the directions {code.shape}")
    if not np.isfinite(threshold) or not threshold > 0:
        raise InputError(f"the threshold must be a number > 0, got {threshold!r}")
    return template, code, acc, K


def _outlet_cells(outlets, code) -> np.ndarray:
    cells = np.asarray(outlets, np.int64).reshape(-1, 2) if len(outlets) else np.empty((0, 2), np.int64)
    if not len(cells):
        raise InputError("no outlets given")
    h, w = code.shape
    for i, (r, c) in enumerate(cells):
        if not (0 <= r < h and 0 <= c < w):
            raise InputError(f"outlet {i + 1} at cell ({r}, {c}) lies outside the {h} x {w} grid")
        if code[r, c] == NODATA:
            raise InputError(f"outlet {i + 1} at cell ({r}, {c}) is nodata")
    flat = cells[:, 0] * w + cells[:, 1]
    uniq, first, counts = np.unique(flat, return_index=True, return_counts=True)
    if (counts > 1).any():
        k = int(np.flatnonzero(counts > 1)[0])
        raise InputError(f"outlet {first[k] + 1} at cell {tuple(cells[first[k]])} is given more than once")
    return flat


def _like(template, original, values, name, attrs):
    """``values`` as the input's kind: a DataArray on the template's coordinates, a CuPy array for
    CuPy input, else NumPy."""
    if template is not None:
        import xarray as xr

        keep = {k: v for k, v in template.attrs.items() if k not in ("codes", "outlets", "condition")}
        data = values
        if is_cupy(template.data):
            import cupy

            data = cupy.asarray(values)
        return xr.DataArray(data, coords=template.coords, dims=template.dims, name=name, attrs={**keep, **attrs})
    if is_cupy(original):
        import cupy

        return cupy.asarray(values)
    return values
