"""What an SSSP run writes, in one place: the layout of ``sssp/NAME`` (arrays, their types and
codes, the attributes) and the :class:`SSSPResult` it returns. Every method (in-core, shards, index)
writes through :func:`write_result`; this module imports none of them.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field as dc_field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ...store import TerrainStore
    from .index import Field

DISTANCE_DTYPE = "float32"
PREDECESSOR_DTYPE = "uint8"
ALLOCATION_DTYPE = "uint32"
NO_PRED = 255  # predecessor code of sources and unreached cells
NO_LEVEL = np.int32(2**31 - 1)  # plateau level not known (yet): the numba kernels' int32 sentinel
LISTED_SOURCES = 1000  # the result's attributes list the first sources only: zarr rewrites them whole on each update


@dataclass
class SSSPResult:
    """What :func:`sssp` computed; the same facts are the attributes of ``sssp/NAME``."""

    name: str
    weight: str
    sources: list  # (row, col) cells
    method: str  # "incore", "shards" or "index"
    reached: int
    max_distance: float
    timings: dict = dc_field(default_factory=dict)
    device: str = "cpu"
    cluster: int | None = None  # the index method's cluster size
    index_reused: bool = False
    merge_stats: dict = dc_field(default_factory=dict)  # the index merge's rounds and stages; the shard schedule's

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())

    def phases(self) -> str:
        """The method and its phase times, for a summary line."""
        t = self.timings
        if self.method == "index":
            return (f"index method: boundary {t['boundary']:.2f} s{' (index reused)' if self.index_reused else ''}, "
                    f"merge {t['merge']:.2f} s, final {t['final']:.2f} s")
        if self.method == "shards":
            m = self.merge_stats
            return (f"shard method on the {self.device.upper()}: {m['units']} units of {m['unit']}^2, "
                    f"{m['solves']} solves ({m['solves_per_unit']:.2f} a reached unit), {t['solve']:.2f} s")
        return f"in-core on the {self.device.upper()}: read {t['read']:.2f} s, solve {t['solve']:.2f} s, write {t['write']:.2f} s"


def result_attrs(store: TerrainStore, field: Field, cells, method: str, limit: float = np.inf) -> dict:
    """The attributes every SSSP result group carries (a method adds its own)."""
    return {
        "max_cost": None if limit == np.inf else limit,
        "weight": field.model.name,
        "method": method,
        "source_count": len(cells),
        "source_cells": [list(map(int, rc)) for rc in cells[:LISTED_SOURCES]],
        "source_xy": [list(map(float, store.cell_to_map(r, q))) for r, q in cells[:LISTED_SOURCES]],
        "distance_dtype": DISTANCE_DTYPE,
        "cost": field.cost_id,
        "unreached": "distance +inf (also beyond max_cost), predecessor 255, source 0; nodata cells: distance NaN",
        "source_codes": "the number of the source (1, 2, ... in the order of source_cells: the sources as given, "
                        "repeated cells left out) at the root of the cell's predecessor chain; 0 none",
        "predecessor_codes": "direction from a cell to its parent: 0=E,1=SE,2=S,3=SW,4=W,5=NW,6=N,7=NE; 255 none",
        "predecessor_rule": "the tight parent with the least key (0 if strictly nearer, else its plateau level + 1), "
                            "then the least direction code",
    }


@dataclass
class ResultArrays:
    """The arrays of ``sssp/NAME`` while it is written: ``distance`` (float32, NaN on nodata, +inf
    unreached), ``predecessor`` (the direction code to the parent, :data:`NO_PRED` none) and, with
    allocation, ``source`` (the source's number, 0 none)."""

    writer: object  # the store's ResultWriter
    distance: object
    predecessor: object
    source: object | None = None
    keep_predecessor: bool = True  # False: ``predecessor`` is scratch, left out of the result

    def finish(self, reached: int, max_distance: float, **attrs) -> None:
        """The figures every result carries (and a method's own ``attrs``), once its arrays are written."""
        self.writer.attrs.update({"reached": reached, "max_distance": max_distance, **attrs})


@contextlib.contextmanager
def write_result(store: TerrainStore, name: str, attrs: dict, allocation: bool = False, predecessor: bool = True):
    """Yields the :class:`ResultArrays` of ``sssp/NAME``, written atomically (``store.write_result``).

    ``predecessor`` False (distances only): the result holds no ``predecessor``. A method that needs
    the codes on disk meanwhile (the shard and index methods re-read them; allocation follows them)
    writes them to the staged result as usual; they are removed before it is sealed and renamed."""
    with store.write_result(f"sssp/{name}", attrs=attrs) as wr:
        arrays = ResultArrays(wr, wr.create_array("distance", DISTANCE_DTYPE, float("nan")),
                              wr.create_array("predecessor", PREDECESSOR_DTYPE, NO_PRED),
                              wr.create_array("source", ALLOCATION_DTYPE, 0) if allocation else None,
                              keep_predecessor=predecessor)
        yield arrays
        if not predecessor:
            del wr.group["predecessor"]
