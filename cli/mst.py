"""``terrain mst STORE``: minimum spanning forest of a DEM store (terrain_io.grid.mst)."""
from __future__ import annotations

from pathlib import Path

import click

from terrain_io.backend import start_gpu

from .common import device_option, memory_option, overviews_option, quiet, say, scheduler_option
from .main import cli


@cli.command(short_help="Minimum spanning forest of the DEM's grid graph.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--weight", type=click.Choice(["max", "absdiff"]), default="max", show_default=True,
              help="Edge weight: max = max(h_i, h_j) (the default), absdiff = |h_i - h_j|.")
@device_option
@memory_option
@click.option("--method", type=click.Choice(["auto", "incore", "tiled"]), default="auto", show_default=True,
              help="incore: the whole DEM in memory (GPU memory with --device gpu: one Boruvka over the whole "
                   "grid, up to 2^30 cells); tiled: out of core, tile forests merged up the quadtree; auto: incore "
                   "where it fits (on the CPU a small DEM), else tiled. Same results from each.")
@scheduler_option
@overviews_option
def mst(store, weight, device, memory, method, scheduler):
    """Minimum spanning forest of the DEM's 8-connected grid graph, written to STORE/mst/edges.

    In GPU memory where the DEM fits it, else out of core: tiles are read in z-order, their spanning
    forests contracted and merged up the quadtree. The result is a uint8 bitmask per cell (bit k: the
    edge to the neighbour in direction k = 0 E, 1 SE, 2 S, 3 SW). Nodata cells are not vertices: one
    tree per island.
    """
    def warm():  # the in-core route's kernels and nvCOMP, loaded in start_gpu's thread
        from terrain_io.grid.mst import warm_gpu

        warm_gpu(store, weight)

    start_gpu(device, then=warm)
    from terrain_io.grid.mst import mst as run_mst

    result = run_mst(store, weight=weight, device=device, memory=memory, progress=not quiet(), scheduler=scheduler,
                     announce=say, method=method)
    say(result.summary())
