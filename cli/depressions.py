"""``terrain depressions STORE``: the depression hierarchy and the basin raster (terrain_io.grid.depressions)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import (device_option_for, memory_option, outlets_option, overviews_option, overwrite_files_option, quiet,
                     say, table_option)
from .main import cli


@cli.command(short_help="Depression hierarchy and basin raster (Barnes et al. 2020).")
@click.argument("store", type=click.Path(path_type=Path))
@outlets_option
@overwrite_files_option
@table_option("the tree (one row per node: leaves, then merges)")
@device_option_for("cpu")
@memory_option
@overviews_option
def depressions(store, outlets, table, device, memory):
    """The depression hierarchy of the DEM (Barnes, Callaghan & Wickert 2020): the merge tree of the
    basins of every local minimum, and STORE/depressions/basin (uint32 leaf id, 0: drains out).

    Each plateau drains to its lowest lower neighbour; a local minimum is a leaf. Basins that meet
    merge, in order of their spill elevation (the minimax between them), into new nodes; roots spill
    out of the DEM at the fill level of their pits. Out of core: tiles, a boundary solve, tiles again.
    """
    from terrain_io.grid.depressions import depressions as run
    from terrain_io.grid.depressions import write_table

    result = run(store, outlets=outlets, device=device, memory=memory, progress=not quiet())
    if table is not None:
        write_table(result, store, table)
    say(result.summary() + (f"; table -> {table}" if table is not None else ""))
