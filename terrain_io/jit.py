"""How the numba kernels are compiled and cached: one home for the policy.

numba compiles a kernel on its first call and caches the machine code on disk (``cache=True``),
so only the first run pays (seconds per kernel: 0.5-10 s of CPU time per command; the demo's eight
steps ~25 s, shared by three processes on a cold cache: ``cli/demo.py``;
``benchmarks/bench_first_run.py``) and later processes load the code in milliseconds. These rules keep that first run short and the cache where the user can write:

- **Where the cache lives** (:func:`configure_cache`, called by the command line before numba is
  imported). numba writes next to the sources (``__pycache__``); when the package folder is not
  writable (an install into a read-only site-packages) it would fall back to ``~/.cache/numba``.
  We point ``NUMBA_CACHE_DIR`` at ``$XDG_CACHE_HOME/terrain-io/numba`` (default ``~/.cache``)
  instead, so the kernels of this tool lie in one known place. A ``NUMBA_CACHE_DIR`` the user set
  is kept.
- **Serial twins** (:func:`serial_twin`). A ``parallel=True`` kernel compiles several times slower
  than the same loop without threads, and on small data the thread pool's start-up outweighs the
  parallel loop: data below :data:`SERIAL_BELOW` cells runs a serial build, so a small job never
  compiles the parallel one. numba's cache key ignores ``parallel``, so the twin is cached under
  its own name (``NAME_serial``): two builds of one function under one name overwrite each other
  and either may load the other's code.
- **No parallel build of a loop over tiles** (:func:`in_threads`). Large data runs the serial
  builds of the tile kernels (which release the GIL) on chunks of tiles in a thread pool, a Python
  loop per chunk: a ``parallel=True`` loop over tiles links every tile kernel in again and compiled
  for 4-6 s each (the MST's tile phase, fill's batches), which a first run on a large DEM paid on top
  of the serial builds (``terrain mst`` at 2048^2: 25.5 s of compilation, 8.6 s now; ``fill`` 21.1 s,
  7.0 s now; benchmarks/RESULTS.md "First run: issue 27, session 15"). The same holds for a kernel of
  a whole loop of merges (``mst._cpu.merge_batch`` is Python calling the merge's kernels).
- **Cheap to compile.** numba links every callee into each caller and optimizes and codegens it
  again there, so a helper costs once per kernel that calls it. The kernels avoid numba's generic
  sorts (quick- and mergesort, seconds each: the radix sorts of ``grid/_radix_cpu`` instead), array
  slice copies (each compiles numba's shape-error message, string formatting included: loops
  instead), and large ``inline="always"`` helpers called at many sites (``_weights_cpu.walk_time`` is a call).
  For the same reason a large callee is called by the Python caller, in turn with the kernel that
  takes its result, rather than inside that kernel, where it would be compiled a second time
  (``depressions._cpu.tile_pieces`` and the steps of ``tile_labels``,
  ``sssp._incore_cpu.plateau_search``, the merge's sorts in ``mst._cpu.merge_blocks``), and the
  loop over a batch's tiles is Python calling each tile's kernel (microseconds a call) instead of a
  kernel that links them all in again (``mst._cpu.tile_phase_batch``, ``fill._cpu.graph_batch_serial``),
  in threads on large data (above): one build of each tile kernel. No fancy indexing (``a[idx]``,
  ``a[idx, 0]``) in a kernel: numba compiles its generic gathers for every dtype and index kind
  (~1 s for fill's lake join): loops, or the small tail done by numpy in the Python caller
  (``fill._cpu.join_lakes``).
- **Compile only what runs, once.** A kernel that holds several algorithms behind a runtime switch
  compiles all of them on its first call: the choice is made in Python, in front of one compiled
  entry point per variant (the SSSP queues: ``grid/sssp/_incore_cpu.solve_distances``), and a
  fallback that usual inputs never take is the Python caller's (the MST merge's radix argsort for
  more than 16 runs: ``mst._cpu._vertex_order``); a kernel of a few weight models computes only
  those (the MST's ``max`` and ``absdiff``, not every model of ``_weights_cpu.edge_weight``). Each
  argument reaches a kernel with one type (an empty array, not ``None``, for "no array"), and no
  kernel passes a callee a literal: a counter that starts as ``0`` (or a ``True``) is typed
  ``Literal[int](0)`` on the first pass of numba's type inference, and the callee is compiled for
  that signature and again for ``int64`` -- start it as ``np.int64(0)``.
- **Say it once** (:func:`announce_compiles`): the first compilation in a process prints one line,
  so a first run that is slow says why.
- **A first load without scipy.linalg** (:func:`defer_blas_check`, installed when the package is
  imported): loading even cached kernels makes numba import ``numba.np.arraymath``, which asks at
  import whether BLAS exists by importing all of scipy.linalg (0.12-0.2 s and ~30 MiB, a third of
  a 1024^2 SSSP's call). No kernel here calls BLAS.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Callable

# Below about four million cells the thread pool's start-up outweighs a parallel loop, and a small
# job should not pay the compilation of the parallel build: the serial twin runs.
SERIAL_BELOW = 1 << 22

APP_NAME = "terrain-io"  # the distribution's name (terrain_io.DISTRIBUTION), for the user's cache folder


def user_cache_dir(environ=os.environ) -> Path:
    """The user's cache folder for this tool: ``$XDG_CACHE_HOME/terrain-io`` (default ``~/.cache``;
    ``%LOCALAPPDATA%`` on Windows, ``~/Library/Caches`` on macOS)."""
    if sys.platform == "win32" and environ.get("LOCALAPPDATA"):
        base = Path(environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / APP_NAME


def _writable(folder: Path) -> bool:
    """numba's own test for its in-tree cache: the folder can be made and a file created in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def configure_cache(environ=os.environ, package_dir: Path | None = None) -> Path:
    """Choose where numba caches this package's kernels; returns the folder.

    Must run before numba is imported (numba reads ``NUMBA_CACHE_DIR`` once, at import). Keeps a
    ``NUMBA_CACHE_DIR`` that is set; else numba's default, ``__pycache__`` beside the sources, when
    it is writable; else sets ``NUMBA_CACHE_DIR`` to ``user_cache_dir()/numba``.
    """
    if environ.get("NUMBA_CACHE_DIR"):
        return Path(environ["NUMBA_CACHE_DIR"])
    package_dir = package_dir or Path(__file__).resolve().parent
    if _writable(package_dir / "__pycache__"):
        return package_dir / "__pycache__"
    folder = user_cache_dir(environ) / "numba"
    environ["NUMBA_CACHE_DIR"] = str(folder)
    return folder


