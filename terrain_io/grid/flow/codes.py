"""Flow direction codes (uint8), the same on every backend (docs: FLOW_CONTRACT, README ``terrain flow``).

0..7: the cell drains to its neighbour in direction d = E, SE, S, SW, W, NW, N, NE (``weights.DR``,
``weights.DC``: row grows southward; d and d ^ 4 are opposite) -- the order of the SSSP predecessor codes.
"""
from __future__ import annotations

E, SE, S, SW, W, NW, N, NE = range(8)
OUTLET = 8  # drains out of the DEM: an outlet cell with no lower valid neighbour
SINK = 9  # no outflow: a pit, or a flat with no way down (condition "none", or walled by nodata under "edge")
NODATA = 255  # not a valid cell
