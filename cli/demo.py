"""``terrain demo``: the main job end to end on the bundled sample DEM."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import numpy as np

from terrain_io import jit

from .common import Timer, output_option, say
from .main import cli

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "jacksboro_fault_dem.asc"
TILE, SHARD = 64, 4  # the demo store's tiling
STORE = "jacksboro.zarr"  # the demo's outputs in its folder: nothing else there is touched
FILES = ("elevation.png", "distance.png", "path.geojson", "depth.png", "depressions.png", "depressions.csv")
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
    # First run: numba compiles the kernels (most of the time), one core per process. The MST's
    # kernels then compile in a second process, started now, and the fill's in a third, while this
    # one converts and then compiles and runs the shortest paths.
    first = not jit.compiled_before(cache, "demo")
    beside = _start_child("_mst_beside") if first else None
    fill_warming = _start_child("_warm_fill") if first else None
    try:
        store_path = out / STORE
        summary = convert(SAMPLE, store_path, tile=TILE, shard=SHARD, overwrite=True)  # a store: _claim checked
        if beside is not None:
            _go(beside, store_path)
        st = TerrainStore.open(store_path)
        say(f"1. convert  {SAMPLE.name} (Esri ASCII, {summary.source_bytes / 1e3:.0f} kB) -> {store_path}: "
                   f"{st.shape[0]} x {st.shape[1]} cells in {st.tile_grid[0] * st.tile_grid[1]} tiles of "
                   f"{st.tile_size}^2, z-ordered in shards of {st.shard_size}x{st.shard_size} tiles, "
                   f"elevation {st.attrs['min']:.0f}..{st.attrs['max']:.0f} m ({summary.seconds:.2f} s)")
        export(store_path, "elevation", out / "elevation.png", overwrite=True)
        say(f"2. picture  {out / 'elevation.png'} (hillshaded elevation)")
        lines = _demo_sssp(st, store_path, out)
        say(_demo_mst(st, beside))
    finally:
        if beside is not None and beside.poll() is None:
            beside.kill()  # this process failed: no MST beside it
            beside.wait()
    say("\n".join(lines))
    if fill_warming is not None:
        fill_warming.wait()  # its kernels are in the cache now (or, if it failed, compiled here)
    _demo_fill(st, store_path, out)
    jit.mark_compiled(cache, "demo")
    say(f"done in {timer.elapsed:.2f} s; inspect with: terrain info {store_path}")


def _start_child(function: str) -> subprocess.Popen | None:
    """``function`` of this module in a child process (the same interpreter, package and cache)."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        return subprocess.Popen([sys.executable, "-c", f"import sys, cli.demo; sys.exit(cli.demo.{function}())"],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None  # then the work runs here


def _go(beside: subprocess.Popen, store_path: Path) -> None:
    """Hand the child the complete store (one line on its stdin)."""
    try:
        beside.stdin.write(f"{store_path.resolve()}\n".encode())
        beside.stdin.close()
    except OSError:
        pass  # the child is gone: its exit status says so, and the MST runs here


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

    with tempfile.TemporaryDirectory() as tmp:
        run(TerrainStore.from_array(Path(tmp) / "warm.zarr", _warm_dem(), tile=TILE, shard=SHARD))


def _warm_mst() -> None:
    """Compile (or load) every kernel the demo's MST runs."""
    from terrain_io.grid.mst import mst

    _on_warm_dem(lambda st: mst(st, progress=False))


def _warm_fill() -> int:
    """The demo's third process on a cold cache: compile the fill's kernels."""
    jit.configure_cache()  # before numba is imported
    from terrain_io.grid.fill import fill

    _on_warm_dem(lambda st: fill(st, progress=False))
    return 0


def _mst_beside() -> int:
    """The demo's second process on a cold cache: compile the MST's kernels (:func:`_warm_mst`) while
    the first process converts the sample, then compute the MST of the store named on stdin (once it
    is complete). Exit status 1 when stdin ends without a store (the first process failed)."""
    jit.configure_cache()  # before numba is imported (the parent's choice: its environment, the same package)
    _warm_mst()
    store_path = sys.stdin.readline().rstrip("\n")
    if not store_path:
        return 1
    from terrain_io.grid.mst import mst
    from terrain_io.store import TerrainStore

    mst(TerrainStore.open(store_path), progress=False)
    return 0


def _demo_mst(st, beside: subprocess.Popen | None) -> str:
    """Step 3: the minimum spanning tree of the grid graph (weight max(h_i, h_j), the MST default): run
    here, or read from the store when the child process ``beside`` computed it."""
    from terrain_io.grid.mst import mst
    from terrain_io.store import TerrainStore

    if beside is not None and beside.wait() == 0:
        a = TerrainStore.open(st.path, mode="r").results()["mst"]
        edges, trees, total, weight, seconds, device = (a["edge_count"], a["trees"], a["total_weight"],
                                                        a["weight_model"], a["seconds"], a["device"])
    else:
        res = mst(st, progress=False)
        edges, trees, total, weight, seconds, device = (res.edges, res.trees, res.total_weight, res.weight,
                                                        res.seconds, res.device)
    return (f"3. mst      {edges:,} edges in {trees:,} tree(s), total weight {total:.10g} m "
            f"[{weight}] ({seconds:.2f} s, {device}) -> {st.path / 'mst' / 'edges'}")


def _demo_sssp(st, store_path: Path, out: Path) -> list[str]:
    """Steps 4-5: shortest paths from the DEM's centre (cost |dh|, the SSSP default), a path to a corner."""
    from terrain_io.grid.sssp.path import trace, write_geojson
    from terrain_io.grid.sssp import sssp
    from terrain_io.export import export
    from terrain_io.units import crs_label, map_unit

    rows, cols = st.shape
    x, y = (float(v) for v in st.cell_to_map(rows // 2, cols // 2))
    res = sssp(st, (x, y), weight="absdiff", name="centre", progress=False)
    export(store_path, "sssp/centre/distance", out / "distance.png", overwrite=True)
    tx, ty = (float(v) for v in st.cell_to_map(rows // 8, cols // 8))
    path = trace(st, (tx, ty), name="centre")
    write_geojson(st, path, out / "path.geojson")
    unit = f" {map_unit(st.crs)}, {crs_label(st.crs)}" if st.crs else ""
    return [f"4. sssp     from ({x:.5f}, {y:.5f}{unit}), cost |dh| summed: {res.reached:,} cells reached, farthest "
            f"{res.max_distance:.0f} m ({res.phases()}) -> {out / 'distance.png'}",
            f"5. path     to ({tx:.5f}, {ty:.5f}{unit}): {len(path.cells)} cells, {path.cost:.0f} m -> "
            f"{out / 'path.geojson'}"]


def _demo_fill(st, store_path: Path, out: Path) -> None:
    """Step 6: fill the depressions (Priority-Flood levels from the minimax structure), pictures."""
    from terrain_io.export import export
    from terrain_io.grid.fill import fill, write_table

    res = fill(st, progress=False)
    export(store_path, "fill/depth", out / "depth.png", overwrite=True)
    export(store_path, "fill/depression", out / "depressions.png", overwrite=True)
    write_table(res, st, out / "depressions.csv")
    say(f"6. fill     {res.depressions:,} depressions, {res.filled_cells:,} cells raised, volume "
               f"{res.volume:.4g} m^3 ({res.seconds:.2f} s, {res.device}) -> {out / 'depth.png'}, "
               f"{out / 'depressions.png'}, {out / 'depressions.csv'}")
