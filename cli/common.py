"""Options and helpers shared by the ``terrain`` commands."""
from __future__ import annotations

import time

import click

from terrain_io.backend import DEVICES

device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True,
    help="Compute device: the GPU (CuPy) when usable, else the CPU (numba).")


scheduler_option = click.option(
    "--scheduler", default="local", show_default=True, metavar="local|threads|processes|ADDRESS",
    help="Where shard tasks run: this process, Dask threads or processes, or a dask.distributed scheduler "
         "address (tcp://host:8786).")


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
