"""``terrain demo``: the main job end to end on the bundled sample DEM.

On a cold numba cache (no marker of this version's demo in the cache, :func:`terrain_io.jit.compiled_before`)
the demo shares its compilation with two forked helper processes (:class:`_Helpers`, :data:`LANES`; Linux);
``TERRAIN_DEMO_HELPERS=0`` runs every step in this process (``benchmarks/profile_compile.py demo``).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import click
import numpy as np

from terrain_io import interrupts, jit

from .common import Timer, output_option, say
from .main import cli

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "jacksboro_fault_dem.asc"
TILE, SHARD = 64, 4  # the demo store's tiling
STORE = "jacksboro.zarr"  # the demo's outputs in its folder: nothing else there is touched
FILES = ("elevation.png", "distance.png", "path.geojson", "depth.png", "depressions.png", "depressions.csv",
         "accumulation.png", "streams.png")
STREAM_CELLS = 200  # a cell is on a stream where this many cells (itself included) drain through it
MARK = ".terrain-demo.json"  # size and mtime of each file the demo wrote: which of FILES it may replace


@cli.command(short_help="Run the main job on the bundled sample DEM.")
@output_option("Folder for the demo's store and pictures (made if missing). In an existing folder only the "
               "demo's own earlier outputs are replaced; other files stay.",
               type=click.Path(file_okay=False, path_type=Path), dest="out", default=Path("terrain-demo"),
               show_default=True)
@click.pass_context
def demo(ctx, out):
    """Run the main job on the bundled sample DEM (Jacksboro fault, USGS) and say what was done."""
    if not SAMPLE.exists():
        raise click.ClickException(f"sample DEM missing: {SAMPLE}")
    _claim(out)
    try:
        _run(out)
    except BaseException:
        with contextlib.suppress(Exception):  # the files written so far stay the demo's; the first error counts
            _mark(out)
        raise
    _mark(out)


def _claim(out: Path) -> None:
    """Make ``out`` if missing, and refuse (one line, before any work) when one of the demo's outputs
    there was not written by the demo: a folder that is no terrain store, or a file another program
    wrote or changed since (its size and mtime differ from :data:`MARK`'s record)."""
    from terrain_io.errors import OutputError
    from terrain_io.store import is_terrain_store

    out.mkdir(parents=True, exist_ok=True)
    made = _made(out)
    refuse = "exists and was not written by 'terrain demo'; refusing to replace it (move it or choose another -o)"
    if os.path.lexists(out / STORE) and (os.path.islink(out / STORE) or not is_terrain_store(out / STORE)):
        raise OutputError(f"{out / STORE}: {refuse}")
    for name in FILES:
        if os.path.lexists(out / name) and made.get(name) != _stamp(out / name):
            raise OutputError(f"{out / name}: {refuse}")


def _stamp(path: Path) -> list[int] | None:
    """(size, mtime in ns) of a plain file, else None."""
    st = os.lstat(path)
    return [st.st_size, st.st_mtime_ns] if os.path.isfile(path) and not os.path.islink(path) else None


def _made(out: Path) -> dict:
    try:
        return dict(json.loads((out / MARK).read_text()).get("files", {}))
    except (OSError, ValueError, AttributeError):
        return {}


def _mark(out: Path) -> None:
    """Record the demo's files now in ``out`` (all of them the demo's: :func:`_claim` refused others)."""
    from terrain_io.atomic import atomic_file

    files = {name: _stamp(out / name) for name in FILES if os.path.lexists(out / name)}
    with atomic_file(out / MARK) as tmp:
        tmp.write_text(json.dumps({"files": files}))


def _run(out: Path) -> None:
    """The demo's steps, writing into ``out``."""
    from terrain_io.convert import convert
    from terrain_io.export import export
    from terrain_io.store import TerrainStore

    timer = Timer()
    cache = jit.configure_cache()
    store_path = out / STORE
    # First run: numba compiles the kernels (most of the time), one core per process. Two helper
    # processes (forks of this one, so without the imports again) share the work (LANES): one compiles
    # the shortest paths' kernels on a small DEM while this process converts, then runs steps 4-5 on
    # the sample; the other compiles fill's kernels meanwhile, then fills the sample's depressions,
    # routes the flow and draws the streams once the store is complete, while this one computes the
    # MST and compiles flow's and the streams' kernels (PARENT_WARM).
    helpers = _Helpers.start(out) if not jit.compiled_before(cache, "demo") else None
    if helpers is not None:
        interrupts.at_leave(helpers.stop)  # Ctrl-C or SIGTERM: the helpers end (and clean up) first
    try:
        summary = convert(SAMPLE, store_path, tile=TILE, shard=SHARD, overwrite=True)  # a store: _claim checked
        if helpers is not None:
            helpers.go(store_path)
        st = TerrainStore.open(store_path)
        say(f"1. convert  {SAMPLE.name} (Esri ASCII, {summary.source_bytes / 1e3:.0f} kB) -> {store_path}: "
            f"{st.shape[0]} x {st.shape[1]} cells in {st.tile_grid[0] * st.tile_grid[1]} tiles of "
            f"{st.tile_size}^2, z-ordered in shards of {st.shard_size}x{st.shard_size} tiles, "
            f"elevation {st.attrs['min']:.0f}..{st.attrs['max']:.0f} m ({summary.seconds:.2f} s)")
        export(store_path, "elevation", out / "elevation.png", overwrite=True)
        say(f"2. picture  {out / 'elevation.png'} (hillshaded elevation)")
        warmed = helpers is None
        for step in STEPS:
            if not warmed and _lane_of(step) is not None:  # this process's share while the helpers work
                for warm in PARENT_WARM:
                    warm()
                warmed = True
            line = helpers.line(step) if helpers is not None else None
            if line is None and helpers is not None and _lane_of(step) is not None:
                helpers.finish()  # a helper's step that did not come: the helpers compiled its kernels
            say(line if line is not None else STEPS[step](TerrainStore.open(store_path), out))
        if helpers is not None:
            helpers.finish()
    finally:
        if helpers is not None:
            interrupts.not_at_leave(helpers.stop)
            helpers.stop()
    jit.mark_compiled(cache, "demo")
    say(f"done in {timer.elapsed:.2f} s; inspect with: terrain info {store_path}")


class _Helpers:
    """The demo's two helper processes on a cold cache (forks of this process: Linux, where a
    helper can be told to end with its parent). Each runs its :data:`LANES` entry and sends each
    step's summary line on a pipe; a step whose line does not come (the helper failed) runs here.

    A helper's output goes to /dev/null; Ctrl-C is its parent's (it ignores SIGINT); it ends, its
    temporaries removed, on SIGTERM: from its parent when a signal ends the demo (which waits for it
    before its own one line and exit), or when its parent dies (``PR_SET_PDEATHSIG``), so a killed
    demo leaves no process compiling."""

    def __init__(self):
        self.procs: dict[str, tuple[int, object, int]] = {}  # lane -> (pid, its lines, its go pipe)
        self.lines: dict[str, str] = {}

    @classmethod
    def start(cls, out: Path) -> "_Helpers | None":
        if not sys.platform.startswith("linux") or os.environ.get("TERRAIN_DEMO_HELPERS") == "0":
            return None  # then every step runs here
        helpers = cls()
        jit.start_compiler()  # once here, not in each of the three processes
        sys.stdout.flush()
        sys.stderr.flush()
        for lane in LANES:
            lines_r, lines_w = os.pipe()
            go_r, go_w = os.pipe()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:  # the helper
                status = 1
                try:
                    for _, siblings, go in helpers.procs.values():  # its siblings' pipes are not its own
                        siblings.close()
                        os.close(go)
                    os.close(lines_r)
                    os.close(go_w)
                    _become_helper(parent)
                    status = _helper(lane, out, go_r, lines_w)
                finally:
                    os._exit(status)
            os.close(lines_w)
            os.close(go_r)
            helpers.procs[lane] = (pid, os.fdopen(lines_r, "r"), go_w)
        return helpers

    def go(self, store_path: Path) -> None:
        """Hand the helpers the complete store (its path, one line)."""
        for _, _, go in self.procs.values():
            with contextlib.suppress(OSError):  # a helper that is gone: its steps run here
                os.write(go, f"{store_path.resolve()}\n".encode())

    def line(self, step: str) -> str | None:
        """The summary line of ``step`` from the helper whose lane runs it (waiting for it), or None."""
        lane = _lane_of(step)
        if lane is None or lane not in self.procs:
            return None
        while step not in self.lines:
            text = self.procs[lane][1].readline()
            if not text:
                return None
            done, line = json.loads(text)
            self.lines[done] = line
        return self.lines[step]

    def finish(self) -> None:
        """Wait for both helpers (their kernels are then in the cache)."""
        for lane in list(self.procs):
            self._reap(lane)

    def stop(self) -> None:
        """End the helpers still running (this process failed or was signalled) and wait for them."""
        for pid, _, _ in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for lane in list(self.procs):
            self._reap(lane)

    def _reap(self, lane: str) -> None:
        pid, lines, go = self.procs.pop(lane)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        with contextlib.suppress(Exception):  # (a signal handler may close it while this thread reads it)
            lines.close()
        with contextlib.suppress(OSError):
            os.close(go)


def _become_helper(parent: int) -> None:
    """This forked process as a quiet helper that ends with its parent (see :class:`_Helpers`)."""
    import ctypes

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _helper_signal)
    signal.signal(signal.SIGALRM, _helper_signal)
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


