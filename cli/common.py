"""Options and helpers shared by the ``terrain`` commands."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import click

from terrain_io.backend import DEVICES


class AliasedOption(click.Option):
    """A click option whose ``hidden_aliases`` (old spellings kept for users' scripts) are accepted but
    left out of ``--help``."""

    def __init__(self, *args, hidden_aliases: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.hidden_aliases = frozenset(hidden_aliases)

    def _shown(self, method, ctx):
        every = self.opts
        self.opts = [o for o in every if o not in self.hidden_aliases]
        try:
            return method(ctx)
        finally:
            self.opts = every

    def get_help_record(self, ctx):
        return self._shown(super().get_help_record, ctx)

    def get_error_hint(self, ctx):  # "Missing option '-o' / '--output'"
        return self._shown(super().get_error_hint, ctx)


def device_option_for(*supported: str):
    """``--device`` offering only the devices the command has kernels for (``auto``: the best of them).

    ``device_option_for("cpu")`` for a CPU-only command; :data:`device_option` for CPU and GPU."""
    choices = ("auto", *supported)
    unknown = set(choices) - set(DEVICES)
    assert not unknown, unknown
    help = ("Compute device: the GPU (CuPy) when usable, else the CPU (numba)." if "gpu" in supported
            else "Compute device: the CPU (numba); this command has no GPU kernels yet.")
    return click.option("--device", type=click.Choice(choices), default="auto", show_default=True, help=help)


device_option = device_option_for("cpu", "gpu")


class MemorySize(click.ParamType):
    """A size such as ``2GB``, ``512M``, ``1.5GiB`` (terrain_io.memory.parse_size), checked before any
    work; the value stays the text given (the library functions take it as it is)."""

    name = "size"

    def convert(self, value, param, ctx):
        from terrain_io.errors import TerrainError
        from terrain_io.memory import parse_size

        try:
            parse_size(value)
        except TerrainError as exc:
            self.fail(str(exc), param, ctx)
        return value


memory_option = click.option(
    "--memory", type=MemorySize(), default=None, metavar="SIZE",
    help="Memory budget, e.g. 2GB [default: half the free RAM].")


def output_option(help: str, *, type=click.Path(dir_okay=False, path_type=Path), dest: str = "output", **kwargs):
    """``-o/--output PATH``, the one spelling of every command's output (``--out``, the older one of some
    commands, still accepted). Output files pair it with ``callback=new_output_file`` and
    :data:`overwrite_files_option`; ``dest`` names the command's parameter."""
    return click.option("-o", "--output", "--out", dest, cls=AliasedOption, hidden_aliases=("--out",), type=type,
                        help=help, **kwargs)


def _close_clusters_after(ctx, param, value):
    """A ``local-cuda`` cluster, and the client of a cluster, live for the command: closed when its
    context ends (error or not)."""
    if value == "local-cuda" or "://" in (value or ""):
        from terrain_io.parallel import close_clusters

        ctx.call_on_close(close_clusters)
    return value


scheduler_option = click.option(
    "--scheduler", default="local", show_default=True, metavar="local|threads|processes|local-cuda|ADDRESS",
    callback=_close_clusters_after,
    help="Where shard tasks run: this process, Dask threads or processes, local-cuda (a Dask worker per GPU "
         "of this host, started for the command) or a dask.distributed scheduler address (tcp://host:8786).")


def _remember_overwrite(ctx, param, value):
    ctx.meta["overwrite"] = value  # eager: the output options' checks (new_output_file) see it
    return value


# The rule of every output: one that exists is replaced only with --overwrite (terrain_io.atomic.refuse_existing).
overwrite_option = click.option("--overwrite", is_flag=True, is_eager=True, callback=_remember_overwrite,
                                help="Replace the output if it exists.")
overwrite_files_option = click.option("--overwrite", is_flag=True, is_eager=True, expose_value=False,
                                      callback=_remember_overwrite, help="Replace the output file if it exists.")


outlets_option = click.option(
    "--outlets", type=click.Choice(["edge+nodata", "edge"]), default="edge+nodata", show_default=True,
    help="Where water leaves the DEM: its edge and cells next to nodata, or only its edge (nodata cells are "
         "then walls).")


def new_output_file(ctx, param, path):
    """Callback of an output file's option (with :data:`overwrite_files_option` on the command): its
    folder must exist, and a file there is replaced only with --overwrite -- checked before any work."""
    from terrain_io.atomic import refuse_existing

    if path is not None:
        path = Path(path)
        if not path.parent.exists():
            raise click.BadParameter(f"folder {path.parent} does not exist")
        refuse_existing(path, ctx.meta.get("overwrite", False))
    return path


def table_option(what: str):
    """``--table FILE.csv``: where to write ``what``; its folder must exist (and :data:`overwrite_files_option`)."""
    return click.option("--table", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        callback=new_output_file, help=f"Write {what} to this CSV file.")


def overviews_option(command):
    """``--overviews`` on a command that writes results (its STORE argument, its ``--memory`` and
    ``--scheduler`` where it has them): once the command has committed them, each array it wrote --
    new, or rewritten: its manifest changed -- gets its pyramid (terrain_io.overviews, as
    ``terrain overviews STORE ARRAY...``)."""

    @functools.wraps(command)
    def run(*args, overviews: bool, **kwargs):
        if not overviews:
            return command(*args, **kwargs)
        from terrain_io.errors import TerrainError
        from terrain_io.overviews import array_digests

        store = kwargs["store"]
        try:
            before = array_digests(store)
        except TerrainError:  # no store: the command says so
            before = {}
        out = command(*args, **kwargs)
        written = [name for name, digest in array_digests(store).items() if before.get(name) != digest]
        if written:
            write_overviews_of(store, written, kwargs.get("memory"), kwargs.get("scheduler") or "local")
        return out

    return click.option("--overviews", is_flag=True,
                        help="Then write the overviews of the arrays it wrote (as 'terrain overviews').")(run)


def write_overviews_of(store, arrays, memory, scheduler) -> None:
    """``terrain overviews STORE ARRAYS``: the pyramids, and the summary line."""
    from terrain_io.overviews import write_overviews

    timer = Timer()
    done = write_overviews(store, arrays, memory=memory, scheduler=scheduler, progress=not quiet(), announce=say)
    listed = ", ".join(f"{name} ({levels} levels)" for name, levels in done.items())
    say(f"{store}: overviews of {listed} in {timer.elapsed:.2f} s")


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
