"""Flow direction codes in the conventions other tools read (``terrain export --encoding``).

Our codes (:mod:`.codes`): 0..7 = E, SE, S, SW, W, NW, N, NE; OUTLET drains out of the DEM; SINK
no outflow; NODATA. Each tool's documented encoding:

=========  ==========================================================  ======  ======  =====  ==============
encoding   E  SE  S  SW  W  NW  N  NE                                  OUTLET  SINK    dtype  nodata
=========  ==========================================================  ======  ======  =====  ==============
esri       1  2   4  8   16 32  64 128 (ArcGIS Flow Direction; pyflwdir   out     0       uint8  255
           ``d8``)
taudem     1  8   7  6   5  4   3  2   (D8FlowDir: 1..8 counter-clockwise nodata  nodata  int16  -32768
           from east)
grass      8  7   6  5   4  3   2  1   (r.watershed ``drainage``: times   -out    0       int16  -32768
           45 = degrees counter-clockwise from east)
whitebox   2  4   8  16  32 64  128 1  (D8Pointer: clockwise from NE)     0       0       int16  -32768
=========  ==========================================================  ======  ======  =====  ==============

``out``: an outlet cell gets the direction that leaves the DEM -- the least code whose neighbour is
outside the DEM or nodata (ArcGIS' "force all edge cells to flow outward"; GRASS writes it negative,
its mark of flow leaving the region). TauDEM has no code for "no flow": its nodata. Whitebox marks
cells without a lower neighbour 0.
"""
from __future__ import annotations

import numpy as np

from .codes import NODATA, OUTLET, SINK

ENCODINGS = ("esri", "taudem", "grass", "whitebox")
_D = np.arange(8)
# value of our code d = 0..7 (E, SE, S, SW, W, NW, N, NE) in each encoding
TABLES = {
    "esri": 1 << _D,
    "taudem": (8 - _D) % 8 + 1,
    "grass": 8 - _D,
    "whitebox": 1 << ((_D + 1) % 8),
}
DTYPES = {"esri": (np.uint8, 255), "taudem": (np.int16, -32768), "grass": (np.int16, -32768),
          "whitebox": (np.int16, -32768)}
_DR = (0, 1, 1, 1, 0, -1, -1, -1)
_DC = (1, 1, 0, -1, -1, -1, 0, 1)


def check(encoding: str) -> str:
    from ...errors import InputError

    if encoding not in ENCODINGS:
        raise InputError(f"unknown encoding {encoding!r}: use one of {', '.join(ENCODINGS)}")
    return encoding


def outward(code_halo: np.ndarray) -> np.ndarray:
    """For the interior of a block of codes with a one-cell halo (NODATA outside the DEM): the
    least code d whose neighbour is NODATA (8 where none)."""
    h, w = code_halo.shape[0] - 2, code_halo.shape[1] - 2
    out = np.full((h, w), 8, np.int64)
    for d in range(7, -1, -1):
        nb = code_halo[1 + _DR[d] : 1 + _DR[d] + h, 1 + _DC[d] : 1 + _DC[d] + w]
        out[nb == NODATA] = d
    return out


def encode(code_halo: np.ndarray, encoding: str) -> np.ndarray:
    """The interior of a block of codes with a one-cell halo, in ``encoding`` (module docstring)."""
    code = code_halo[1:-1, 1:-1]
    dtype, nodata = DTYPES[encoding]
    table = TABLES[encoding]
    out = np.full(code.shape, nodata, dtype)
    flowing = code < 8
    out[flowing] = table[code[flowing]]
    outlet, sink = code == OUTLET, code == SINK
    if encoding in ("esri", "grass"):
        d = outward(code_halo)[outlet]
        out[outlet] = table[np.minimum(d, 7)] * (-1 if encoding == "grass" else 1)
    elif encoding == "whitebox":
        out[outlet] = 0
    if encoding != "taudem":
        out[sink] = 0
    return out
