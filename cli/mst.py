"""``terrain mst STORE``: minimum spanning forest of a DEM store (terrain_io.grid.mst)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import device_option, memory_option, overviews_option, quiet, say, scheduler_option
from .main import cli


@cli.command(short_help="Minimum spanning forest of the DEM's grid graph.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--weight", type=click.Choice(["max", "absdiff"]), default="max", show_default=True,
              help="Edge weight: max = max(h_i, h_j) (the default), absdiff = |h_i - h_j|.")
@device_option
@memory_option
@scheduler_option
@overviews_option
def mst(store, weight, device, memory, scheduler):
    """Minimum spanning forest of the DEM's 8-connected grid graph, written to STORE/mst/edges.

    Out of core: tiles are read in z-order, their spanning forests contracted and merged up the
    quadtree; the result is a uint8 bitmask per cell (bit k: the edge to the neighbour in direction
    k = 0 E, 1 SE, 2 S, 3 SW). Nodata cells are not vertices: one tree per island.
    """
    from terrain_io.backend import start_gpu

    start_gpu(device)  # the CUDA context made while the pipeline's modules import (cli/hydro.py does the same)
    from terrain_io.grid.mst import mst as run_mst

    result = run_mst(store, weight=weight, device=device, memory=memory, progress=not quiet(), scheduler=scheduler,
                     announce=say)
    say(result.summary())
