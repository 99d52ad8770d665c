"""``terrain flow STORE``: flow directions and accumulation (terrain_io.grid.flow.pipeline)."""
from __future__ import annotations

from pathlib import Path

import click

from terrain_io.backend import start_gpu

from .common import device_option, memory_option, outlets_option, overviews_option, quiet, say, scheduler_option
from .main import cli


@cli.command(short_help="Flow directions (D8, flats resolved) and accumulation.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--condition", type=click.Choice(["fill", "none"]), default="fill", show_default=True,
              help="fill: route the filled DEM (fill/elevation; terrain fill runs first when it is missing); "
                   "none: route the DEM as it is (pits become sinks).")
@outlets_option
@click.option("--weights", default=None, metavar="FILE|ARRAY",
              help="Sum these weights instead of counting cells: a raster file or an array of the store of the "
                   "DEM's shape, finite and >= 0 at every valid cell.")
@click.option("--exclude-self", is_flag=True,
              help="Leave each cell out of its own accumulation (the ESRI convention; default: counted, as "
                   "TauDEM, Whitebox and pysheds).")
@device_option
@memory_option
@scheduler_option
@overviews_option
def flow(store, condition, outlets, weights, exclude_self, device, memory, scheduler):
    """Flow directions and accumulation: STORE/flow/direction (uint8 D8 codes: 0..7 = E, SE, S, SW, W,
    NW, N, NE; 8 drains out of the DEM; 9 no outflow; 255 nodata) and flow/accumulation (uint64
    cells draining through each cell, or float64 sums of --weights, exact: the same bytes everywhere).

    Steepest descent (drop over step length; ties to the lowest code); flats routed away from higher
    ground and toward lower ground (Barnes, Lehman & Mulla 2014). Out of core: windows accumulated
    alone, their boundary flows solved together, windows finished (Barnes 2017).
    """
    start_gpu(device)
    from terrain_io.grid.flow.pipeline import flow as run_flow

    result = run_flow(store, condition=condition, outlets=outlets, weights=weights, include_self=not exclude_self,
                      device=device, memory=memory, progress=not quiet(), scheduler=scheduler, announce=say)
    say(result.summary())