_WARM: list[str] = []  # the helper's temporary folders


def _helper_signal(signum, frame) -> None:
    """SIGTERM in a helper: remove its temporaries and end, not in the middle of a numba cache write."""
    from terrain_io import interrupts

    if interrupts._in_numba_cache_write(frame):
        signal.setitimer(signal.ITIMER_REAL, 0.005)  # SIGALRM: look again
        return
    atomic = sys.modules.get("terrain_io.atomic")
    if atomic is not None:
        atomic.sweep_temporaries()
    for folder in _WARM:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(143)


def _helper(lane: str, out: Path, go: int, lines: int) -> int:
    """A helper's lane: warm its kernels on a small DEM, then run its steps on the store named on
    ``go`` and send each step's line; 0 when all ran."""
    from terrain_io.store import TerrainStore

    warm, steps = LANES[lane]
    for run in warm:
        run()
    with os.fdopen(go, "r") as f:
        store_path = f.readline().rstrip("\n")
    if not store_path:
        return 1  # the parent failed before the store was complete
    with os.fdopen(lines, "w") as f:
        for step in steps:
            f.write(json.dumps([step, STEPS[step](TerrainStore.open(store_path), out)]) + "\n")
            f.flush()
    return 0


def _warm_dem() -> np.ndarray:
    """A small DEM of the sample's type (float32, a few nodata cells) over 3 x 3 demo tiles."""
    values = np.random.default_rng(0).random((2 * TILE + 5, 2 * TILE + 7), dtype=np.float32)
    values[TILE - 1:TILE + 1, :3] = np.nan
    return values


