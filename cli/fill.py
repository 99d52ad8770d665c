"""``terrain fill STORE``: depression filling and the depression table (terrain_io.grid.fill)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import (
    device_option,
    memory_option,
    outlets_option,
    overviews_option,
    overwrite_files_option,
    quiet,
    say,
    scheduler_option,
    table_option,
)
from .main import cli


def _outputs(ctx, param, value):
    """The named arrays, checked before any work (an unknown name is a usage error)."""
    from terrain_io.errors import TerrainError
    from terrain_io.grid.fill import check_outputs

    try:
        return check_outputs(value)
    except TerrainError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command(short_help="Fill the depressions (Priority-Flood, exact).")
@click.argument("store", type=click.Path(path_type=Path))
@outlets_option
@overwrite_files_option
@table_option("the depression table (one row per depression)")
@device_option
@memory_option
@scheduler_option
@click.option("--outputs", default="elevation,depth,depression", show_default=True, callback=_outputs,
              metavar="NAMES", help="The arrays to write, joined by commas: elevation, depth, depression.")
@overviews_option
def fill(store, outlets, table, device, memory, scheduler, outputs):
    """Fill the depressions of the DEM: STORE/fill/elevation (filled DEM), fill/depth (float32) and
    fill/depression (uint32 id, 0 outside depressions), or those named by --outputs.

    The fill level of a cell is the least, over paths to an outlet, of the highest elevation on the
    path (Priority-Flood, exactly; the max-weight path to the outside in the minimum spanning
    forest). Out of core: tiles flooded alone, their boundaries solved together, tiles finished.
    Depression ids follow each depression's first cell in row-major order.
    """
    from terrain_io.grid.fill import fill as run_fill
    from terrain_io.grid.fill import write_table

    result = run_fill(store, outlets=outlets, device=device, memory=memory, progress=not quiet(),
                      scheduler=scheduler, announce=say, outputs=outputs)
    if table is not None:
        write_table(result, store, table)
    say(result.summary() + (f"; table -> {table}" if table is not None else ""))
