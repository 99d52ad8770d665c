"""``terrain``: the command-line entry point. Subcommands live in their own modules of ``cli``."""
from __future__ import annotations

# The command's first instruction: SIGINT and SIGTERM wait (blocked) until terrain_io.interrupts
# handles them, so that a Ctrl-C during the imports below is one line and exit 130, not a traceback.
# (_signal, the C module, is loaded with the interpreter; signal.py takes milliseconds: enum.)
import _signal

_MASK = _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))

import signal  # noqa: E402
import sys  # noqa: E402

from terrain_io import interrupts  # noqa: E402 -- light: the standard library only


def _is_program() -> bool:
    """Whether this process is the ``terrain`` command (its console script or ``python -m cli``),
    not a program importing the command line (tests), whose own Ctrl-C is left alone."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name == "cli.__main__"
    return (getattr(main, "__file__", None) or "").rsplit("/", 1)[-1].startswith("terrain")


if _is_program():
    interrupts.install()
else:
    signal.pthread_sigmask(signal.SIG_SETMASK, _MASK)

import gc  # noqa: E402

import click  # noqa: E402

from terrain_io import DISTRIBUTION, __version__  # noqa: E402
from terrain_io.errors import TerrainError  # noqa: E402


class UsageError(click.UsageError):
    """A usage error shown as ``terrain: error: MESSAGE`` and a hint to the command's help; exit 2."""

    def show(self, file=None):
        click.echo(f"terrain: error: {self.format_message()}", err=True)
        if self.ctx is not None:
            click.echo(f"Try '{self.ctx.command_path} -h' for help.", err=True)


class CommandError(click.ClickException):
    """Any other click error (exit 1) as one line ``terrain: error: MESSAGE``."""

    def show(self, file=None):
        click.echo(f"terrain: error: {self.format_message()}", err=True)


def _one_line(exc: click.ClickException) -> click.ClickException:
    """click's error in the command's format: UsageError (exit 2) or CommandError (its exit code).
    NoArgsIsHelpError (a group without its subcommand) keeps click's help text."""
    if type(exc).__name__ == "NoArgsIsHelpError" or isinstance(exc, (UsageError, CommandError)):
        return exc
    if isinstance(exc, click.UsageError):
        out = UsageError(exc.format_message(), exc.ctx)
    else:
        out = CommandError(exc.format_message())
    out.exit_code = exc.exit_code
    return out


def _late_flag(name: str, *decls: str, help: str) -> click.Option:
    """``-q`` / ``--debug`` given after the subcommand: the same switch as before it (in the root's ``obj``)."""

    def set_root(ctx, param, value):
        if value:
            root = ctx.find_root()
            root.obj = root.obj if root.obj is not None else {}
            root.obj[name] = True

    return click.Option(list(decls), is_flag=True, expose_value=False, callback=set_root, help=help)


QUIET_HELP = "No progress bars or summary lines."
DEBUG_HELP = "Show full tracebacks on errors."