def _on_warm_dem(run) -> None:
    """``run(store)`` on a temporary store of :func:`_warm_dem` in the demo's tiling: it compiles (or
    loads) every kernel signature the same step then runs on the sample."""
    import tempfile

    from terrain_io.store import TerrainStore

    tmp = tempfile.mkdtemp(prefix="terrain-demo-warm-")
    _WARM.append(tmp)
    try:
        run(TerrainStore.from_array(Path(tmp) / "warm.zarr", _warm_dem(), tile=TILE, shard=SHARD))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _WARM.remove(tmp)


def _warm_sssp() -> None:
    """Compile (or load) every kernel the demo's shortest paths and path run, on a small DEM."""
    from terrain_io.grid.sssp import sssp
    from terrain_io.grid.sssp.path import trace

    def run(st):
        x, y = (float(v) for v in st.cell_to_map(TILE, TILE))
        sssp(st, (x, y), weight="absdiff", name="warm", progress=False)
        trace(st, tuple(float(v) for v in st.cell_to_map(3, 5)), name="warm")

    _on_warm_dem(run)


def _warm_fill() -> None:
    """Compile (or load) every kernel the demo's fill runs, on a small DEM."""
    from terrain_io.grid.fill import fill

    _on_warm_dem(lambda st: fill(st, progress=False))


