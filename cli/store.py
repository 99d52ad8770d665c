"""Store commands: ``terrain convert``, ``info``, ``verify``, ``synth``, ``export``."""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import click

from terrain_io.errors import TerrainNote
from terrain_io.memory import format_bytes
from terrain_io.tiling import DEFAULT_SHARD, DEFAULT_TILE
from terrain_io.units import cli_weight, coordinate, crs_label, distance_unit, map_unit, number

from .common import Timer, output_option, overwrite_option, quiet, say, scheduler_option
from .main import cli

tile_option = click.option("--tile", type=int, default=DEFAULT_TILE, show_default=True,
                           help="Tile (chunk) side in cells, a power of two.")
shard_option = click.option("--shard", type=int, default=DEFAULT_SHARD, show_default=True,
                            help="Shard side in tiles, a power of two (tiles of a shard lie in z-order on disk).")


@cli.command(short_help="Convert an ASCII grid or GDAL raster into a store.")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@output_option("Output store [default: SRC with .zarr].", type=click.Path(path_type=Path), dest="out")
@tile_option
@shard_option
@click.option("--dtype", default="auto", show_default=True,
              help="Store dtype: auto (float32; integer rasters keep their type), float32, float64, int16, int32.")
@click.option("--crs", default=None, metavar="CRS",
              help="The DEM's CRS (EPSG:32617, WKT, a PROJ string, ...), overriding the file's own or the .prj "
                   "beside an ASCII grid [default: those].")
@scheduler_option
@overwrite_option
def convert(src, out, tile, shard, dtype, crs, scheduler, overwrite):
    """Convert an Esri/GRASS ASCII grid or any GDAL raster (GeoTIFF, ...) into a z-order tiled store.

    An ASCII grid takes its CRS from the .prj file beside it (as GDAL does), or from --crs.
    """
    from terrain_io.convert import convert as run
    from terrain_io.store import TerrainStore

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        summary = run(src, out, tile=tile, shard=shard, dtype=dtype, overwrite=overwrite, progress=not quiet(),
                      scheduler=scheduler, announce=say, crs=crs)
    for w in caught:
        if issubclass(w.category, TerrainNote):
            click.echo(f"terrain: note: {w.message}", err=True)
        elif issubclass(w.category, UserWarning) and "nodata" in str(w.message):
            click.echo(f"terrain: warning: {w.message}", err=True)
    cells = summary.rows * summary.cols
    crs = TerrainStore.open(summary.path, mode="r").crs
    say(f"{summary.path}: {summary.rows} x {summary.cols} = {cells:,} cells ({summary.valid:,} valid), "
        f"CRS {crs_label(crs)}; {summary.seconds:.2f} s, {summary.mb_per_s:.1f} MB/s")


