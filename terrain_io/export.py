"""Export store arrays: tiled compressed GeoTIFF, Esri ASCII grid, or a PNG picture to look at.

Every writer streams shard by shard (or band by band), so memory stays bounded for any DEM size,
and writes under a temporary name that is renamed when the file is complete.

With a Dask ``scheduler`` the per-shard work runs as tasks (:func:`terrain_io.parallel.imap_shards`),
a bounded number in flight, and this process writes the one output file in order: GeoTIFF -- the
workers read and decode the store's shards, GDAL compresses and writes them here; ASCII -- the
workers format the text of shard-row bands; PNG -- the workers read and downsample their shards,
the picture (at most 2048 cells a side) is coloured here. The local path runs the same task
functions in order, so the file is the same, byte for byte.

Nodata in the files, as GRASS ``r.cost`` and GDAL expect: the store's NaN *and* +-inf (an SSSP's
unreached cells; the store keeps +inf) become nodata -- NaN in a GeoTIFF, ``NODATA_value`` in an
ASCII grid, -9999 unless a written value would read back as it (then the first -99...9 that none
does: the grid is written again). Integer results whose fill value 0 is a valid value (``mst/edges``'
mask 0, ``fill/depression``'s "no lake", ``depressions/basin``'s "drains out", ``sssp/NAME/source``'s
"no source reaches it") mark only the DEM's nodata cells, with their dtype's largest value (255,
4294967295), which they never hold. ASCII values are fixed point with ``decimals`` (0..17): exact
decimal expansions where the fast formatter's int64 cannot hold them (|value| x 10^decimals >= 2^53),
so no value is ever written wrong; a ``.prj`` (Esri WKT) beside the grid carries the store's CRS.
"""
from __future__ import annotations

import contextlib
import math
from fnmatch import fnmatchcase
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from .errors import InputError, OutputError, StoreError
from .atomic import atomic_file, refuse_existing
from .parallel import check_scheduler, imap_shards
from .progress import progress_bar
from .legend import band_for
from .store import TerrainStore, Window, valid_mask
from .units import distance_unit
from .zorder import morton_order

PNG_MAX_SIDE = 2048
IN_FLIGHT_BYTES = 512 * 1024 * 1024  # about this much of shard-task results held at once (Dask)
DECIMALS_MAX = 17  # float64 carries 17 significant digits; more is refused, not written as noise
# NODATA_value of ASCII grids: the usual -9999, else the first -99...9 that no written value reads
# back as (all within float32's range, so readers of float32 grids can hold it)
ASCII_NODATA = tuple(-(10**k - 1) for k in range(4, 39))
_EXACT_INT = 2.0**53  # the fast ASCII formatter rounds |value| x 10^decimals to an int64 below this
# integer arrays whose nodata cells are the DEM's (their fill value 0 is a valid value): exported files
# mark those cells with the dtype's largest value, which these never hold (edge masks are 0..15, ids at
# most the count of lakes, basins or sources; _read_block refuses an export where one does)
ELEVATION_MASKED = ("mst/edges", "fill/depression", "depressions/basin", "sssp/*/source")


def _elevation_marker(name: str, arr) -> int | None:
    """The value that marks the DEM's nodata cells of ``name`` in a file (``ELEVATION_MASKED``), else None."""
    if arr.dtype.kind in "iu" and any(fnmatchcase(name, pattern) for pattern in ELEVATION_MASKED):
        return int(np.iinfo(arr.dtype).max)
    return None


def _array(store: TerrainStore, name: str):
    try:
        arr = store.array(name)  # (zarr.json that is not zarr's metadata: DamagedStoreError)
    except KeyError:
        raise StoreError(f"{store.path}: no array {name!r} (see 'terrain info')") from None
    if not hasattr(arr, "shape") or len(arr.shape) != 2:
        raise StoreError(f"{store.path}: {name!r} is not a 2-D array")
    return arr


def _nodata_of(store: TerrainStore, name: str, arr):
    if arr.dtype.kind == "f":
        return None
    marker = _elevation_marker(name, arr)
    if marker is not None:
        return marker
    return store.nodata if name == "elevation" else arr.attrs.get("nodata", arr.fill_value)