def _warm_flow() -> None:
    """Compile (or load) every kernel the demo's flow routing runs (routed on a small DEM itself: no
    fill, whose kernels the other helper compiles meanwhile)."""
    from terrain_io.grid.flow.pipeline import flow

    _on_warm_dem(lambda st: flow(st, condition="none", progress=False))


def _warm_streams() -> None:
    """Compile (or load) every kernel the demo's stream network runs, on a 3 x 4 grid of directions
    (two streams that join at an outlet): no store, no flow routing needed."""
    from terrain_io.grid.flow.codes import E, OUTLET, S
    from terrain_io.grid.hydro import _cpu

    code = np.full((3, 4), E, np.uint8)
    code[:, 3] = S
    code[2, 3] = OUTLET
    _cpu.stream_network(code, np.ones(code.shape, np.uint64), 1)  # the types of the real step: counts, cells


def _demo_mst(st, out: Path) -> str:
    """Step 3: the minimum spanning tree of the grid graph (weight max(h_i, h_j), the MST default)."""
    from terrain_io.grid.mst import mst

    res = mst(st, progress=False)
    return (f"3. mst      {res.edges:,} edges in {res.trees:,} tree(s), total weight {res.total_weight:.10g} m "
            f"[{res.weight}] ({res.seconds:.2f} s, {res.device}) -> {st.path / 'mst' / 'edges'}")