@cli.command(short_help="Describe a store and the results it holds.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the store's attributes and results as JSON.")
def info(store, as_json):
    """Describe a store: shape, CRS, cell size, tiles, values, nodata, and the results it holds."""
    from terrain_io.integrity import check_manifests
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(store, mode="r")
    results = {name: _as_cli_names(attrs) for name, attrs in st.results().items()}
    problems = check_manifests(st.path)  # sizes only: `terrain verify` reads the chunks
    if as_json:
        click.echo(json.dumps(strict_json({"shape": st.shape, "dtype": str(st.dtype), "attrs": st.attrs,
                                           "results": results, "format_version": st.format_version,
                                           "damage": [p.line() for p in problems]}), indent=2, allow_nan=False))
        _report_damage(store, problems)
        return
    rows, cols = st.shape
    a = st.attrs
    valid = a.get("valid_count")
    unit = map_unit(st.crs, st.transform)
    (dx, dy), (mx, my) = st.cell_size, st.metric_cell_size
    metres = f" ({mx:.4g} x {my:.4g} m at the mid latitude)" if unit == "deg" else ""
    lo, hi = (a.get(k) for k in ("min", "max"))
    values = f"{number(lo, st.dtype)} .. {number(hi, st.dtype)} m" if lo is not None and hi is not None else "unknown"
    lines = [
        f"store:      {st.path}",
        f"shape:      {rows} rows x {cols} cols = {rows * cols:,} cells, {st.dtype}",
        f"crs:        {crs_label(st.crs, projection=True)}",
        f"cell size:  {coordinate(dx)} x {coordinate(dy)} {unit}{metres}" + ("" if st.transform else " (no transform)"),
        f"origin:     x={coordinate(st.transform[0])} y={coordinate(st.transform[3])} {unit} (upper-left corner)"
        if st.transform else "origin:     -",
        f"tiles:      {st.tile_size} x {st.tile_size} cells, {st.tile_grid[0]} x {st.tile_grid[1]} tiles; "
        f"shards of {st.shard_size} x {st.shard_size} tiles ({st.shard_grid[0]} x {st.shard_grid[1]})",
        f"values:     {values}",
        f"nodata:     {st.nodata if st.nodata is not None else 'NaN'}; "
        + (f"{1 - valid / (rows * cols):.2%} of cells" if valid is not None else "share unknown"),
        f"source:     {a.get('source')} ({a.get('source_format')})",
        f"on disk:    {format_bytes(_disk_size(st.path))}",
        "integrity:  " + ("no checksums (format_version 1)" if st.format_version < 2 else
                          "shard files match their manifests" if not problems else
                          f"DAMAGED ({len(problems)} problem(s))") + "; `terrain verify` reads every chunk",
    ]
    if results:
        lines.append("results:    (terrain info --json for every attribute)")
        for name, attrs in results.items():
            shown = {k: v for k, v in attrs.items() if k not in _QUIET_ATTRS}
            lines.append(f"  {name}: " + ", ".join(
                f"{k}={number(v, 'float32') if k == 'max_distance' else _short(v)}{_attr_unit(k, v, attrs)}"
                for k, v in shown.items()))
    else:
        lines.append("results:    none")
    click.echo("\n".join(lines))
    _report_damage(store, problems)


def _as_cli_names(attrs: dict) -> dict:
    """A result's attributes with the weight model named as the CLI does (``walk``, not the stored
    ``walk_friction`` that the path and index code read)."""
    return {**attrs, "weight": cli_weight(attrs["weight"])} if isinstance(attrs.get("weight"), str) else attrs


def _report_damage(store, problems) -> None:
    """One error line per damaged, missing or unexpected shard file, then exit 1."""
    if problems:
        for p in problems:
            click.echo(f"terrain: error: {store}: {p.line()}", err=True)
        click.get_current_context().exit(1)


# documentation strings, CF plumbing and timings: in --json, not in the summary
_QUIET_ATTRS = {"shape", "grid_mapping", "coordinates", "timings", "edges_encoding", "unreached",
                "predecessor_codes", "total_weight_exact"}


