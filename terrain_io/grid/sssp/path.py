"""Shortest path from a cell back to the source: follow ``sssp/NAME/predecessor`` (``terrain path``).

The predecessor of a cell is the direction code (0=E .. 7=NE) of its parent; the walk ends at a
source (code 255 with distance 0). Tiles are read once each (an LRU of a few tiles), so a path
across a large store costs O(path length) reads of cached tiles. The result is a GeoJSON
Feature with a LineString of cell centres in the store's map coordinates.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...atomic import atomic_file
from ...errors import InputError, StoreError
from ...store import TerrainStore
from ._pipeline_cpu import DC, DR, NO_PRED


@dataclass
class TracedPath:
    """A traced path: cells from the source to the target, and the target's distance."""

    name: str
    cells: np.ndarray  # (n, 2) rows and columns, source first
    cost: float
    xy: np.ndarray  # (n, 2) map coordinates of cell centres

    def feature(self, store: TerrainStore) -> dict:
        (r0, c0), (r1, c1) = self.cells[0], self.cells[-1]
        return {
            "type": "Feature",
            "geometry": {"type": "LineString", "coordinates": self.xy.tolist()},
            "properties": {"sssp": self.name, "cost": self.cost, "cells": int(len(self.cells)),
                           "source_cell": [int(r0), int(c0)], "target_cell": [int(r1), int(c1)],
                           "weight": store.group[f"sssp/{self.name}"].attrs.get("weight")},
        }


def latest_sssp(store: TerrainStore) -> str:
    """The name of the only (or most recently written) SSSP result of the store."""
    try:
        group = store.group["sssp"]
    except KeyError:
        raise StoreError(f"{store.path}: no SSSP result (run 'terrain sssp' first)") from None
    names = [n for n, node in group.members() if "distance" in node]
    if not names:
        raise StoreError(f"{store.path}: no SSSP result (run 'terrain sssp' first)")
    return max(names, key=lambda n: os.path.getmtime(store.path / "sssp" / n))


class _Tiles:
    """A small LRU of (distance, predecessor) tiles."""

    def __init__(self, store: TerrainStore, name: str, keep: int = 16):
        self.store, self.keep = store, keep
        self.dist = store.group[f"sssp/{name}/distance"]
        self.pred = store.group[f"sssp/{name}/predecessor"]
        self.cache: OrderedDict = OrderedDict()

    def get(self, r: int, c: int):
        t = self.store.tile_size
        key = (r // t, c // t)
        if key not in self.cache:
            win = self.store.tile_window(*key)
            self.cache[key] = (self.dist[win.slices], self.pred[win.slices])
            if len(self.cache) > self.keep:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        d, p = self.cache[key]
        return float(d[r - key[0] * t, c - key[1] * t]), int(p[r - key[0] * t, c - key[1] * t])


def trace(store, target, name: str | None = None, cell: bool = False) -> TracedPath:
    """The path from the source(s) of ``sssp/NAME`` to ``target`` ((x, y), or (row, col) with ``cell``)."""
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    name = name or latest_sssp(store)
    if f"sssp/{name}/predecessor" not in store.group:
        raise StoreError(f"{store.path}: no SSSP result {name!r}")
    rows, cols = store.shape
    r, c = (int(target[0]), int(target[1])) if cell else store.map_to_cell(float(target[0]), float(target[1]))
    if not (0 <= r < rows and 0 <= c < cols):
        raise InputError(f"target {target[0]},{target[1]} lies outside the DEM ({rows} x {cols} cells)")
    tiles = _Tiles(store, name)
    cost, p = tiles.get(r, c)
    if np.isnan(cost):
        raise InputError(f"target {target[0]},{target[1]} lies on a nodata cell")
    if not np.isfinite(cost):
        raise InputError(f"target {target[0]},{target[1]} is not reachable from the source")
    cells = [(r, c)]
    while p != NO_PRED:
        if p > 7 or len(cells) > rows * cols:
            raise StoreError(f"sssp/{name}: broken predecessor chain at cell {r},{c}")
        r, c = r + int(DR[p]), c + int(DC[p])
        d, p = tiles.get(r, c)
        cells.append((r, c))
    if d != 0:
        raise StoreError(f"sssp/{name}: predecessor chain ends at cell {r},{c} which is not a source")
    cells = np.array(cells[::-1], np.int64)
    x, y = store.cell_to_map(cells[:, 0], cells[:, 1])
    return TracedPath(name, cells, cost, np.column_stack([x, y]))


def write_geojson(store, path: TracedPath, out) -> Path:
    """Write the path as a GeoJSON FeatureCollection (CRS named when the store has one)."""
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    fc = {"type": "FeatureCollection", "features": [path.feature(store)]}
    crs = _crs_name(store.crs)
    if crs:
        fc["crs"] = {"type": "name", "properties": {"name": crs}}
    out = Path(out)
    with atomic_file(out) as tmp:
        tmp.write_text(json.dumps(fc))
    return out


def _crs_name(wkt: str | None) -> str | None:
    if not wkt:
        return None
    try:
        from rasterio.crs import CRS

        crs = CRS.from_user_input(wkt)
        epsg = crs.to_epsg()
        return f"urn:ogc:def:crs:EPSG::{epsg}" if epsg else crs.to_wkt()
    except Exception:
        return wkt