def _marker(folder: Path, tag: str) -> Path:
    from . import __version__

    try:
        from importlib.metadata import version

        numba_version = version("numba")
    except Exception:  # noqa: BLE001 -- no metadata: one marker for any numba
        numba_version = "any"
    return folder / f"terrain-io-{__version__}-numba-{numba_version}-py{sys.version_info[0]}{sys.version_info[1]}.{tag}"


def compiled_before(folder: Path, tag: str) -> bool:
    """Whether the kernels of ``tag`` (e.g. ``demo``) were compiled into ``folder`` by this version of
    the package, numba and Python (a marker file; deleting the cache deletes it too)."""
    return _marker(Path(folder), tag).exists()


def mark_compiled(folder: Path, tag: str) -> None:
    """Leave :func:`compiled_before`'s marker (best effort: a read-only cache only loses the hint)."""
    try:
        _marker(Path(folder), tag).touch()
    except OSError:
        pass


def announce_compiles(say: Callable[[str], None], where: Path | str):
    """Call ``say`` once, with one line, when this process first compiles a kernel of ``terrain_io``.

    numba fires its ``numba:compile`` event only on a cache miss, so a warm run says nothing. The
    listener is registered when numba is imported (at once if it is): a command that runs no CPU
    kernel (the hydrology on the GPU) never imports numba. Returns the listener, or None until then."""

    def register():
        from numba.core import event

        class _Listener(event.Listener):
            said = False

            def on_start(self, ev):
                dispatcher = ev.data.get("dispatcher") if ev.data else None
                module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
                if not self.said and module.startswith("terrain_io"):
                    self.said = True
                    say(f"terrain: compiling kernels for first use (once: 1-10 s of CPU time per command; "
                        f"cached in {where})")

            def on_end(self, ev):
                pass

        listener = _Listener()
        event.register("numba:compile", listener)
        return listener  # for numba.core.event.unregister

    if "numba.core.event" in sys.modules:
        return register()
    _after_import("numba.core.event", register)
    return None


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs the first import of the module ``name`` as ``run(exec_module, module)``: the loader's own
    ``exec_module`` wrapped (once; the finder then leaves ``sys.meta_path``)."""

    def __init__(self, name: str, run: Callable):
        self.name, self.run = name, run

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once; and find the real spec without this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, run = spec.loader, self.run
        real_exec = loader.exec_module

        def exec_module(module):
            try:
                run(real_exec, module)
            finally:
                loader.exec_module = real_exec

        loader.exec_module = exec_module
        return spec


def _after_import(name: str, then: Callable[[], object]) -> None:
    """Call ``then()`` right after the module ``name`` is first imported."""

    def run(exec_module, module):
        exec_module(module)
        then()

    sys.meta_path.insert(0, _OnImport(name, run))


def in_threads(n: int, run: Callable[[int, int, int], object], threads: int | None = None) -> list:
    """``run(chunk, lo, hi)`` over ``threads`` (numba's thread count) contiguous chunks ``lo:hi`` of
    ``range(n)`` in a thread pool; their results in order. The parallel loop of a large job made of the serial builds
    of its kernels (which release the GIL) and a Python loop per chunk: numba's ``parallel=True``
    build of a loop over tiles compiles several times slower (its tile kernels linked in and
    optimized again; 4-6 s each for the MST's tile phase and fill's batches) and is what a first
    run on a large DEM paid; a chunk of tiles runs for milliseconds, so the pool costs nothing."""
    import concurrent.futures

    import numba

    threads = max(1, min(n, threads or numba.get_num_threads()))
    bounds = [(c, n * c // threads, n * (c + 1) // threads) for c in range(threads)]
    if threads == 1:
        return [run(*bounds[0])]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda b: run(*b), bounds))


def start_compiler() -> None:
    """Set up numba's typing and target contexts in this process now (~0.5 s of CPU, which a process
    otherwise pays on its first compilation): a process about to fork helpers that compile
    (``cli/demo.py``) pays it once for all of them."""
    import numba

    numba.njit(lambda x: x + 1)(1)  # (a lambda: never cached, so it always sets them up)


def njit_as(func, name: str, **options):
    """``numba.njit(cache=True, **options)`` of a copy of ``func`` named (and cached as) ``name``."""
    import numba

    copy = types.FunctionType(func.__code__, func.__globals__, name, func.__defaults__, func.__closure__)
    copy.__kwdefaults__ = func.__kwdefaults__
    copy.__qualname__ = name
    copy.__module__ = func.__module__
    copy.__doc__ = func.__doc__
    return numba.njit(cache=True, **options)(copy)


def serial_twin(kernel):
    """The same kernel compiled without threads (``prange`` runs as ``range``), cached as ``NAME_serial``."""
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("parallel", "nopython")}
    return njit_as(kernel.py_func, kernel.py_func.__qualname__ + "_serial", **options)


class _DeferBlasCheck(_OnImport):
    """Imports ``numba.np.arraymath`` with its BLAS check answered without importing scipy.linalg.

    arraymath binds ``ensure_blas`` from ``numba.np.linalg`` and calls it once, at import, only to set
    ``_HAVE_BLAS`` (whether ``np.dot`` of floats may use BLAS). While arraymath is executed, its
    binding is a check that scipy is installed (a dependency of this package), without importing it;
    ``numba.np.linalg`` keeps the real check, which every BLAS or LAPACK function still runs when it
    is compiled (scipy.linalg is imported then, and the LAPACK integer width checked)."""

    NAME = "numba.np.arraymath"

    def __init__(self):
        super().__init__(self.NAME, self._without_blas_check)

    @staticmethod
    def _without_blas_check(exec_module, module):
        import numba.np.linalg as linalg

        real_check = linalg.ensure_blas
        linalg.ensure_blas = _scipy_installed
        try:
            exec_module(module)
        finally:
            linalg.ensure_blas = real_check


def _scipy_installed():
    if importlib.util.find_spec("scipy") is None:
        raise ImportError("scipy 0.16+ is required for linear algebra")


def defer_blas_check():
    """Install :class:`_DeferBlasCheck` unless numba's arraymath is already imported (idempotent)."""
    if _DeferBlasCheck.NAME not in sys.modules and not any(isinstance(f, _DeferBlasCheck) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferBlasCheck())