def _demo_sssp(st, out: Path) -> str:
    """Steps 4-5: shortest paths from the DEM's centre (cost |dh|, the SSSP default), a path to a corner."""
    from terrain_io.grid.sssp.path import trace, write_geojson
    from terrain_io.grid.sssp import sssp
    from terrain_io.export import export
    from terrain_io.units import crs_label, map_unit

    rows, cols = st.shape
    x, y = (float(v) for v in st.cell_to_map(rows // 2, cols // 2))
    res = sssp(st, (x, y), weight="absdiff", name="centre", progress=False)
    store_path = st.path
    export(store_path, "sssp/centre/distance", out / "distance.png", overwrite=True)
    tx, ty = (float(v) for v in st.cell_to_map(rows // 8, cols // 8))
    path = trace(st, (tx, ty), name="centre")
    write_geojson(st, path, out / "path.geojson")
    unit = f" {map_unit(st.crs)}, {crs_label(st.crs)}" if st.crs else ""
    return (f"4. sssp     from ({x:.5f}, {y:.5f}{unit}), cost |dh| summed: {res.reached:,} cells reached, farthest "
            f"{res.max_distance:.0f} m ({res.phases()}) -> {out / 'distance.png'}\n"
            f"5. path     to ({tx:.5f}, {ty:.5f}{unit}): {len(path.cells)} cells, {path.cost:.0f} m -> "
            f"{out / 'path.geojson'}")


def _demo_fill(st, out: Path) -> str:
    """Step 6: fill the depressions (Priority-Flood levels from the minimax structure), pictures."""
    from terrain_io.export import export
    from terrain_io.grid.fill import fill, write_table

    res = fill(st, progress=False)
    export(st.path, "fill/depth", out / "depth.png", overwrite=True)
    export(st.path, "fill/depression", out / "depressions.png", overwrite=True)
    write_table(res, st, out / "depressions.csv")
    return (f"6. fill     {res.depressions:,} depressions, {res.filled_cells:,} cells raised, volume "
            f"{res.volume:.4g} m^3 ({res.seconds:.2f} s, {res.device}) -> {out / 'depth.png'}, "
            f"{out / 'depressions.png'}, {out / 'depressions.csv'}")


def _demo_flow(st, out: Path) -> str:
    """Step 7: D8 flow directions on the filled DEM (flats routed) and flow accumulation, its picture."""
    from terrain_io.export import export
    from terrain_io.grid.flow.pipeline import flow

    res = flow(st, progress=False)
    export(st.path, "flow/accumulation", out / "accumulation.png", overwrite=True)
    return (f"7. flow     D8 directions on the filled DEM, {res.flat_cells:,} flat cells routed; largest accumulation "
            f"{int(res.max_accumulation):,} cells ({res.seconds:.2f} s, {res.device}) -> {out / 'accumulation.png'} "
            f"(log scale)")


def _demo_streams(st, out: Path) -> str:
    """Step 8: the stream network (cells draining at least :data:`STREAM_CELLS` cells), Strahler orders
    drawn over the hillshaded elevation."""
    from terrain_io.grid.hydro.pipeline import streams

    res = streams(st, STREAM_CELLS, progress=False)
    top = _streams_picture(st, out / "streams.png")
    return (f"8. streams  {res.attrs['links']:,} links where >= {STREAM_CELLS} cells drain, Strahler orders 1..{top} "
            f"-> {out / 'streams.png'} (over the hillshaded elevation)")


def _streams_picture(st, path: Path) -> int:
    """The stream cells in blues by Strahler order (darker: higher) over the grey hillshaded elevation,
    with a legend band (a swatch per order); returns the highest order."""
    from terrain_io.export import BLUES, colorize, hillshade, write_picture
    from terrain_io.legend import band_for
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(st.path, mode="r")
    z = np.asarray(st.elevation[...], dtype=np.float64)
    z[~st.valid(z)] = np.nan
    order = np.asarray(st.group["streams/order"][...], dtype=np.float64)
    dx, dy = st.metric_cell_size
    grey = 255.0 * (0.35 + 0.65 * np.nan_to_num(hillshade(z, dx, dy), nan=1.0))
    top = int(order.max(initial=0))
    span = (0.0, float(max(top, 1)))  # order 1 a light blue that shows on grey, the highest the darkest
    rgb = np.where((order > 0)[..., None], colorize(np.where(order > 0, order, np.nan), BLUES, span),
                   grey[..., None])
    title = f"streams (>= {STREAM_CELLS} cells drain) by Strahler order"
    band = band_for(rgb.shape[1], [title])
    band.text(title)
    band.swatches([(colorize(np.array([float(k)]), BLUES, span)[0], str(k)) for k in range(1, top + 1)])
    write_picture(rgb, np.isfinite(z), band.image(), path)
    return top


STEPS = {"mst": _demo_mst, "sssp": _demo_sssp, "fill": _demo_fill, "flow": _demo_flow, "streams": _demo_streams}
# The helpers' lanes on a cold cache: (warm-ups, run before the store is complete; the steps then run
# on it). Each of the three processes compiles about a third (CPU s, benchmarks/RESULTS.md "First run:
# issue 27, session 15"): one helper the shortest paths' kernels (~7) on a small DEM while this process
# converts (the ASCII parser, ~2), then runs steps 4-5 on the sample; the other fill's (~7), then fills
# the sample and routes it; this one the MST (in memory on a DEM this small: ~0.5), then flow's and the
# streams' kernels (PARENT_WARM, ~4), which the fill helper's flow and streams then find compiled.
LANES = {"sssp": ((_warm_sssp,), ("sssp",)), "fill": ((_warm_fill,), ("fill", "flow", "streams"))}
PARENT_WARM = (_warm_flow, _warm_streams)


def _lane_of(step: str) -> str | None:
    """The helper lane that runs ``step`` on a cold cache, or None (this process runs it)."""
    return next((name for name, (_, steps) in LANES.items() if step in steps), None)
