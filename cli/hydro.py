"""``terrain watershed | basins | streams | hand STORE``: the hydrology on ``terrain flow``'s
directions (terrain_io.grid.hydro.pipeline)."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from terrain_io.backend import start_gpu

from .common import (device_option, memory_option, new_output_file, output_option, overviews_option,
                     overwrite_files_option, quiet, say, scheduler_option, table_option)
from .main import cli

threshold_option = click.option("--threshold", type=float, required=True,
                                help="A cell is on a stream where its accumulation reaches this (> 0).")
units_option = click.option("--units", type=click.Choice(["cells", "m2"]), default="cells", show_default=True,
                            help="Units of --threshold: cells, or square metres of upstream area.")


def _pair(text: str, what: str) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{what} must be two numbers A,B, got {text!r}") from None
    return a, b


def _report(result, table, output, vectors: str) -> None:
    """Say the result's summary line with where the table (``--table``, written by the command) and the
    vectors (``-o``) went."""
    say(result.line + (f"; table -> {table}" if table is not None else "")
        + (f"; {vectors} -> {output}" if output is not None else ""))


@cli.command(short_help="The watershed of each outlet (labels, polygons).")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--at", "points", multiple=True, metavar="X,Y",
              help="An outlet in map coordinates (the store's CRS, or --at-crs); repeat for several.")
@click.option("--at-crs", default=None, metavar="CRS", help="CRS of the --at coordinates, e.g. EPSG:4326.")
@click.option("--cell", "cells", multiple=True, metavar="ROW,COL", help="An outlet given by its cell; repeatable.")
@click.option("--outlets", "outlets_file", default=None, metavar="FILE|ARRAY",
              help="Outlets from a file: points (GeoJSON, GeoPackage, Shapefile, CSV) or a raster aligned with "
                   "the DEM whose non-zero cells are outlets (the readers of terrain sssp --sources).")
@click.option("--outlets-crs", default=None, metavar="CRS", help="CRS of the --outlets points [default: the file's].")
@click.option("--snap", type=float, default=None, metavar="DIST",
              help="Move each outlet to the cell of largest accumulation within DIST map units (ESRI Snap Pour "
                   "Point); the result's attributes record where.")
@click.option("--name", default="default", show_default=True, help="The result: STORE/watershed/NAME/label.")
@output_option("Also write the watersheds as polygons (.gpkg, .geojson, .shp, .fgb): id, cells, area_m2, outlet.",
               default=None, callback=new_output_file)
@overwrite_files_option
@memory_option
@device_option
@scheduler_option
@overviews_option
def watershed(store, points, at_crs, cells, outlets_file, outlets_crs, snap, name, output, memory, device, scheduler):
    """Watershed of each outlet: STORE/watershed/NAME/label (uint32: the number of the outlet, in the
    order given -- --at, then --cell, then --outlets -- a cell drains to first; 0 none). A nested
    outlet splits its parent's area (ESRI Watershed, Whitebox)."""
    start_gpu(device)
    from terrain_io.grid.hydro.pipeline import watershed as run
    from terrain_io.points import from_coordinates, read_points
    from terrain_io.store import TerrainStore

    if not points and not cells and outlets_file is None:
        raise click.UsageError("give the outlets: --at X,Y, --cell ROW,COL (repeatable) or --outlets FILE")
    st = TerrainStore.open(store)
    parts = []
    if points:
        parts.append(from_coordinates(st, [_pair(p, "--at") for p in points], what="outlet", crs=at_crs).cells)
    if cells:
        parts.append(from_coordinates(st, [_pair(c, "--cell") for c in cells], cell=True, what="outlet").cells)
    if outlets_file is not None:
        parts.append(read_points(outlets_file, st, outlets_crs, what="outlet").cells)
    outlets = np.concatenate(parts)
    overwrite = click.get_current_context().meta.get("overwrite", False)
    result = run(st, outlets, name=name, snap=snap, memory=memory, progress=not quiet(), vectors=output,
                 overwrite=overwrite, device=device, scheduler=scheduler, announce=say)
    _report(result, None, output, "polygons")


@cli.command(short_help="Every drainage basin (labels, table, polygons).")
@click.argument("store", type=click.Path(path_type=Path))
@table_option("the basin table (id, outlet cell and its centre, cells, area)")
@output_option("Also write the basins as polygons (.gpkg, .geojson, .shp, .fgb) with the table's fields.",
               default=None, callback=new_output_file)
@overwrite_files_option
@memory_option
@device_option
@scheduler_option
@overviews_option
def basins(store, table, output, memory, device, scheduler):
    """Every drainage basin: STORE/basins/label (uint32, one basin per cell that drains out of the DEM,
    at nodata or into a pit, numbered 1.. in row-major order of those cells; 0 at nodata)."""
    start_gpu(device)
    from terrain_io.grid.hydro.pipeline import basins as run

    overwrite = click.get_current_context().meta.get("overwrite", False)
    result = run(store, memory=memory, progress=not quiet(), vectors=output, overwrite=overwrite, device=device,
                 scheduler=scheduler, announce=say, table=table)
    _report(result, table, output, "polygons")


@cli.command(short_help="The stream network: Strahler order, links, vectors.")
@click.argument("store", type=click.Path(path_type=Path))
@threshold_option
@units_option
@table_option("the link table (id, downstream link, Strahler order, Shreve magnitude, cells, head, tail)")
@output_option("Write the network as vectors, one LineString a link (.gpkg, .geojson, .shp, .fgb).",
               default=None, callback=new_output_file)
@overwrite_files_option
@memory_option
@device_option
@scheduler_option
@overviews_option
def streams(store, threshold, units, table, output, memory, device, scheduler):
    """Stream network of the cells whose accumulation reaches --threshold: STORE/streams/order
    (Strahler, uint8, 0 off the network), streams/magnitude (Shreve) and streams/link (uint32 link ids:
    a link runs from a source or junction to the next; numbered in row-major order of their heads)."""
    from terrain_io.grid.hydro import start_link_kernels, warm_gpu

    start_gpu(device, then=warm_gpu)  # the network's GPU kernels loaded once the context is made
    if (device or "auto").lower() != "cpu":  # the GPU route's CPU kernels, loaded beside the imports
        start_link_kernels()
    from terrain_io.grid.hydro.pipeline import streams as run

    overwrite = click.get_current_context().meta.get("overwrite", False)
    result = run(store, threshold, units=units, memory=memory, progress=not quiet(), vectors=output,
                 overwrite=overwrite, device=device, scheduler=scheduler, announce=say, table=table)
    _report(result, table, output, "links")


@cli.command(short_help="Height above the nearest drainage (HAND).")
@click.argument("store", type=click.Path(path_type=Path))
@threshold_option
@units_option
@memory_option
@device_option
@scheduler_option
@overviews_option
def hand(store, threshold, units, memory, device, scheduler):
    """Height above the nearest drainage: STORE/hand/height (float32: a cell's elevation minus that
    of the first stream cell on its flow path; NaN where it meets none) and hand/drainage (that
    cell's link id, 0 none). Streams as terrain streams --threshold defines them."""
    start_gpu(device)
    from terrain_io.grid.hydro.pipeline import hand as run

    say(run(store, threshold, units=units, memory=memory, progress=not quiet(), device=device, scheduler=scheduler,
            announce=say).line)
