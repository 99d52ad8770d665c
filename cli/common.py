"""Options and helpers shared by the ``terrain`` commands."""
from __future__ import annotations

import time
from pathlib import Path

import click

from terrain_io.backend import DEVICES

device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True,
    help="Compute device: the GPU (CuPy) when usable, else the CPU (numba).")


scheduler_option = click.option(
    "--scheduler", default="local", show_default=True, metavar="local|threads|processes|ADDRESS",
    help="Where shard tasks run: this process, Dask threads or processes, or a dask.distributed scheduler "
         "address (tcp://host:8786).")


overwrite_option = click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")


outlets_option = click.option(
    "--outlets", type=click.Choice(["edge+nodata", "edge"]), default="edge+nodata", show_default=True,
    help="Where water leaves the DEM: its edge and cells next to nodata, or only its edge (nodata cells are "
         "then walls).")


def _folder_exists(ctx, param, path):
    if path is not None and not path.parent.exists():
        raise click.BadParameter(f"folder {path.parent} does not exist")
    return path


def table_option(what: str):
    """``--table FILE.csv``: where to write ``what``; its folder must exist."""
    return click.option("--table", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        callback=_folder_exists, help=f"Write {what} to this CSV file.")


def quiet(ctx: click.Context | None = None) -> bool:
    """True when ``terrain -q`` was given (no progress bars, no summary)."""
    ctx = ctx or click.get_current_context()
    return bool((ctx.find_root().obj or {}).get("quiet"))


def say(message: str) -> None:
    """Print a summary line unless ``-q``."""
    if not quiet():
        click.echo(message)


class Timer:
    """Wall-clock seconds since creation (``Timer().elapsed``)."""

    def __init__(self):
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
