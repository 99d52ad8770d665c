"""Shortest-path commands: ``terrain sssp``, ``terrain index``, ``terrain path``."""
from __future__ import annotations

from pathlib import Path

import click

from terrain_io.backend import start_gpu
from terrain_io.errors import TerrainError
from terrain_io.units import cli_weight, distance_unit, number

from .common import (
    AliasedOption,
    Timer,
    device_option,
    memory_option,
    output_option,
    overviews_option,
    overwrite_option,
    quiet,
    say,
    scheduler_option,
)
from .main import cli

WEIGHTS = ["absdiff", "surface", "cell", "walk"]


def _pair(text: str) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise click.BadParameter(f"expected two numbers 'A,B', got {text!r}") from None
    return a, b


def _cell_points(points: tuple[str, ...], cells: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """``--source``/``--to`` values and ``--cell`` ones (``--cell ROW,COL``, or ``--cell`` alone: a flag
    that makes every point a cell): (the points, whether they are cells)."""
    return tuple(points) + tuple(c for c in cells if c), bool(cells)


weight_option = click.option("--weight", type=click.Choice(WEIGHTS), default="absdiff", show_default=True,
                             help="Edge weight: |dh| (absdiff), 3-D walking distance (surface), the cost "
                                  "raster's (c_i + c_j)/2 * step (cell), or walking time in seconds by "
                                  "Tobler's hiking function, uphill slower than down (walk).")
cost_option = click.option("--cost", help="Cost raster for --weight cell, or friction raster for --weight walk (the "
                                          "time times the two cells' mean friction): a GeoTIFF/ASCII file aligned "
                                          "with the DEM, or the name of an array in the store.")
def _check_point_options(points, points_file, file_crs, points_crs, as_cell: bool, flag: str, file_flag: str) -> None:
    """The rules of --cell and the two CRS options, the same for the sources of sssp (``--source``,
    ``--sources FILE``) and the targets of path (``--to``, ``--targets FILE``)."""
    if file_crs is not None and points_file is None:
        raise click.UsageError(f"{file_flag}-crs applies to {file_flag} FILE (for {flag} X,Y: {flag}-crs)")
    if as_cell and not points:
        raise click.UsageError(f"--cell applies to {flag} ROW,COL")
    if points_crs is not None and (not points or as_cell):
        raise click.UsageError(f"{flag}-crs applies to {flag} X,Y map coordinates")


def point_options(point: str, points: str, flag: str, file_flag: str):
    """What the sources of sssp (``--source``, ``--sources FILE``) and the targets of path (``--to``,
    ``--targets FILE``) take alike (rules: :func:`_check_point_options`): the CRS of the file's points
    and of the X,Y coordinates, ``--skip-invalid``, and ``--cell`` (a ``point`` by its ROW,COL, or
    alone: the ``flag`` values read as cells)."""
    options = [
        click.option(f"{file_flag}-crs", default=None, metavar="CRS",
                     help=f"CRS of the {file_flag} points, e.g. EPSG:4326 [default: the file's; a CSV's: the DEM's]."),
        click.option(f"{flag}-crs", default=None, metavar="CRS",
                     help=f"CRS of the {flag} X,Y coordinates, e.g. EPSG:4326 for lon,lat [default: the DEM's]."),
        click.option("--skip-invalid", is_flag=True, help=f"Leave out {points} outside the DEM or on nodata (a note "
                     "says how many) instead of refusing them."),
        click.option("--cell", "cells", multiple=True, is_flag=False, flag_value="", metavar="[ROW,COL]",
                     help=f"A {point} given by its cell, ROW,COL (repeatable); alone (no value): the {flag} "
                          "values are ROW,COL cell indices."),
    ]

    def add(f):
        for option in reversed(options):
            f = option(f)
        return f

    return add


cluster_option = click.option("--cluster", type=int, default=None,
                              help="Cluster side in cells (power of two, at most the tile size) [default: 8, or the stored index's].")


@cli.command("sssp", short_help="Shortest paths from sources over the DEM's grid graph.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--source", "sources", multiple=True,
              help="Source X,Y in map coordinates (ROW,COL with --cell); repeat for several sources.")
@click.option("--sources", "sources_file", default=None, metavar="FILE|ARRAY",
              help="Sources from a file: points (GeoJSON, GeoPackage, Shapefile, ...; CSV with x,y / lon,lat / "
                   "easting,northing columns), or a raster aligned with the DEM (GeoTIFF/ASCII, or the name of "
                   "a store array) whose non-zero cells are sources. With --source, both count.")
@point_options("source", "sources", "--source", "--sources")
@click.option("--crs-coords", "crs_coords", is_flag=True, hidden=True)  # the default, kept for scripts: no --cell
@weight_option
@cost_option
@click.option("--name", default=None, help="Result name: sssp/NAME [default: from the source cell].")
@cluster_option
@device_option
@memory_option
@click.option("--method", type=click.Choice(["auto", "incore", "shards", "index"]), default="auto", show_default=True,
              help="incore: the whole grid in memory (GPU memory with --device gpu); shards: out of core, "
                   "blocks of shards solved in turn within --memory (Dask tasks with --scheduler); index: the "
                   "three-phase pipeline over the stored boundary index (fast for every further source); auto: "
                   "the stored index if there is one, else incore if it fits --memory, else shards. Same "
                   "results from each.")
@click.option("--rebuild-index", is_flag=True, help="Rebuild the boundary index even if one is stored.")
@click.option("--max-cost", type=float, default=None,
              help="Leave cells farther than this unreached (+inf); the work then follows the area reached. In "
                   "the distance's unit: m for absdiff and surface, s for walk, cost x m for cell.")
@click.option("--allocation", is_flag=True,
              help="Also write sssp/NAME/source: the number of the nearest source (1, 2, ... in the order "
                   "given; 0 unreached), as GRASS r.cost nearest= and ArcGIS Cost Allocation.")
@click.option("--no-predecessor", "no_predecessor", is_flag=True,
              help="Write the distances only, without sssp/NAME/predecessor (then no 'terrain path' from it).")
@scheduler_option
@overviews_option
def sssp_command(store, sources, sources_file, sources_crs, source_crs, skip_invalid, cells, crs_coords, weight, cost,
                 name, cluster, device, memory, method, rebuild_index, max_cost, allocation, no_predecessor, scheduler):
    """Shortest paths from one or several sources over the DEM's 8-connected grid graph.

    Writes sssp/NAME/distance (float32; +inf unreachable, NaN nodata; seconds with --weight walk)
    and sssp/NAME/predecessor (direction code of the parent, 255 at sources and unreached cells;
    not with --no-predecessor), and with --allocation sssp/NAME/source. The index method keeps its
    boundary index (phase 1) in the store for later sources.
    """
    start_gpu(device)
    from terrain_io.grid.sssp import sssp

    sources, as_cell = _cell_points(sources, cells)
    if as_cell and crs_coords:
        raise click.UsageError("--cell and --crs-coords exclude each other")
    if not sources and sources_file is None:
        raise click.UsageError("give the sources: --source X,Y (repeatable) or --sources FILE")
    _check_point_options(sources, sources_file, sources_crs, source_crs, as_cell, "--source", "--sources")
    timer = Timer()
    src, cell = [_pair(s) for s in sources], as_cell
    if sources_file is not None and sources:  # both: one list of points, numbered on
        from terrain_io.points import from_coordinates, read_points
        from terrain_io.store import TerrainStore

        st = TerrainStore.open(store)
        src = from_coordinates(st, src, as_cell, skip_invalid, "source", source_crs).then(
            read_points(sources_file, st, sources_crs, skip_invalid, "source"))
    elif sources_file is not None:
        src = sources_file
    else:
        sources_crs = source_crs  # the library's one CRS for whatever the sources are
    res = sssp(store, src, weight=weight, name=name, device=device, memory=memory,
               progress=not quiet(), cost=cost, cell=cell, cluster=cluster, rebuild_index=rebuild_index,
               scheduler=scheduler, announce=say, method=method, sources_crs=sources_crs, skip_invalid=skip_invalid,
               max_cost=max_cost, allocation=allocation, predecessor=not no_predecessor)
    unit = distance_unit(res.weight)
    say(f"sssp/{res.name}: {len(res.sources)} source(s), weight {cli_weight(res.weight)}, {res.reached:,} cells "
        f"reached, max distance {number(res.max_distance, 'float32')} {unit}; {res.phases()}; "
        f"total {timer.elapsed:.2f} s")


@cli.command("index", short_help="Build the SSSP boundary index for later sources.")
@click.argument("store", type=click.Path(path_type=Path))
@weight_option
@cost_option
@cluster_option
@device_option
@memory_option
@click.option("--rebuild-index", "--rebuild", "rebuild_index", cls=AliasedOption, hidden_aliases=("--rebuild",),
              is_flag=True, help="Rebuild even if an index for these settings is stored.")
@scheduler_option
def index_command(store, weight, cost, cluster, device, memory, rebuild_index, scheduler):
    """Build the SSSP boundary index (phase 1) for a weight model, so later sources skip it."""
    from terrain_io.backend import resolve_device
    from terrain_io.grid.sssp.index import Field, ensure_index
    from terrain_io.memory import memory_budget
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(store)
    timer = Timer()
    field = Field(st, weight, cost)
    try:
        idx, reused = ensure_index(st, field, cluster, resolve_device(device), not quiet(), rebuild=rebuild_index,
                                   scheduler=scheduler, announce=say, memory=memory_budget(memory))
    finally:
        field.close()
    if reused:
        say(f"{idx.name}: already built (cluster {idx.cluster}); use --rebuild-index to redo it")
        return
    say(f"{idx.name}: clusters of {idx.cluster}^2, {idx.d.shape[0]} x {idx.d.shape[1]} blocks of "
        f"{idx.d.shape[2]}^2 boundary distances in {timer.elapsed:.2f} s")


@cli.command("path", short_help="Trace the paths from targets back to the source.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--to", "to", multiple=True, help="Target X,Y in map coordinates (ROW,COL with --cell); repeatable.")
@click.option("--targets", "targets_file", default=None, metavar="FILE|ARRAY",
              help="Targets from a file, read as --sources of 'terrain sssp' (points, CSV, or a raster's non-zero cells).")
@point_options("target", "targets", "--to", "--targets")
@click.option("--name", default=None, help="The SSSP result to follow [default: the latest].")
@output_option("File for the paths, its format by suffix: .geojson, .gpkg (GeoPackage), .shp (Shapefile) or "
               ".fgb (FlatGeobuf; these three need pyogrio) [default: print the summary only].")
@overwrite_option
def path_command(store, to, targets_file, targets_crs, to_crs, skip_invalid, cells, name, output, overwrite):
    """Follow the predecessors from each target back to the source; write the paths as vector features.

    One LineString Feature per target (source to target) with properties target (its number in the
    input, from 0), target_cell, source_cell, cost and cells (in .gpkg/.shp/.fgb the cells as
    target_row, target_col, source_row, source_col); a target the source does not reach keeps its
    Feature with a null geometry and cost (an error when no target is reached).
    """
    from terrain_io.grid.sssp.path import check_paths_output, trace_all, write_paths
    from terrain_io.store import TerrainStore

    to, as_cell = _cell_points(to, cells)
    if bool(to) == (targets_file is not None):
        raise click.UsageError("give the targets: --to X,Y (repeatable) or --targets FILE, not both")
    _check_point_options(to, targets_file, targets_crs, to_crs, as_cell, "--to", "--targets")
    if output is not None:
        check_paths_output(output, overwrite)  # before the work
    targets = targets_file if targets_file is not None else [_pair(t) for t in to]
    paths = trace_all(store, targets, name=name, cell=as_cell, crs=targets_crs if targets_file else to_crs,
                      skip_invalid=skip_invalid)
    reached = [p for p in paths if p.reached]
    if not reached:
        which = f"target {to[0]} is not" if len(to) == 1 else f"none of the {len(paths)} targets is"
        raise TerrainError(f"{which} reachable from the source(s) of sssp/{paths[0].name}")
    if output is not None:
        write_paths(store, paths, output, overwrite)
    if len(reached) < len(paths):
        click.echo(f"terrain: note: {len(paths) - len(reached)} of {len(paths)} targets not reached from the "
                   f"source(s) of sssp/{paths[0].name}: their features have a null geometry and cost", err=True)
    to_out = f" -> {output}" if output else ""
    unit = distance_unit(TerrainStore.open(store, mode="r").group[f"sssp/{paths[0].name}"].attrs.get("weight", ""))
    if len(paths) == 1:
        p = paths[0]
        say(f"path sssp/{p.name}: {len(p.cells)} cells from cell {tuple(map(int, p.cells[0]))} to cell "
            f"{tuple(map(int, p.cells[-1]))}, cost {number(p.cost, 'float32')} {unit}{to_out}")
        return
    costs = [p.cost for p in reached]
    say(f"paths sssp/{paths[0].name}: {len(paths)} targets, {len(reached)} reached, "
        f"{sum(len(p.cells) for p in reached):,} cells, cost {number(min(costs), 'float32')} .. "
        f"{number(max(costs), 'float32')} {unit}{to_out}")
