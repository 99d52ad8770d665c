"""Shortest-path commands: ``terrain sssp``, ``terrain index``, ``terrain path``."""
from __future__ import annotations

from pathlib import Path

import click

from .common import Timer, device_option, quiet, say, scheduler_option
from .main import cli

WEIGHTS = ["absdiff", "surface", "cell", "walk"]


def _pair(text: str) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise click.BadParameter(f"expected two numbers 'A,B', got {text!r}") from None
    return a, b


weight_option = click.option("--weight", type=click.Choice(WEIGHTS), default="absdiff", show_default=True,
                             help="Edge weight: |dh| (absdiff), 3-D walking distance (surface), the cost "
                                  "raster's (c_i + c_j)/2 * step (cell), or walking time in seconds by "
                                  "Tobler's hiking function, uphill slower than down (walk).")
cost_option = click.option("--cost", help="Cost raster for --weight cell, or friction raster for --weight walk (the "
                                          "time times the two cells' mean friction): a GeoTIFF/ASCII file aligned "
                                          "with the DEM, or the name of an array in the store.")
cluster_option = click.option("--cluster", type=int, default=None,
                              help="Cluster side in cells (power of two, at most the tile size) [default: 8, or the stored index's].")
memory_option = click.option("--memory", default=None, help="Memory budget, e.g. 2GB [default: half the free RAM].")


@cli.command("sssp")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--source", "sources", multiple=True, required=True,
              help="Source X,Y in map coordinates (ROW,COL with --cell); repeat for several sources.")
@click.option("--cell", "as_cell", is_flag=True, help="Sources are ROW,COL cell indices.")
@click.option("--crs-coords", "crs_coords", is_flag=True, help="Sources are map coordinates (the default).")
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
              help="Leave cells farther than this unreached (+inf); the work then follows the area reached.")
@click.option("--allocation", is_flag=True,
              help="Also write sssp/NAME/source: the number of the nearest source (1, 2, ... in the order "
                   "given; 0 unreached), as GRASS r.cost nearest= and ArcGIS Cost Allocation.")
@scheduler_option
def sssp_command(store, sources, as_cell, crs_coords, weight, cost, name, cluster, device, memory, method,
                 rebuild_index, max_cost, allocation, scheduler):
    """Shortest paths from one or several sources over the DEM's 8-connected grid graph.

    Writes sssp/NAME/distance (float32; +inf unreachable, NaN nodata; seconds with --weight walk)
    and sssp/NAME/predecessor (direction code of the parent, 255 at sources and unreached cells),
    and with --allocation sssp/NAME/source. The index method keeps its
    boundary index (phase 1) in the store for later sources.
    """
    from terrain_io.grid.sssp import sssp

    if as_cell and crs_coords:
        raise click.UsageError("--cell and --crs-coords exclude each other")
    timer = Timer()
    res = sssp(store, [_pair(s) for s in sources], weight=weight, name=name, device=device, memory=memory,
               progress=not quiet(), cost=cost, cell=as_cell, cluster=cluster, rebuild_index=rebuild_index,
               scheduler=scheduler, announce=say, method=method, max_cost=max_cost, allocation=allocation)
    say(f"sssp/{res.name}: {len(res.sources)} source(s), weight {res.weight}, {res.reached:,} cells reached, "
        f"max distance {res.max_distance:.6g}; {res.phases()}; total {timer.elapsed:.2f} s")


@cli.command("index")
@click.argument("store", type=click.Path(path_type=Path))
@weight_option
@cost_option
@cluster_option
@device_option
@memory_option
@click.option("--rebuild", is_flag=True, help="Rebuild even if an index for these settings is stored.")
@scheduler_option
def index_command(store, weight, cost, cluster, device, memory, rebuild, scheduler):
    """Build the SSSP boundary index (phase 1) for a weight model, so later sources skip it."""
    from terrain_io.backend import resolve_device
    from terrain_io.grid.sssp.index import Field, ensure_index
    from terrain_io.memory import memory_budget
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(store)
    timer = Timer()
    field = Field(st, weight, cost)
    try:
        idx, reused = ensure_index(st, field, cluster, resolve_device(device), not quiet(), rebuild=rebuild,
                                   scheduler=scheduler, announce=say, memory=memory_budget(memory))
    finally:
        field.close()
    if reused:
        say(f"{idx.name}: already built (cluster {idx.cluster}); use --rebuild to redo it")
        return
    say(f"{idx.name}: clusters of {idx.cluster}^2, {idx.d.shape[0]} x {idx.d.shape[1]} blocks of "
        f"{idx.d.shape[2]}^2 boundary distances in {timer.elapsed:.2f} s")


@cli.command("path")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--to", "target", required=True, help="Target X,Y in map coordinates (ROW,COL with --cell).")
@click.option("--cell", "as_cell", is_flag=True, help="The target is a ROW,COL cell index.")
@click.option("--name", default=None, help="The SSSP result to follow [default: the latest].")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="GeoJSON file for the path [default: print the summary only].")
def path_command(store, target, as_cell, name, out):
    """Follow the predecessors from a target back to the source; write a GeoJSON LineString with its cost."""
    from terrain_io.grid.sssp.path import trace, write_geojson

    p = trace(store, _pair(target), name=name, cell=as_cell)
    if out is not None:
        write_geojson(store, p, out)
    say(f"path sssp/{p.name}: {len(p.cells)} cells from {tuple(map(int, p.cells[0]))} to "
        f"{tuple(map(int, p.cells[-1]))}, "
        f"cost {p.cost:.6g}" + (f" -> {out}" if out else ""))
