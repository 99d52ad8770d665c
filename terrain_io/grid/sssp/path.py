"""Shortest paths from targets back to the source: follow ``sssp/NAME/predecessor`` (``terrain path``).

The predecessor of a cell is the direction code (0=E .. 7=NE) of its parent; the walk ends at a
source (code 255 with distance 0). Tiles are read once each (an LRU of 64 tiles), so a path
across a large store costs O(path length) reads of cached tiles; many targets are taken tile by
tile through the one LRU, and a walk that meets a cell of an earlier path takes that path's rest
instead of walking it again. The
result is a GeoJSON FeatureCollection in the store's map coordinates: per target a Feature with a
LineString of cell centres from the source to the target and its cost; a target the source does
not reach keeps its Feature, with a null geometry and cost (so features join back to their input).
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import vectors
from ...atomic import atomic_file
from ...errors import InputError, StoreError
from ...store import TerrainStore
from ...weights import DC, DR
from .result import NO_PRED


@dataclass
class TracedPath:
    """A traced path: cells from the source to the target, and the target's distance.

    ``cells`` is empty and ``cost`` +inf when the target is not reached; ``index`` numbers the
    target in its input (the order of ``--to``, the feature of a file).
    """

    name: str
    cells: np.ndarray  # (n, 2) rows and columns, source first
    cost: float
    xy: np.ndarray  # (n, 2) map coordinates of cell centres
    target: tuple[int, int] = (-1, -1)
    index: int = 0

    @property
    def reached(self) -> bool:
        return len(self.cells) > 0

    def feature(self, store: TerrainStore, weight: str | None = None) -> dict:
        props = {"target": int(self.index), "target_cell": [int(v) for v in self.target],
                 "source_cell": [int(v) for v in self.cells[0]] if self.reached else None,
                 "cost": float(self.cost) if self.reached else None, "cells": int(len(self.cells)),
                 "sssp": self.name,
                 "weight": weight if weight is not None else store.group[f"sssp/{self.name}"].attrs.get("weight")}
        coords = self.xy.tolist()
        if len(coords) == 1:  # the target is a source: a LineString needs two positions
            coords = coords * 2
        geometry = {"type": "LineString", "coordinates": coords} if self.reached else None
        return {"type": "Feature", "geometry": geometry, "properties": props}


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
    """An LRU of (distance, predecessor) tiles: at most ``keep`` (64 tiles of 256^2: 21 MB)."""

    def __init__(self, store: TerrainStore, name: str, keep: int = 64):
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
    """The path from the source(s) of ``sssp/NAME`` to ``target`` ((x, y), or (row, col) with ``cell``);
    an error when the target is not reached."""
    (p,) = trace_all(store, [target], name=name, cell=cell)
    if not p.reached:
        raise InputError(f"target {target[0]},{target[1]} is not reachable from the source")
    return p


def trace_all(store, targets, name: str | None = None, cell: bool = False, crs=None,
              skip_invalid: bool = False) -> list[TracedPath]:
    """The paths from the source(s) of ``sssp/NAME`` to every target, in the targets' order.

    ``targets``: (x, y) pairs, or (row, col) with ``cell``; or a file of points, a raster aligned
    with the DEM or a store array (:func:`terrain_io.points.read_points`, with ``crs`` and
    ``skip_invalid``); ``crs`` also names the CRS of (x, y) pairs. A target outside the DEM or on nodata is an error (left out with
    ``skip_invalid``); one the source does not reach gives a path without cells and cost +inf.
    """
    from ...points import Points, from_coordinates, read_points

    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    name = name or latest_sssp(store)
    if f"sssp/{name}/predecessor" not in store.group:
        if f"sssp/{name}/distance" in store.group:
            raise StoreError(f"{store.path}: sssp/{name} holds distances only (written with --no-predecessor): "
                             "run sssp again without it to trace paths")
        raise StoreError(f"{store.path}: no SSSP result {name!r}")
    if isinstance(targets, Points):
        pts = targets
    elif isinstance(targets, (str, os.PathLike)):
        pts = read_points(targets, store, crs=crs, skip_invalid=skip_invalid, what="target")
    else:
        pts = from_coordinates(store, targets, cell=cell, skip_invalid=skip_invalid, what="target", crs=crs)
    if len(pts) == 0:
        raise InputError(f"no target lies on the DEM's data ({pts.skipped} left out)")
    rows, cols = store.shape
    tiles = _Tiles(store, name)
    seen: dict[int, tuple[int, int]] = {}  # cell id -> (path number, position in its target-first walk)
    walks: dict[int, np.ndarray] = {}  # target first, (n, 2) int64
    out: list = [None] * len(pts)
    t = store.tile_size
    by_tile = np.argsort((pts.cells[:, 0] // t) * store.tile_grid[1] + pts.cells[:, 1] // t, kind="stable")
    for k in by_tile.tolist():  # targets tile by tile: their walks share the tiles just read
        r, c = int(pts.cells[k, 0]), int(pts.cells[k, 1])
        cost, p = tiles.get(r, c)
        walk = np.zeros((0, 2), np.int64)
        if np.isfinite(cost):
            new, d, rest = [(r, c)], cost, None
            while p != NO_PRED:
                if p > 7 or len(new) > rows * cols:
                    raise StoreError(f"sssp/{name}: broken predecessor chain at cell {r},{c}")
                r, c = r + int(DR[p]), c + int(DC[p])
                hit = seen.get(r * cols + c)
                if hit is not None:  # an earlier path goes on from here
                    rest = walks[hit[0]][hit[1]:]
                    break
                d, p = tiles.get(r, c)
                new.append((r, c))
            else:
                if d != 0:
                    raise StoreError(f"sssp/{name}: predecessor chain ends at cell {r},{c} which is not a source")
            for i, (wr, wc) in enumerate(new):  # only the cells walked: the rest is registered already
                seen.setdefault(wr * cols + wc, (k, i))
            walk = np.array(new, np.int64) if rest is None else np.concatenate([np.array(new, np.int64), rest])
        else:
            cost = np.inf
        walks[k] = walk
        cells = walk[::-1]
        x, y = store.cell_to_map(cells[:, 0], cells[:, 1])
        out[k] = TracedPath(name, cells, cost, np.column_stack([x, y]), (int(pts.cells[k, 0]), int(pts.cells[k, 1])),
                            int(pts.index[k]))
    return out


def check_paths_output(out, overwrite: bool = False) -> str:
    """The OGR driver for writing paths to ``out`` (GeoJSON is written here, without pyogrio)."""
    return vectors.check_output(out, overwrite, own_geojson=True)


def write_paths(store, paths, out, overwrite: bool = False) -> Path:
    """Write paths to ``out`` in the format its suffix names (:data:`terrain_io.vectors.DRIVERS`): GeoJSON here
    (:func:`write_geojson`), GeoPackage, Shapefile and FlatGeobuf through pyogrio, with the same
    features (the cells [row, col] as two integer fields each: ``target_row``, ``target_col``,
    ``source_row``, ``source_col``). An existing ``out`` is replaced only with ``overwrite``."""
    out = Path(out)
    driver = check_paths_output(out, overwrite)
    if driver == "GeoJSON":
        return write_geojson(store, paths, out)
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    paths = [paths] if isinstance(paths, TracedPath) else list(paths)
    features = [p.feature(store) for p in paths]
    props = [f["properties"] for f in features]

    def ints(key, i):  # part i of the [row, col] property ``key`` (0 where it is null: masked)
        return np.array([q[key][i] if q[key] is not None else 0 for q in props], np.int64)

    unset = np.array([q["source_cell"] is None for q in props])
    fields = {"target": (np.array([q["target"] for q in props], np.int64), None),
              "target_row": (ints("target_cell", 0), None), "target_col": (ints("target_cell", 1), None),
              "source_row": (ints("source_cell", 0), unset), "source_col": (ints("source_cell", 1), unset),
              "cost": (np.array([np.nan if q["cost"] is None else q["cost"] for q in props]), None),
              "cells": (np.array([q["cells"] for q in props], np.int64), None),
              "sssp": (np.array([q["sssp"] for q in props], object), None),
              "weight": (np.array([q["weight"] or "" for q in props], object), None)}
    geometry = [vectors.wkb_linestring(f["geometry"]["coordinates"]) if f["geometry"] else None for f in features]
    return vectors.write_features(out, geometry, {k: v for k, (v, _) in fields.items()}, "LineString", store.crs,
                                  overwrite, masks={k: m for k, (_, m) in fields.items()})


def write_geojson(store, paths, out) -> Path:
    """Write a path or a list of paths as one GeoJSON FeatureCollection (CRS named when the store has one)."""
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    paths = [paths] if isinstance(paths, TracedPath) else list(paths)
    weights = {p.name: store.group[f"sssp/{p.name}"].attrs.get("weight") for p in paths}
    head = {"type": "FeatureCollection"}
    crs = _crs_name(store.crs)
    if crs:
        head["crs"] = {"type": "name", "properties": {"name": crs}}
    out = Path(out)
    with atomic_file(out) as tmp, open(tmp, "w") as f:  # feature by feature: no string of the whole file
        f.write(json.dumps(head)[:-1] + ', "features": [')
        for i, p in enumerate(paths):
            f.write((", " if i else "") + json.dumps(p.feature(store, weights[p.name])))
        f.write("]}")
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
