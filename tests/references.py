"""References and helpers shared by test modules: written from the formats' definitions, never from
our own code's output."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from rasterio.crs import CRS

from terrain_io.store import TerrainStore

ROOT = Path(__file__).resolve().parents[1]  # the repository
UTM33 = CRS.from_epsg(32633)
# attributes of a store or result that differ between equal runs (the generation: a random id per store)
VOLATILE = {"seconds", "timings", "created", "index_reused", "generation"}


def utm_store(path, values, crs=UTM33, tile=16, shard=2) -> TerrainStore:
    """A store of ``values`` on a 30 m grid in ``crs`` (default UTM 33N; None: no CRS)."""
    attrs = {"transform": [500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0], "cell_size": [30.0, 30.0],
             "crs": crs.to_wkt() if crs else None}
    return TerrainStore.from_array(path, values, tile=tile, shard=shard, attrs=attrs)


def parse_esri_ascii(path):
    """(header, values float64 with NaN for NODATA_value) by the format's definition: keyword lines,
    then nrows lines of ncols numbers."""
    tokens = path.read_text().split()
    header, i = {}, 0
    while tokens[i][0].isalpha():
        header[tokens[i].lower()] = tokens[i + 1]
        i += 2
    rows, cols = int(header["nrows"]), int(header["ncols"])
    body = tokens[i:]
    assert len(body) == rows * cols
    nodata = header.get("nodata_value")
    values = np.array([math.nan if t == nodata else float(t) for t in body]).reshape(rows, cols)
    return header, values
