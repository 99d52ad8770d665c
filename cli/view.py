"""Looking at results: ``terrain overviews`` (pyramids in the store) and ``terrain view`` (a local web map)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import Timer, memory_option, quiet, say, scheduler_option
from .main import cli


@cli.command(short_help="Write overviews (a pyramid of coarser levels) of a store's arrays.")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("arrays", nargs=-1)
@memory_option
@scheduler_option
def overviews(store, arrays, memory, scheduler):
    """Write the overviews of ARRAYS (default: elevation and every result) into STORE/overviews/ARRAY:
    levels 1, 2, ... each half the last (mean of continuous values, the most frequent of codes and
    ids, the maximum of flow accumulation and stream orders) down to one tile, laid out after the
    Zarr multiscales convention (GeoZarr), so xarray opens each level with its coordinates.
    """
    from terrain_io.overviews import write_overviews

    timer = Timer()
    done = write_overviews(store, arrays, memory=memory, scheduler=scheduler, progress=not quiet(), announce=say)
    listed = ", ".join(f"{name} ({levels} levels)" for name, levels in done.items())
    say(f"{store}: overviews of {listed} in {timer.elapsed:.2f} s")
