"""In-memory rasters of the array API (``cost_distance``, ``flow_direction``, ...): NumPy or CuPy
arrays, or xarray DataArrays of them, whose coordinates and attributes the results keep (in the
manner of xarray-spatial). xarray is imported only when a DataArray is given."""
from __future__ import annotations


def is_dataarray(x) -> bool:
    """True for an xarray DataArray (checked by type name: xarray need not be installed)."""
    return type(x).__name__ == "DataArray" and hasattr(x, "dims")


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