class TerrainGroup(click.Group):
    """A click group that turns user errors into one line on stderr and a non-zero exit code.

    Usage errors (unknown options, missing or invalid arguments) print ``terrain: error: ...`` and a
    hint line ``Try 'terrain CMD -h' for help.`` and exit 2; TerrainError, OS errors (missing files,
    full disk, permissions) and other click errors print ``terrain: error: ...`` and exit 1; Ctrl-C
    prints ``terrain: interrupted`` and exits 130. ``--debug`` shows tracebacks. Every subcommand
    also takes ``-q`` and ``--debug`` after its name.
    """

    group_class = type  # subgroups (terrain graph) are TerrainGroups too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        have = {o for p in cmd.params for o in getattr(p, "opts", ())}
        if "--quiet" not in have:
            cmd.params.append(_late_flag("quiet", "-q", "--quiet", help=QUIET_HELP))
        if "--debug" not in have:
            cmd.params.append(_late_flag("debug", "--debug", help=DEBUG_HELP))
        super().add_command(cmd, name)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:  # the group's own options
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # a subcommand's options, or raised by a command
            raise _one_line(exc) from None
        except (TerrainError, OSError, MemoryError) as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            msg = str(exc) or type(exc).__name__
            if isinstance(exc, MemoryError):
                msg = "out of memory: " + msg + " (lower --memory or the tile size)"
            click.echo(f"terrain: error: {msg}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            _exit_interrupted(exc)
        except (click.exceptions.Exit, click.exceptions.Abort):  # (a command's own exit: not an error)
            raise
        except Exception as exc:  # noqa: BLE001 -- a bug of ours: one line still, the traceback under --debug
            if (ctx.obj or {}).get("debug"):
                raise
            short = _out_of_resources(exc)
            if short is not None:
                click.echo(f"terrain: error: {short}", err=True)
            else:
                click.echo(f"terrain: internal error: {type(exc).__name__}: {exc} (a bug: run the command again "
                           "with --debug for the traceback, and report it)", err=True)
            ctx.exit(1)


def _out_of_resources(exc: Exception) -> str | None:
    """The user's line for an exception that is the machine's limit, not a bug (None: a bug): the GPU's
    memory taken (CuPy's OutOfMemoryError, no MemoryError: another process may hold the GPU), or a
    worker process killed (the kernel's out-of-memory killer: the pool is broken)."""
    from concurrent.futures.process import BrokenProcessPool

    cupy = sys.modules.get("cupy")  # (not imported here: only a command that ran on the GPU raises it)
    gpu_oom = getattr(getattr(getattr(cupy, "cuda", None), "memory", None), "OutOfMemoryError", None)
    if gpu_oom is not None and isinstance(exc, gpu_oom):
        return f"out of GPU memory: {exc} (free the GPU or use --device cpu)"
    if isinstance(exc, BrokenProcessPool):
        return f"a worker process died ({exc}): out of memory? (lower --memory or the tile size)"
    return None


@click.group(cls=TerrainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name=DISTRIBUTION, message="%(prog)s %(version)s")
@click.option("-q", "--quiet", is_flag=True, help=QUIET_HELP)
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.pass_context
def cli(ctx: click.Context, quiet: bool, debug: bool):
    """Out-of-core terrain processing: DEM stores, minimum spanning trees, shortest paths, filling."""
    ctx.obj = {"quiet": quiet, "debug": debug}
    cache = _state.pop("announce_cache", None)  # set by main(): the terrain command, not a library caller
    if cache is not None and not quiet and ctx.invoked_subcommand not in _NO_KERNELS:
        from terrain_io import jit

        obj = ctx.obj  # (read when a kernel compiles: a -q after the subcommand is parsed later)
        jit.announce_compiles(lambda line: None if obj.get("quiet") else click.echo(line, err=True), cache)


_state: dict = {}
_NO_KERNELS = {None, "info", "verify"}  # commands that compile no numba kernel


def _register() -> None:
    """Attach the subcommands (each module adds its own commands to ``cli``)."""
    from . import demo, graph, store  # noqa: F401
    from . import mst  # noqa: F401
    from . import sssp  # noqa: F401
    from . import fill  # noqa: F401
    from . import depressions  # noqa: F401
    from . import flow  # noqa: F401
    from . import hydro  # noqa: F401
    from . import view  # noqa: F401


def _exit_interrupted(exc: KeyboardInterrupt):
    """A KeyboardInterrupt where the signal handlers are not installed (``cli`` called in-process):
    the same end as the handlers' (terrain_io.interrupts): one line, exit 130, no temporaries."""
    interrupts.leave(signal.SIGINT)


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=None):
    """Notes (a format-1 store without checksums, skipped points) as one line; other warnings as Python shows them."""
    from terrain_io.errors import TerrainNote

    if issubclass(category, TerrainNote):
        click.echo(f"terrain: note: {message}", err=True)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> None:
    import functools
    import warnings

    if not getattr(warnings.showwarning, "_terrain", False):
        warnings.showwarning = functools.partial(_show_warning, _default=warnings.showwarning)
        warnings.showwarning._terrain = True
    # A file-size limit (RLIMIT_FSIZE) then makes writes fail with EFBIG -- reported as one line and
    # cleaned up -- instead of killing the process with SIGXFSZ and leaving temporaries behind.
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGXFSZ, *interrupts.EXITS)}
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    interrupts.install()  # again, for a caller of main() that imported this module first
    from terrain_io import jit

    cache = jit.configure_cache()  # before numba is imported
    if _is_program():
        from terrain_io import vectors

        vectors.lean_imports = True
    try:
        _register()
        _state["announce_cache"] = cache
        cli.main(args=argv, prog_name="terrain")
    except KeyboardInterrupt as exc:  # arrived before a command started (while importing)
        _exit_interrupted(exc)
    finally:
        if _is_program():
            # The command is over. The interpreter's shutdown restores the default handlers (a signal
            # then kills the process, no line), but keeps SIG_IGN: from here the exit status is the
            # command's. (Ignored, not blocked: blocking holds only this thread, and zarr's and numba's
            # threads live on.)
            for signum in interrupts.EXITS:
                signal.signal(signum, signal.SIG_IGN)
            # The process ends here: spare its objects (numba's registries: ~100k) the cyclic
            # collections of the interpreter's shutdown, most of its exit time with numba loaded
            # (references still count down; benchmarks/RESULTS.md, "2-core VM, first source in a fresh
            # process: start-up and solve").
            gc.freeze()
        else:  # a program that called main() gets its own handlers back
            for signum, handler in before.items():
                signal.signal(signum, handler)