def export(store_path, name: str, out, *, overwrite: bool = False, decimals: int | None = None,
           scheduler: str | None = "local", progress: bool = False, announce=None, encoding: str | None = None,
           cog: bool = False) -> Path:
    """Write array ``name`` of the store to ``out`` (.tif/.tiff, .asc, .png by suffix).

    ``cog``: a Cloud-Optimized GeoTIFF (:func:`_write_cog`) with internal overviews.

    ``scheduler``: where the per-shard work runs (``local``, ``threads``, ``processes`` or a
    ``dask.distributed`` address; see the module docstring); the file is the same either way.
    ``encoding``: flow directions (``flow/direction``) in another tool's codes, GeoTIFF only
    (:mod:`terrain_io.grid.flow.encodings`: esri, taudem, grass, whitebox).
    """
    scheduler = check_scheduler(scheduler)
    if decimals is not None and not (isinstance(decimals, (int, np.integer)) and 0 <= decimals <= DECIMALS_MAX):
        raise InputError(f"--decimals must be a whole number from 0 to {DECIMALS_MAX}, got {decimals!r}")
    store = TerrainStore.open(store_path, mode="r")
    arr = _array(store, name)
    out = Path(out)
    refuse_existing(out, overwrite)
    suffix = out.suffix.lower()
    writers = {".tif": _write_geotiff, ".tiff": _write_geotiff, ".asc": _write_ascii, ".png": _write_png}
    if suffix not in writers:
        raise InputError(f"{out}: unknown output type {suffix!r} (use .tif, .asc or .png)")
    if encoding is not None:
        from .grid.flow.encodings import check

        check(encoding)
        if name.rsplit("/", 1)[-1] != "direction" or arr.dtype != np.uint8:
            raise InputError(f"--encoding applies to flow directions (flow/direction), not {name}")
        if suffix not in (".tif", ".tiff"):
            raise InputError(f"--encoding writes GeoTIFF (.tif), not {suffix}")
    if cog:
        if suffix not in (".tif", ".tiff"):
            raise InputError(f"--cog writes a GeoTIFF (.tif), not {suffix}")
        writers[suffix] = _write_cog
    run = _Runner(scheduler, progress, announce, encoding)
    from rasterio._err import CPLE_BaseError
    from rasterio.errors import RasterioError

    prj = out.with_suffix(".prj")
    replacing = out.exists()  # (with --overwrite: the .prj of the grid replaced goes with it)
    wkt = _esri_wkt(store.crs) if suffix == ".asc" else None
    if wkt and prj.exists() and not overwrite:
        raise StoreError(f"{prj}: already exists beside {out.name} (use --overwrite to replace it)")
    with atomic_file(out) as tmp, (atomic_file(prj) if wkt else contextlib.nullcontext()) as prj_tmp:
        try:
            if suffix == ".asc":
                _write_ascii(store, name, arr, tmp, decimals, run)
            else:
                writers[suffix](store, name, arr, tmp, run)
        except (CPLE_BaseError, RasterioError) as exc:  # GDAL's errors name the temporary: say them of OUT
            raise OutputError(f"{out}: cannot write it: {str(exc).replace(str(tmp), str(out))}") from None
        if wkt:
            prj_tmp.write_text(wkt + "\n")
    if suffix == ".asc" and not wkt and replacing:
        prj.unlink(missing_ok=True)  # --overwrite: the old grid's .prj would give the new one a CRS it has not
    return out


def _esri_wkt(crs: str | None) -> str | None:
    """The store's CRS as the Esri dialect of WKT 1 that ``.prj`` files hold (ArcGIS, GDAL read it)."""
    if not crs:
        return None
    from rasterio.crs import CRS
    from rasterio.enums import WktVersion

    return CRS.from_user_input(crs).to_wkt(version=WktVersion.WKT1_ESRI)


