"""In-memory rasters of the array API (``cost_distance``, ``flow_direction``, ...): NumPy or CuPy
arrays, or xarray DataArrays of them, whose coordinates and attributes the results keep (in the
manner of xarray-spatial). xarray is imported only when a DataArray is given."""
from __future__ import annotations

from .errors import InputError


def is_dataarray(x) -> bool:
    """True for an xarray DataArray (checked by type name: xarray need not be installed)."""
    return type(x).__name__ == "DataArray" and hasattr(x, "dims")


def unwrapped(x, what: str):
    """(the DataArray or None, its data or ``x``) for a 2-D raster argument; one line naming
    ``what`` ("the DEM", "the directions") otherwise."""
    template = x if is_dataarray(x) else None
    data = x.data if template is not None else x
    if getattr(data, "ndim", None) != 2:
        raise InputError(f"{what} must be a 2-D array, got shape {getattr(data, 'shape', None)}")
    return template, data


def coordinate_steps(template) -> tuple[float, float]:
    """Cell size (dx, dy) from a DataArray's 1-D x/y coordinates (regular grids), else (1, 1)."""
    if template is None:
        return 1.0, 1.0
    steps = []
    for dim in (template.dims[1], template.dims[0]):
        coord = template.coords.get(dim)
        if coord is None or coord.size < 2:
            steps.append(1.0)
        else:
            steps.append(float(abs(coord.values[1] - coord.values[0])))
    return steps[0], steps[1]


def like(template, values, name: str, attrs: dict):
    """``values`` as a DataArray with ``template``'s coordinates, dims and attributes (plus
    ``attrs``), or ``values`` itself when there is no template."""
    if template is None:
        return values
    import xarray as xr

    return xr.DataArray(values, coords=template.coords, dims=template.dims, name=name,
                        attrs={**template.attrs, **attrs})