def _short(v) -> str:
    if isinstance(v, float):
        return coordinate(v)
    text = json.dumps(_rounded(v), default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _rounded(v):
    """Floats of lists and dicts to 10 significant digits, for a summary (source_xy and the like)."""
    if isinstance(v, float):
        return float(coordinate(v)) if math.isfinite(v) else v
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def _attr_unit(key: str, value, attrs: dict) -> str:
    """The unit of a result attribute printed by ``info`` (README, "Units")."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    if key in ("seconds",):
        return " s"
    if key == "volume":
        return " m^3"
    if key == "total_weight":
        return " m"
    if key in ("max_distance", "max_cost"):
        return f" {distance_unit(attrs.get('weight', ''))}"
    return ""


def strict_json(v):
    """``v`` with NaN and infinities as null and numpy scalars as Python numbers: strict JSON (RFC 8259)."""
    if isinstance(v, dict):
        return {str(k): strict_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [strict_json(x) for x in v]
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def _disk_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@cli.command(short_help="Check every chunk's checksum and the manifests.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--threads", type=int, help="Parallel readers [default: 2 x cores, at most 16].")
def verify(store, as_json, threads):
    """Read every chunk of every array of a store and check its checksum and the array's manifest.

    Lists damaged, missing and unexpected chunk files; exit status 0 only when all is sound.
    """
    from terrain_io.integrity import verify as run
    from terrain_io.store import TerrainStore

    if not (store / "zarr.json").is_file():
        TerrainStore.open(store, mode="r")  # the usual one-line error for a path that is no store
    report = run(store, progress=not quiet() and not as_json, threads=threads)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for p in report.problems:
            click.echo(f"{store}: {p.line()}")
        if not report.checksums:
            click.echo(f"terrain: note: {store}: format_version {report.format_version}: its chunks carry no "
                       "checksums; only shard indexes and zstd frames were checked", err=True)
        state = (f"DAMAGED: {len(report.problems)} problem(s)" if not report.sound else "sound" if report.checksums
                 else "no damage found (no checksums: damage inside a chunk cannot be seen)")
        say(f"{store}: {report.arrays} arrays, {report.files} files, {report.chunks:,} chunks, "
            f"{format_bytes(report.bytes)} read in {report.seconds:.2f} s: {state}")
    if not report.sound:
        click.get_current_context().exit(1)


@cli.command(short_help="Generate fractal test terrain.")
@output_option("Output store.", type=click.Path(path_type=Path), dest="out", required=True)
@click.option("--size", required=True, type=int, help="Rows (and columns, unless --cols).")
@click.option("--cols", type=int, help="Columns, if not square.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--nodata-fraction", type=float, default=0.0, show_default=True,
              help="About this share of the cells becomes nodata (in large connected regions).")
@click.option("--cell-size", type=float, default=10.0, show_default=True, help="Cell size in metres.")
@tile_option
@shard_option
@scheduler_option
@overwrite_option
def synth(out, size, cols, seed, nodata_fraction, cell_size, tile, shard, scheduler, overwrite):
    """Generate fractal test terrain (ridges, valleys, plateaus, flats), shard by shard."""
    from terrain_io.synth import synthesize

    timer = Timer()
    st = synthesize(out, size, cols=cols, seed=seed, nodata_fraction=nodata_fraction, tile=tile, shard=shard,
                    cell_size=cell_size, overwrite=overwrite, progress=not quiet(), scheduler=scheduler,
                    announce=say)
    n = st.shape[0] * st.shape[1]
    say(f"{out}: {st.shape[0]} x {st.shape[1]} = {n:,} cells ({st.attrs['valid_count']:,} valid) in "
        f"{timer.elapsed:.2f} s, {n / 1e6 / timer.elapsed:.1f} Mcells/s")


@cli.command(short_help="Export an array to GeoTIFF, Esri ASCII or PNG.")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("array", default="elevation")
@output_option("OUT.tif (tiled, compressed GeoTIFF), OUT.asc (Esri ASCII) or OUT.png (picture).", dest="out",
               required=True)
@click.option("--decimals", type=click.IntRange(0, 17),  # terrain_io.export.DECIMALS_MAX
              help="Decimals in ASCII output, 0..17 [default: 3, 0 for integers].")
@click.option("--encoding", type=click.Choice(["esri", "taudem", "grass", "whitebox"]), default=None,
              help="Flow directions (flow/direction) in another tool's codes, GeoTIFF: esri 1..128 clockwise from E, "
                   "taudem 1..8 counter-clockwise from E, grass r.watershed 1..8 (negative where flow leaves), "
                   "whitebox D8 pointer.")
@click.option("--cog", is_flag=True,
              help="OUT.tif as a Cloud-Optimized GeoTIFF with internal overviews (GDAL's COG driver).")
@scheduler_option
@overwrite_option
def export(store, array, out, decimals, encoding, cog, scheduler, overwrite):
    """Export ARRAY of a store (default: elevation; e.g. sssp/NAME/distance) to a file.

    Unreached cells (+inf) and nodata are written as nodata; OUT.asc gets OUT.prj with the CRS.

    With --scheduler, workers read (and for .asc format, for .png downsample) the shards; this
    process writes the one file, the same bytes as without.
    """
    from terrain_io.export import export as run

    timer = Timer()
    from rasterio.errors import NotGeoreferencedWarning

    with warnings.catch_warnings():  # notes (TerrainNote) still reach the user
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a picture, a DEM without a transform
        run(store, array, out, overwrite=overwrite, decimals=decimals, scheduler=scheduler, progress=not quiet(),
            announce=say, encoding=encoding, cog=cog)
    say(f"{out}: written in {timer.elapsed:.2f} s ({format_bytes(out.stat().st_size)})")
