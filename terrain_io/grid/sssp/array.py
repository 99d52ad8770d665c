"""``cost_distance``: shortest paths over an in-memory raster, for notebooks, in the manner of
xarray-spatial (one function; NumPy, CuPy or xarray in, the same kind out).

The in-core engine of :mod:`.incore` on the array itself: no store, no files. The answers are
those of ``terrain sssp`` on a store of the same values (distances bit for bit, the same
predecessor codes).
"""
from __future__ import annotations

import numpy as np

from ... import weights as weight_models
from ...backend import device_of, is_cupy, to_host
from ...errors import InputError
from ...rasters import coordinate_steps, is_dataarray, like, unwrapped
from ...weights import steps_of
from .allocation import allocate_block, allocate_gpu
from .incore import output_distance, ringed, solve_block


def cost_distance(dem, sources, *, weight: str = "absdiff", cost=None, cell_size=None, nodata=None,
                  device: str | None = None, max_cost: float | None = None, allocation: bool = False):
    """Distance to the nearest source and the predecessor code of every cell of a 2-D raster.

    Parameters
    ----------
    dem : array or xarray.DataArray
        A NumPy or CuPy array, or a DataArray of one (dims (y, x)); NaN, or the value ``nodata``,
        marks cells that are not vertices.
    sources : pair, list of pairs or array
        (row, col) cells -- one pair or a list -- or a raster of the DEM's shape whose non-zero
        cells are sources (xarray-spatial's convention).
    weight : {"absdiff", "surface", "cell", "walk"}
        ``absdiff`` |dh|, ``surface`` sqrt(step^2 + dh^2), ``cell`` (c_i + c_j) / 2 * step over
        ``cost``, ``walk`` seconds by Tobler's hiking function (directed), times the mean friction
        of the two cells when ``cost`` is given (elevations then taken as float32).
    cost : array, optional
        A raster of the DEM's shape; NaN, negative or infinite costs are barriers.
    cell_size : (dx, dy), optional
        The steps; default from a DataArray's x/y coordinates, else 1.
    nodata : number, optional
        The value of cells that are not vertices.
    device : {"cpu", "gpu"}, optional
        Default: the input's (CuPy -> GPU).
    max_cost : float, optional
        Cells farther stay unreached.
    allocation : bool
        Also return the nearest source's number.

    Returns
    -------
    distance : array
        float32, +inf unreached, NaN where no vertex.
    predecessor : array
        uint8 direction code of the parent (0=E, 1=SE, ..., 7=NE; 255 at sources and unreached).
    source : array
        Only with ``allocation``: uint32, the number of the nearest source (1, 2, ... in the order
        given, or of a source raster's cells in row-major order; 0 unreached), as :mod:`.allocation`.

    NumPy or CuPy like the input, or DataArrays with the input's coordinates and attributes.

    Examples
    --------
    >>> import numpy as np
    >>> dem = np.array([[0, 1, 3], [9, 9, 9]], dtype=np.float32)
    >>> distance, predecessor = cost_distance(dem, (0, 0))
    >>> distance.tolist()
    [[0.0, 1.0, 3.0], [9.0, 9.0, 9.0]]
    >>> predecessor[0].tolist()  # 255 at the source; 4: the parent is west
    [255, 4, 4]
    """
    model = weight_models.sssp_model(weight)
    template, data = unwrapped(dem, "the DEM")
    dev = device_of(data, device=device)
    xp = np
    if dev == "gpu":
        import cupy as xp
    vals = xp.asarray(data)
    ok = ~xp.isnan(vals) if vals.dtype.kind == "f" else xp.ones(vals.shape, bool)
    if nodata is not None:
        ok &= vals != nodata
    if model.kind == weight_models.WALK and cost is not None:
        model = weight_models.get("walk_friction")
    if model.kind in (weight_models.CELL, weight_models.WALK_FRICTION):
        if cost is None:
            raise InputError(f"weight model {model.name!r} needs a cost raster (cost=...)")
        c = xp.asarray(cost.data if is_dataarray(cost) else cost, dtype=np.float64)
        if c.shape != vals.shape:
            raise InputError(f"cost raster has shape {c.shape}, the DEM {vals.shape}")
        weight_models.note_barriers(weight_models.unusable_costs(c[ok]), "cost", stacklevel=2)
        ok &= xp.isfinite(c) & (c >= 0)
        vals = c if model.kind == weight_models.CELL else weight_models.pack_walk_friction(vals, c)
    elif cost is not None:
        raise InputError(f"cost applies to the weight models 'cell' and 'walk', not {model.name!r}")
    exact32 = model.kind != weight_models.WALK_FRICTION and (
        vals.dtype == np.float32 or (vals.dtype.kind in "iu" and vals.dtype.itemsize <= 2))
    vals = xp.where(ok, vals, np.nan).astype(np.float32 if exact32 else np.float64)
    cells = _source_cells(sources, vals.shape, to_host(ok))
    dx, dy = cell_size if cell_size is not None else coordinate_steps(template)
    if not (0 < float(dx) < np.inf and 0 < float(dy) < np.inf):
        raise InputError(f"cell_size must be two finite steps > 0, got {dx!r}, {dy!r}")
    limit = np.inf if max_cost is None else float(max_cost)
    if not limit >= 0:
        raise InputError(f"max_cost must be a number >= 0, got {max_cost!r}")
    block = ringed(vals) if xp is np else _ringed_gpu(vals)
    dist, _, pred = solve_block(block, model.kind, steps_of(float(dx), float(dy)), cells, device=dev, limit=limit)
    outputs = [output_distance(dist, block), pred]
    if allocation:
        outputs.append(allocate_gpu(pred, cells) if dev == "gpu" else allocate_block(pred, cells))
    if template is None:
        return tuple(outputs)
    named = [("distance", {"weight": model.name, "units": "seconds" if model.name.startswith("walk") else "cost"}),
             ("predecessor", {"codes": "0=E,1=SE,2=S,3=SW,4=W,5=NW,6=N,7=NE; 255 none"}),
             ("source", {"codes": "the nearest source's number (1, 2, ...); 0 none"})]
    return tuple(like(template, values, name, attrs) for values, (name, attrs) in zip(outputs, named))


def _ringed_gpu(vals):
    import cupy as cp

    out = cp.full((vals.shape[0] + 2, vals.shape[1] + 2), np.nan, vals.dtype)
    out[1:-1, 1:-1] = vals
    return out


def _source_cells(sources, shape, ok) -> np.ndarray:
    """(n, 2) source cells from (row, col) pairs or a raster whose non-zero cells are sources."""
    if is_cupy(sources) or (hasattr(sources, "shape") and tuple(sources.shape) == tuple(shape)) or is_dataarray(sources):
        mask = to_host(sources.data if is_dataarray(sources) else sources)
        cells = np.argwhere(np.nan_to_num(mask) != 0)
    else:
        cells = np.asarray(sources, np.int64).reshape(-1, 2)
    if cells.size == 0:
        raise InputError("no source given")
    for r, c in cells:
        if not (0 <= r < shape[0] and 0 <= c < shape[1]):
            raise InputError(f"source cell {r},{c} lies outside the DEM ({shape[0]} x {shape[1]} cells)")
        if not ok[r, c]:
            raise InputError(f"source cell {r},{c} lies on a nodata cell")
    return cells