@dataclass
class _Runner:
    """Runs an export's shard tasks on the scheduler: results in order, a bounded number held."""

    scheduler: str
    progress: bool
    announce: object
    encoding: str | None = None  # flow directions in another tool's codes (GeoTIFF)

    def __call__(self, func, tasks: list, result_bytes: int):
        in_flight = max(2, IN_FLIGHT_BYTES // max(1, result_bytes))
        with progress_bar(self.progress, len(tasks), "export", unit="shard") as bar:
            yield from imap_shards(func, tasks, self.scheduler, in_flight=in_flight, progress=bar,
                                   announce=self.announce)


@dataclass(frozen=True)
class _ShardTask:
    """A shard (or a band of shard rows) of the array to export; workers open the store by path."""

    store: str
    name: str
    window: Window
    factor: int = 1  # PNG: every factor-th cell of the whole grid
    decimals: int = 0  # ASCII
    nodata: object = None  # ASCII: the integer nodata value (None: NaN and +-inf)
    nodata_text: str = "-9999"
    elevation_masked: object = None  # mark the DEM's nodata cells with this value (_elevation_marker)
    encoding: str | None = None  # flow directions: written in this tool's codes (grid.flow.encodings)


def _open(task: _ShardTask):
    return TerrainStore.open(task.store, mode="r").group[task.name]


def _read_block(task: _ShardTask) -> np.ndarray:
    """The window's values as a file holds them: +-inf as NaN (nodata), the DEM's nodata cells
    marked for arrays whose own values cannot tell them (``ELEVATION_MASKED``)."""
    w = task.window
    if task.encoding is not None:  # the outlets' outward direction needs the neighbours: a one-cell halo
        from .grid.flow.encodings import encode

        arr = _open(task)
        rows, cols = arr.shape
        halo = np.full((w.r1 - w.r0 + 2, w.c1 - w.c0 + 2), 255, np.uint8)
        r0, r1, c0, c1 = max(w.r0 - 1, 0), min(w.r1 + 1, rows), max(w.c0 - 1, 0), min(w.c1 + 1, cols)
        halo[r0 - w.r0 + 1 : r1 - w.r0 + 1, c0 - w.c0 + 1 : c1 - w.c0 + 1] = arr[r0:r1, c0:c1]
        return encode(halo, task.encoding)
    block = _open(task)[w.r0 : w.r1, w.c0 : w.c1]
    if block.dtype.kind == "f":
        block[np.isinf(block)] = np.nan
    if task.elevation_masked is not None:
        st = TerrainStore.open(task.store, mode="r")
        valid = st.valid(st.read(w))
        if np.any(block[valid] == task.elevation_masked):
            raise InputError(f"{task.name}: holds {task.elevation_masked}, the value that marks nodata cells in "
                             "exported files; it cannot be exported")
        block[~valid] = task.elevation_masked
    return block


def _write_geotiff(store: TerrainStore, name: str, arr, out: Path, run: _Runner, compress: dict | None = None,
                   transform=None) -> None:
    """``transform``: the GDAL geotransform of ``arr`` when it is not the store's grid (an overview level)."""
    import rasterio
    from rasterio.crs import CRS
    from rasterio.transform import Affine
    from rasterio.windows import Window as RioWindow

    rows, cols = arr.shape
    t = transform or store.transform
    dtype, nodata = str(arr.dtype), _nodata_of(store, name, arr)
    if run.encoding is not None:
        from .grid.flow.encodings import DTYPES

        dtype, nodata = np.dtype(DTYPES[run.encoding][0]).name, DTYPES[run.encoding][1]
    profile = dict(driver="GTiff", width=cols, height=rows, count=1, dtype=dtype,
                   tiled=True, blockxsize=256, blockysize=256, compress="deflate", predictor=2 if arr.dtype.kind in "iu" else 3,
                   BIGTIFF="IF_SAFER")
    profile["nodata"] = float("nan") if arr.dtype.kind == "f" else nodata
    if t is not None:
        profile["transform"] = Affine.from_gdal(*t)
    if store.crs:
        profile["crs"] = CRS.from_user_input(store.crs)
    profile.update(compress or {})
    if rows < 256 or cols < 256:
        profile.update(tiled=False)
        profile.pop("blockxsize"), profile.pop("blockysize")
    side = store.tile_size * store.shard_size  # the array's shards in Morton order (store.shards, any shape)
    wins = [Window(int(r) * side, min((int(r) + 1) * side, rows), int(c) * side, min((int(c) + 1) * side, cols))
            for r, c in morton_order(-(-rows // side), -(-cols // side))]
    tasks = [_ShardTask(str(store.path), name, win, elevation_masked=_elevation_marker(name, arr),
                        encoding=run.encoding) for win in wins]
    shard_bytes = (store.tile_size * store.shard_size) ** 2 * arr.dtype.itemsize
    with rasterio.Env(GDAL_CACHEMAX=256 * 1024 * 1024), rasterio.open(out, "w", **profile) as ds:
        for block, win in zip(run(_read_block, tasks, shard_bytes), wins):
            ds.write(block, 1, window=RioWindow(win.c0, win.r0, win.c1 - win.c0, win.r1 - win.r0))


# GDAL's overview resampling for each of the store's (terrain_io.overviews.resampling_for); GDAL 3.10
# has no maximum: a COG of accumulation or stream orders takes the store's own pyramid (_write_cog)
_COG_RESAMPLING = {"average": "AVERAGE", "mode": "MODE", "max": "AVERAGE"}
_SCRATCH = {"compress": "zstd", "zstd_level": 1, "predictor": 1}  # written once, read once
_COG_BLOCK = 512


def _write_cog(store: TerrainStore, name: str, arr, out: Path, run: _Runner) -> None:
    """A Cloud-Optimized GeoTIFF: the array streamed shard by shard into a tiled scratch GeoTIFF
    beside ``out`` (zstd level 1), then copied by GDAL's COG driver, which reads it block by block,
    builds the overviews (halving down to one 512^2 block, resampled as the store's overviews are,
    see ``_COG_RESAMPLING``) and writes the COG layout: IFDs first, the smallest overview's tiles
    first, full resolution last; deflate with a predictor.

    The maximum (flow accumulation, stream orders), which GDAL cannot resample, comes from the
    store's current pyramid (``terrain overviews``): each level streamed into a scratch GeoTIFF of
    its own, a VRT that names them as the overviews of the array's (GDAL's ``<Overview>``), copied
    with ``OVERVIEWS=FORCE_USE_EXISTING``; without a current pyramid, GDAL's average and a note."""
    import warnings

    import rasterio
    import rasterio.shutil

    from .atomic import scratch_file
    from .errors import TerrainNote
    from .overviews import current_levels, level_transform, resampling_for

    method = resampling_for(name, arr.dtype)
    levels = current_levels(store, name) if method == "max" else None
    if method == "max" and not levels and max(arr.shape) > _COG_BLOCK:  # (one block: no overviews at all)
        warnings.warn(TerrainNote(f"{name}: GDAL has no maximum resampling: the COG's overviews average it (after "
                                  f"'terrain overviews {store.path} {name}' they are the store's maxima)"))
    with contextlib.ExitStack() as scratch:
        src = scratch.enter_context(scratch_file(out))
        _write_geotiff(store, name, arr, src, run, compress=_SCRATCH)
        options = {"OVERVIEW_RESAMPLING": _COG_RESAMPLING[method]}
        if levels:
            t = store.geotransform
            files = []
            for k, level in enumerate(levels, start=1):
                files.append(scratch.enter_context(scratch_file(out)))
                _write_geotiff(store, level, store.group[level], files[-1], run, compress=_SCRATCH,
                               transform=level_transform(t, k))
            vrt = scratch.enter_context(scratch_file(out))
            with rasterio.open(src) as ds:
                Path(vrt).write_text(_vrt_with_overviews(ds, src, files))
            src, options = vrt, {"OVERVIEWS": "FORCE_USE_EXISTING"}
        with rasterio.Env(GDAL_CACHEMAX=256 * 1024 * 1024, GDAL_NUM_THREADS="ALL_CPUS"):
            rasterio.shutil.copy(src, out, driver="COG", COMPRESS="DEFLATE", PREDICTOR="YES", BLOCKSIZE=_COG_BLOCK,
                                 BIGTIFF="IF_SAFER", NUM_THREADS="ALL_CPUS", **options)


_GDAL_TYPES = {"uint8": "Byte", "int8": "Int8", "uint16": "UInt16", "int16": "Int16", "uint32": "UInt32",
               "int32": "Int32", "uint64": "UInt64", "int64": "Int64", "float32": "Float32", "float64": "Float64"}


def _vrt_with_overviews(ds, path, overviews) -> str:
    """A GDAL VRT of the one-band GeoTIFF ``path`` (open as ``ds``) whose overviews are the files
    ``overviews`` (GDAL's VRT format: ``<Overview>`` elements of the band)."""
    from xml.sax.saxutils import escape

    def source(tag, p):
        return (f'<{tag}><SourceFilename relativeToVRT="0">{escape(str(Path(p).resolve()))}</SourceFilename>'
                f"<SourceBand>1</SourceBand></{tag}>")

    nodata = ds.nodata
    nodata = "" if nodata is None else f"<NoDataValue>{'nan' if math.isnan(nodata) else repr(nodata)}</NoDataValue>"
    srs = f"<SRS>{escape(ds.crs.to_wkt())}</SRS>" if ds.crs else ""
    gt = ", ".join(repr(float(v)) for v in ds.transform.to_gdal())
    return (f'<VRTDataset rasterXSize="{ds.width}" rasterYSize="{ds.height}">{srs}<GeoTransform>{gt}</GeoTransform>'
            f'<VRTRasterBand dataType="{_GDAL_TYPES[ds.dtypes[0]]}" band="1">{nodata}{source("SimpleSource", path)}'
            + "".join(source("Overview", p) for p in overviews) + "</VRTRasterBand></VRTDataset>")


@nb.njit(cache=True)
def _format_rows(values, decimals, nodata_text, out):
    """Format a 2-D float array as ASCII grid rows (fixed point); returns the bytes used in ``out``."""
    scale = 10.0**decimals
    pos = 0
    digits = np.empty(32, dtype=np.uint8)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if j:
                out[pos] = 32
                pos += 1
            v = values[i, j]
            if v != v:
                for k in range(nodata_text.shape[0]):
                    out[pos] = nodata_text[k]
                    pos += 1
                continue
            if v < 0:
                out[pos] = 45
                pos += 1
                v = -v
            q = np.int64(np.floor(v * scale + 0.5))
            n = 0
            while q > 0 or n <= decimals:
                digits[n] = 48 + q % 10
                q //= 10
                n += 1
            for k in range(n - 1, -1, -1):
                out[pos] = digits[k]
                pos += 1
                if k == decimals and decimals > 0:
                    out[pos] = 46
                    pos += 1
        out[pos] = 10
        pos += 1
    return pos


def _ascii_band(task: _ShardTask) -> tuple[bytes, tuple]:
    """The text rows of a band of the array (a row of shards), and the places in ``ASCII_NODATA``
    of the values that a written value would read back as (float arrays)."""
    block = _read_block(task)
    if task.nodata is not None:  # an integer array's own nodata value
        nodata = block == task.nodata
        block = block.astype(np.float64) if not _beyond_float(block) else block.astype(object)
        block[nodata] = np.nan
    elif block.dtype.kind != "f":
        block = block.astype(np.float64) if not _beyond_float(block) else block.astype(object)
    else:
        block = block.astype(np.float64)
    nodata_text = task.nodata_text
    if block.dtype == object:  # integers beyond 2^53: written from the exact integers
        return _format_exact(block, task.decimals, nodata_text), ()
    finite = block[np.isfinite(block)]
    hits, big = (), False
    if finite.size:
        if task.nodata is None:
            # generous: a false alarm only costs another nodata value
            low = finite[finite < ASCII_NODATA[0] + 1]
            hits = tuple(i for i, nd in enumerate(ASCII_NODATA)
                         if low.size and np.any(np.abs(low - nd) <= 0.5 * 10.0**-task.decimals + 1e-12 * -nd))
        big = float(np.abs(finite).max()) * 10.0**task.decimals >= _EXACT_INT
    if big:
        return _format_exact(block, task.decimals, nodata_text), hits
    width = max(24 + task.decimals, len(nodata_text) + 1)
    buf = np.empty(block.size * width + block.shape[0], dtype=np.uint8)
    n = _format_rows(block, task.decimals, np.frombuffer(nodata_text.encode(), np.uint8), buf)
    return buf[:n].tobytes(), hits


def _beyond_float(block: np.ndarray) -> bool:
    """Whether integers lose digits in float64 (64-bit integers of 2^53 and more)."""
    return block.dtype.itemsize == 8 and block.size > 0 and bool(np.any(np.abs(block.astype(np.float64)) >= _EXACT_INT))


def _format_exact(block: np.ndarray, decimals: int, nodata_text: str) -> bytes:
    """Rows of exact decimal expansions (Python's correctly rounded ``f`` format; slow, for values
    the int64 of :func:`_format_rows` cannot hold)."""
    def text(v) -> str:
        if isinstance(v, int):
            return f"{v}.{'0' * decimals}" if decimals else str(v)
        return f"{v:.{decimals}f}" if math.isfinite(v) else nodata_text

    return "".join(" ".join(text(v) for v in row) + "\n" for row in block.tolist()).encode()


def _write_ascii(store: TerrainStore, name: str, arr, out: Path, decimals: int | None, run: _Runner) -> None:
    rows, cols = arr.shape
    t = store.transform or (0.0, 1.0, 0.0, float(rows), 0.0, -1.0)
    if t[2] or t[4] or t[5] >= 0:
        raise InputError("Esri ASCII needs north-up cells without rotation; export to .tif instead")
    square = abs(abs(t[1]) - abs(t[5])) <= 1e-12 * abs(t[1])
    size = f"cellsize {abs(t[1])!r}\n" if square else f"dx {abs(t[1])!r}\ndy {abs(t[5])!r}\n"
    nodata = _nodata_of(store, name, arr)
    if decimals is None:
        decimals = 0 if arr.dtype.kind in "iu" else 3
    band = store.tile_size * store.shard_size
    nodata_text = str(ASCII_NODATA[0] if nodata is None else nodata)
    while True:
        header = (f"ncols {cols}\nnrows {rows}\nxllcorner {t[0]!r}\nyllcorner {t[3] + rows * t[5]!r}\n"
                  f"{size}NODATA_value {nodata_text}\n")
        tasks = [_ShardTask(str(store.path), name, Window(r0, min(r0 + band, rows), 0, cols), decimals=decimals,
                            nodata=nodata, nodata_text=nodata_text, elevation_masked=_elevation_marker(name, arr))
                 for r0 in range(0, rows, band)]
        held = set()
        with open(out, "wb") as f:
            f.write(header.encode())
            for text, hits in run(_ascii_band, tasks, band * cols * (8 + decimals)):
                f.write(text)
                held.update(hits)
        if nodata is not None or int(nodata_text) not in {ASCII_NODATA[i] for i in held}:
            return
        free = [nd for i, nd in enumerate(ASCII_NODATA) if i not in held]  # the data holds -9999: write again
        if not free:
            raise InputError(f"{name}: the values hold every nodata value an ASCII grid could take; export to .tif")
        nodata_text = str(free[0])


# -- PNG pictures ------------------------------------------------------------------------------
def _downsampled_shard(task: _ShardTask) -> np.ndarray:
    """Every ``factor``-th cell (of the whole array's grid) in one shard."""
    win, factor = task.window, task.factor
    rs, cs = (-win.r0) % factor, (-win.c0) % factor
    return np.asarray(_open(task)[win.r0 + rs : win.r1 : factor, win.c0 + cs : win.c1 : factor], dtype=np.float64)


def _downsampled(store: TerrainStore, name: str, arr, factor: int, run: _Runner) -> np.ndarray:
    """Every ``factor``-th cell in both directions, read shard by shard."""
    rows, cols = arr.shape
    out = np.empty((-(-rows // factor), -(-cols // factor)), dtype=np.float64)
    wins = list(store.shards())
    tasks = [_ShardTask(str(store.path), name, win, factor=factor) for win in wins]
    side = -(-store.tile_size * store.shard_size // factor)
    for block, win in zip(run(_downsampled_shard, tasks, side * side * 8), wins):
        r, c = -(-win.r0 // factor), -(-win.c0 // factor)
        out[r : r + block.shape[0], c : c + block.shape[1]] = block
    return out


def hillshade(z: np.ndarray, dx: float, dy: float, azimuth: float = 315.0, altitude: float = 45.0) -> np.ndarray:
    """Horn's hillshade in [0, 1] (NaN cells give NaN)."""
    zp = np.pad(z, 1, mode="edge")
    zp = np.where(np.isnan(zp), np.pad(np.where(np.isnan(z), np.nanmean(z) if np.isfinite(z).any() else 0, z), 1,
                                       mode="edge"), zp)
    gx = ((zp[:-2, 2:] + 2 * zp[1:-1, 2:] + zp[2:, 2:]) - (zp[:-2, :-2] + 2 * zp[1:-1, :-2] + zp[2:, :-2])) / (8 * dx)
    gy = ((zp[2:, :-2] + 2 * zp[2:, 1:-1] + zp[2:, 2:]) - (zp[:-2, :-2] + 2 * zp[:-2, 1:-1] + zp[:-2, 2:])) / (8 * dy)
    slope = np.arctan(np.hypot(gx, gy))
    aspect = np.arctan2(-gx, gy)
    az, alt = math.radians(360.0 - azimuth + 90.0), math.radians(altitude)
    shade = np.sin(alt) * np.cos(slope) + np.cos(alt) * np.sin(slope) * np.cos(az - aspect)
    return np.clip(shade, 0, 1)


_RAMP = np.array([  # hypsometric tints: low green -> yellow -> brown -> white
    [0.00, 0x2b, 0x83, 0x4d], [0.25, 0x9c, 0xc5, 0x6b], [0.50, 0xf1, 0xe2, 0x8b],
    [0.75, 0xa6, 0x73, 0x4b], [1.00, 0xf5, 0xf5, 0xf5]])
_MAGMA = np.array([  # distances: dark -> bright
    [0.00, 0x00, 0x00, 0x04], [0.25, 0x51, 0x12, 0x7c], [0.50, 0xb7, 0x37, 0x79],
    [0.75, 0xfc, 0x89, 0x61], [1.00, 0xfc, 0xfd, 0xbf]])
BLUES = np.array([  # water depths: shallow light blue -> deep dark blue (ColorBrewer "Blues")
    [0.00, 0xc6, 0xdb, 0xef], [0.25, 0x9e, 0xca, 0xe1], [0.50, 0x42, 0x92, 0xc6],
    [0.75, 0x08, 0x51, 0x9c], [1.00, 0x08, 0x30, 0x6b]])


def value_range(values: np.ndarray) -> tuple[float, float]:
    """The finite 2..98 percentile range of ``values`` (the span a picture's colour ramp covers)."""
    finite = values[np.isfinite(values)]
    return tuple(float(v) for v in np.percentile(finite, [2, 98])) if finite.size else (0.0, 1.0)


def colorize(values: np.ndarray, ramp: np.ndarray, span: tuple[float, float] | None = None) -> np.ndarray:
    """RGB (float 0..255) of ``values`` on ``ramp`` over ``span`` (default :func:`value_range`),
    values beyond it clipped to its ends."""
    lo, hi = span if span is not None else value_range(values)
    x = np.clip((values - lo) / (hi - lo if hi > lo else 1.0), 0, 1)
    x = np.nan_to_num(x, nan=0.0)
    return np.stack([np.interp(x, ramp[:, 0], ramp[:, k]) for k in (1, 2, 3)], axis=-1)


def _ramp_colours(ramp: np.ndarray, n: int = 256) -> np.ndarray:
    return colorize(np.linspace(0.0, 1.0, n), ramp, (0.0, 1.0))


def _ramp_labels(lo: float, hi: float) -> list[str]:
    """The values at the ramp's ends (the 2nd and 98th percentiles: values beyond take the end colours)
    and its middle."""
    return [f"\u2264{lo:.4g}", f"{(lo + hi) / 2:.4g}", f"\u2265{hi:.4g}"]


def _categorical(ids: np.ndarray) -> np.ndarray:
    """RGB (float 0..255) of integer ids: a fixed pseudo-random bright colour per id."""
    k = np.nan_to_num(ids).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    rgb = np.stack([(k >> np.uint64(s)) & np.uint64(0xFF) for s in (40, 48, 56)], axis=-1).astype(np.float64)
    return 64.0 + rgb * (191.0 / 255.0)


def _ramp_legend(width: int, title: str, ramp: np.ndarray, span: tuple[float, float]) -> np.ndarray:
    band = band_for(width, [title])
    band.text(title)
    band.ramp(_ramp_colours(ramp), _ramp_labels(*span))
    return band.image()


def _ids_legend(width: int, name: str, leaf: str, ids: np.ndarray) -> np.ndarray:
    what = {"depression": "depressions", "basin": "leaf basins", "source": "nearest sources", "label": "basins",
            "link": "stream links"}[leaf]
    title = f"{name}: {ids.size:,} {what}; clear: 0"
    band = band_for(width, [title])
    band.text(title)
    band.swatches([(_categorical(np.array([float(i)]))[0], str(i)) for i in ids[:12]])
    return band.image()


def _unit_of(store: TerrainStore, name: str) -> str:
    """The unit of a float array's values in a picture's legend: an SSSP distance's, else none known."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "sssp" and parts[2] == "distance":
        return distance_unit(store.group["/".join(parts[:2])].attrs.get("weight", ""))
    return ""


@dataclass
class Painted:
    """Colours of an array's values as pictures and web map tiles show them (:func:`paint`)."""

    rgb: np.ndarray  # (h, w, 3) float 0..255
    ok: np.ndarray  # where a colour is drawn (else clear)
    span: tuple[float, float]  # the values at the ramp's ends (ids: unused)
    legend: object  # legend(width, note="") -> (h, width, 3): the legend band (terrain_io.legend)


def paint(store: TerrainStore, name: str, arr, z: np.ndarray, *, span=None, shade=None) -> Painted:
    """The colours of values ``z`` of array ``name``: hillshaded hypsometric tints for elevations (``shade``:
    the hillshade in [0, 1] of the same cells, if any), lakes of ``fill/depth`` in blues, a colour per
    id (clear at 0), flow accumulation in blues on a log scale, stream orders in blues from 1, codes as
    set / unset, anything else on magma; the span of the ramp from ``z`` (its 2nd..98th percentiles)
    unless given."""
    nodata = _nodata_of(store, name, arr)
    ok = valid_mask(z, nodata) & np.isfinite(z)
    z = np.where(ok, z, np.nan)
    leaf = name.rsplit("/", 1)[-1]

    def ramp_legend(title, ramp, at):
        return lambda width, note="": _ramp_legend(width, title + note, ramp, at)

    if leaf == "elevation":  # the DEM, or a filled one
        span = span or value_range(z)
        rgb = colorize(z, _RAMP, span)
        if shade is not None:
            rgb = rgb * (0.35 + 0.65 * shade)[..., None]
        return Painted(rgb, ok, span, ramp_legend(f"{name} (m), hillshaded", _RAMP, span))
    if leaf == "depth":  # filled depths: the lakes in blues, dry cells transparent
        ok &= z > 0
        span = span or value_range(np.where(ok, z, np.nan))
        return Painted(colorize(np.where(ok, z, np.nan), BLUES, span), ok, span,
                       ramp_legend("water depth (m); clear: dry", BLUES, span))
    if leaf in ("order", "magnitude") and name.startswith("streams/"):  # Strahler / Shreve: blues, 0 clear
        ok &= z > 0
        span = span or ((1.0, float(np.nanmax(np.where(ok, z, np.nan)))) if ok.any() else (1.0, 2.0))
        method = store.group[name].attrs.get("method", "")
        return Painted(colorize(np.where(ok, z, np.nan), BLUES, span), ok, span,
                       ramp_legend(f"{name} ({method}); clear: off the network", BLUES, span))
    if leaf in ("depression", "basin", "source", "label", "link"):  # ids: one colour each, transparent outside
        ok &= z > 0
        ids = np.unique(z[ok]).astype(np.int64)
        return Painted(_categorical(z), ok, span or (0.0, 1.0),
                       lambda width, note="": _ids_legend(width, name, leaf, ids))
    if leaf == "accumulation":  # flow accumulation: log scale (counts span 1 .. millions), 0 clear
        ok &= z > 0
        logs = np.log10(np.where(ok, z, np.nan))
        span = span or ((0.0, float(np.nanmax(logs))) if ok.any() else (0.0, 1.0))
        title = f"{name} ({store.group[name].attrs.get('units', 'cells')}), log scale"

        def legend(width, note=""):
            band = band_for(width, [title + note])
            band.text(title + note)
            band.ramp(_ramp_colours(BLUES), [f"{10 ** v:.3g}" for v in (span[0], sum(span) / 2, span[1])])
            return band.image()

        return Painted(colorize(logs, BLUES, span), ok, span, legend)
    if arr.dtype == np.uint8:  # direction codes / bitmasks: show set vs unset
        def legend(width, note=""):
            band = band_for(width, [f"{name}: codes / bit mask"])
            band.text(f"{name}: codes / bit mask")
            band.swatches([(np.full(3, 30.0), "0"), (np.full(3, 230.0), "not 0")])
            return band.image()

        return Painted(np.repeat(np.where(np.nan_to_num(z) > 0, 230.0, 30.0)[..., None], 3, axis=-1), ok,
                       span or (0.0, 1.0), legend)
    span = span or value_range(z)
    unit = _unit_of(store, name)
    return Painted(colorize(z, _MAGMA, span), ok, span, ramp_legend(f"{name}{f' ({unit})' if unit else ''}", _MAGMA,
                                                                    span))


def _write_png(store: TerrainStore, name: str, arr, out: Path, run: _Runner) -> None:
    """The picture of ``name`` (at most PNG_MAX_SIDE cells a side; its pixels are the cells, row for
    row, from the top-left corner) over its legend band (:mod:`terrain_io.legend`)."""
    rows, cols = arr.shape
    factor = max(1, math.ceil(max(rows, cols) / PNG_MAX_SIDE))
    z = _downsampled(store, name, arr, factor, run)
    shade = None
    if name.rsplit("/", 1)[-1] == "elevation":
        dx, dy = store.metric_cell_size  # metres also for degrees: the relief's true slopes
        shade = hillshade(np.where(valid_mask(z, _nodata_of(store, name, arr)) & np.isfinite(z), z, np.nan),
                          dx * factor, dy * factor)
    painted = paint(store, name, arr, z, shade=shade)
    rgb, ok = painted.rgb, painted.ok
    legend = painted.legend(rgb.shape[1], f", 1 in {factor} cells a side" if factor > 1 else "")
    write_picture(rgb, ok, legend, out)


def write_picture(rgb: np.ndarray, ok: np.ndarray, legend: np.ndarray, out: Path) -> None:
    """A PNG of ``rgb`` (float 0..255, rows x cols x 3; transparent where ``ok`` is False) over the
    legend band ``legend`` (:mod:`terrain_io.legend`), clear beside the picture where the band is wider."""
    import warnings

    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    alpha = np.where(ok, 255, 0)
    picture = np.concatenate([rgb, alpha[..., None]], axis=-1)
    image = np.zeros((picture.shape[0] + legend.shape[0], legend.shape[1], 4))  # clear beside the picture
    image[: picture.shape[0], : picture.shape[1]] = picture
    image[picture.shape[0] :, :, :3], image[picture.shape[0] :, :, 3] = legend, 255
    image = image.round().astype(np.uint8).transpose(2, 0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a picture has no geotransform
        ds = rasterio.open(out, "w", driver="PNG", width=image.shape[2], height=image.shape[1], count=4,
                           dtype="uint8")
    with ds:
        ds.write(image)
