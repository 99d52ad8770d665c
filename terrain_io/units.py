"""Units of the numbers the commands print, and numbers printed without float noise.

Conventions (README, "Units"): elevations and every length derived from them are metres (``m``);
step lengths, areas and volumes are metres also on a geographic CRS (degrees scaled at the DEM's mid
latitude, :attr:`TerrainStore.metric_cell_size`); walking times are seconds (``s``); map coordinates
and cell sizes are in the CRS's unit (``m``, ``deg``, ``US ft``, ...), in ``map units`` for a DEM
without a CRS, in ``cells`` for one without a transform.
"""
from __future__ import annotations

import math

import numpy as np

# sssp weight models -> the unit of a distance (walk_friction: --weight walk --cost FRICTION)
DISTANCE_UNITS = {"absdiff": "m", "surface": "m", "walk": "s", "walk_friction": "s", "cell": "cost x m"}
# the CLI's name of a weight model (the library's walk_friction is --weight walk with --cost)
CLI_WEIGHTS = {"walk_friction": "walk"}
_LINEAR = {"metre": "m", "meter": "m", "m": "m", "foot": "ft", "ft": "ft", "us survey foot": "US ft",
           "us-ft": "US ft", "kilometre": "km", "km": "km"}


def distance_unit(weight: str) -> str:
    """The unit of an SSSP distance under the weight model ``weight`` (``m``, ``s``, ``cost x m``)."""
    return DISTANCE_UNITS.get(weight, "")


def cli_weight(weight: str) -> str:
    """The weight model's name as the command line spells it (``walk`` for the library's walk_friction)."""
    return CLI_WEIGHTS.get(weight, weight)


def map_unit(crs: str | None, transform=True) -> str:
    """The unit of map coordinates and cell sizes under ``crs`` (WKT or None): ``m``, ``deg``, ...;
    ``map units`` without a CRS, ``cells`` without a ``transform``."""
    if not transform:
        return "cells"
    if not crs:
        return "map units"
    try:
        from rasterio.crs import CRS

        c = CRS.from_user_input(crs)
        if c.is_geographic:
            return "deg"
        name = (c.linear_units or "").lower()
        return _LINEAR.get(name, name or "map units")
    except Exception:  # noqa: BLE001 -- an unreadable CRS: say nothing wrong
        return "map units"


def crs_label(crs: str | None, projection: bool = False) -> str:
    """A short name of a CRS (WKT or any user input): ``EPSG:32617``, else its name; ``none``.
    ``projection``: an EPSG code followed by the PROJ projection's name, ``EPSG:32617 (utm)``."""
    if not crs:
        return "none"
    try:
        from rasterio.crs import CRS

        c = CRS.from_user_input(crs)
        epsg = c.to_epsg()
        if epsg:
            return f"EPSG:{epsg} ({c.to_dict().get('proj', '')})" if projection else f"EPSG:{epsg}"
        name = c.to_wkt().split('"')[1] if '"' in c.to_wkt() else c.to_string()
        return name[:80]
    except Exception:  # noqa: BLE001 -- an unreadable CRS: its text
        return str(crs)[:80]


def number(value, dtype=np.float64) -> str:
    """``value`` as the shortest text that reads back to it in ``dtype``'s precision (a float32's
    0.019999999552965164 prints 0.02); integers as integers; inf and nan as such."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        return str(int(value)) if value == int(value) else repr(value)
    text = np.format_float_positional(dtype.type(value), unique=True, trim="-")
    sci = np.format_float_scientific(dtype.type(value), unique=True, trim="-")
    return text if len(text) <= len(sci) + 2 else sci


def coordinate(value) -> str:
    """A map coordinate or extent bound: 10 significant digits (no float64 noise, millimetres kept
    for metres up to 10^7, ~1e-8 deg for degrees)."""
    return f"{float(value):.10g}"
