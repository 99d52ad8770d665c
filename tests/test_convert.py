"""Conversion round trips (source -> store -> GeoTIFF) against independent readers, and bad input."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import rasterio

from terrain_io import convert as convert_module
from terrain_io.convert import convert
from terrain_io.errors import InputError, TerrainError
from terrain_io.export import export
from terrain_io.store import TerrainStore



def esri_text(values, xll=100.0, yll=200.0, cell=5.0, nodata=-9999.0, fmt="%.3f", corner=True, keys_upper=False,
              newline="\n"):
    rows, cols = values.shape
    kx, ky = ("xllcorner", "yllcorner") if corner else ("xllcenter", "yllcenter")
    header = [("ncols", cols), ("nrows", rows), (kx, xll), (ky, yll), ("cellsize", cell), ("NODATA_value", nodata)]
    lines = [f"{k.upper() if keys_upper else k} {v}" for k, v in header]
    body = np.where(np.isnan(values), nodata, values)
    lines += [" ".join(fmt % v for v in row) for row in body]
    return newline.join(lines) + newline


def loadtxt_reference(path: Path, header_lines: int, nodata) -> np.ndarray:
    """Independent reader: numpy's text parser, float64 -> float32, nodata -> NaN."""
    ref = np.loadtxt(path, skiprows=header_lines, dtype=np.float64, ndmin=2)
    ref[ref == nodata] = np.nan
    return ref.astype(np.float32)


def geotiff_round_trip(store_path: Path, tmp_path: Path):
    tif = export(store_path, "elevation", tmp_path / "back.tif")
    with rasterio.open(tif) as ds:
        return ds.read(1), ds.transform, ds.crs


@pytest.mark.parametrize("shape,tile,shard", [((37, 53), 16, 2), ((300, 1), 32, 2), ((1, 257), 8, 4), ((64, 64), 32, 2)])
def test_esri_ascii_round_trip(tmp_path, shape, tile, shard):
    rng = np.random.default_rng(shape[0])
    values = rng.uniform(-50, 3000, shape)
    values[rng.random(shape) < 0.1] = np.nan
    src = tmp_path / "dem.asc"
    src.write_text(esri_text(values))
    summary = convert(src, tmp_path / "dem.zarr", tile=tile, shard=shard)
    ref = loadtxt_reference(src, 6, -9999.0)
    back, transform, crs = geotiff_round_trip(summary.path, tmp_path)
    np.testing.assert_array_equal(back, ref)
    assert transform.to_gdal() == pytest.approx((100.0, 5.0, 0.0, 200.0 + 5.0 * shape[0], 0.0, -5.0))
    assert crs is None
    assert summary.valid == int(np.isfinite(ref).sum())


def test_rows_longer_than_the_header_probe(tmp_path):
    values = np.random.default_rng(2).uniform(0, 1000, (3, 12000))  # a row of ~100 kB
    src = tmp_path / "long.asc"
    src.write_text(esri_text(values))
    st = TerrainStore.open(convert(src, tmp_path / "long.zarr", tile=8, shard=2).path)
    np.testing.assert_array_equal(st.elevation[:], loadtxt_reference(src, 6, -9999.0))


def test_header_variants_center_origin_crlf_upper_keys(tmp_path):
    values = np.arange(12, dtype=np.float64).reshape(3, 4) * 1.25
    src = tmp_path / "c.asc"
    src.write_text(esri_text(values, corner=False, keys_upper=True, newline="\r\n"))
    st = TerrainStore.open(convert(src, tmp_path / "c.zarr", tile=8, shard=2).path)
    np.testing.assert_array_equal(st.elevation[:], values.astype(np.float32))
    assert st.transform == pytest.approx((100.0 - 2.5, 5.0, 0.0, 200.0 - 2.5 + 15.0, 0.0, -5.0))


def test_dx_dy_header_and_scientific_and_long_numbers(tmp_path):
    src = tmp_path / "d.asc"
    body = ["1e3 -2.5E-2 0.1234567890123456789012 7", "nan 3.4028234663852886e38 +4. -.5", "1e38 1e-50 12345678901234567890123 -0"]
    src.write_text("ncols 4\nnrows 3\nxllcorner 0\nyllcorner 0\ndx 2\ndy 3\n" + "\n".join(body) + "\n")
    st = TerrainStore.open(convert(src, tmp_path / "d.zarr", tile=8, shard=2).path)
    expect = np.array([[float(t) for t in line.split()] for line in body]).astype(np.float32)
    np.testing.assert_array_equal(st.elevation[:], expect)
    assert st.cell_size == (2.0, 3.0)
    src.write_text("ncols 1\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n1e39\n")
    with pytest.raises(InputError, match="beyond the range of float32"):
        convert(src, tmp_path / "o.zarr", tile=8, shard=2)


def test_exact_parse_of_random_decimals(tmp_path):
    rng = np.random.default_rng(7)
    values = rng.normal(0, 1000, (50, 40))
    src = tmp_path / "r.asc"
    src.write_text(esri_text(values, fmt="%.9g"))
    st = TerrainStore.open(convert(src, tmp_path / "r.zarr", tile=16, shard=2).path)
    np.testing.assert_array_equal(st.elevation[:], loadtxt_reference(src, 6, -9999.0))


def test_grass_ascii_with_nulls_matches_esri_sample(tmp_path, sample_data):
    grass = sample_data / "jacksboro_fault_dem_holes.grass.asc"
    esri = sample_data / "jacksboro_fault_dem.asc"
    g = TerrainStore.open(convert(grass, tmp_path / "g.zarr", tile=64, shard=2).path)
    e = TerrainStore.open(convert(esri, tmp_path / "e.zarr", tile=64, shard=2).path)
    gv, ev = g.elevation[:], e.elevation[:]
    hole = np.zeros(gv.shape, bool)
    hole[100:110, 200:215] = True
    assert np.isnan(gv[hole]).all() and not np.isnan(gv[~hole]).any()
    np.testing.assert_array_equal(gv[~hole], ev[~hole])
    # GRASS header (north/south/east/west) gives the same georeferencing as the Esri one
    assert g.transform == pytest.approx(e.transform)
    ref = loadtxt_reference(esri, 6, -9999.0)
    back, _, _ = geotiff_round_trip(e.path, tmp_path)
    np.testing.assert_array_equal(back, ref)


def test_grass_star_null_and_multiplier(tmp_path):
    src = tmp_path / "m.asc"
    src.write_text("north: 30\nsouth: 0\neast: 40\nwest: 0\nrows: 3\ncols: 4\nmultiplier: 0.5\n"
                   "1 2 3 4\n5 * 7 8\n9 10 11 12\n")
    st = TerrainStore.open(convert(src, tmp_path / "m.zarr", tile=8, shard=2).path)
    expect = np.arange(1, 13, dtype=np.float32).reshape(3, 4) * 0.5
    expect[1, 1] = np.nan
    np.testing.assert_array_equal(st.elevation[:], expect)
    assert st.cell_size == (10.0, 10.0)


@pytest.mark.parametrize("name", ["topobathy_land.tif", "pysheds_dem.tif"])
def test_geotiff_round_trip_keeps_values_nodata_crs_transform(tmp_path, name, sample_data):
    src = sample_data / name
    st = TerrainStore.open(convert(src, tmp_path / "t.zarr", tile=32, shard=2).path)
    with rasterio.open(src) as ds:
        ref, ref_transform, ref_crs, ref_nodata, ref_dtype = ds.read(1), ds.transform, ds.crs, ds.nodata, ds.dtypes[0]
    back, transform, crs = geotiff_round_trip(st.path, tmp_path)
    assert str(st.dtype) == ref_dtype  # float32 stays float32, int16 stays int16
    np.testing.assert_array_equal(back, ref)
    assert transform == ref_transform and crs == ref_crs
    if np.issubdtype(ref.dtype, np.floating):
        assert st.attrs["valid_count"] == int(np.isfinite(ref).sum())
    else:
        assert st.nodata == ref_nodata and st.attrs["valid_count"] == int((ref != ref_nodata).sum())


def test_wide_dem_spills_shard_rows_to_scratch(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_module, "SHARD_ROW_RAM", 1024)  # force the scratch-file path
    monkeypatch.setattr(convert_module, "READ_BLOCK", 4096)  # and many read blocks
    rng = np.random.default_rng(3)
    values = rng.uniform(0, 100, (45, 301))
    src = tmp_path / "w.asc"
    src.write_text(esri_text(values))
    st = TerrainStore.open(convert(src, tmp_path / "w.zarr", tile=8, shard=2).path)
    np.testing.assert_array_equal(st.elevation[:], loadtxt_reference(src, 6, -9999.0))


# -- bad input: one clear error, nothing left behind -------------------------------------------------
BAD = {
    "missing key": ("ncols 2\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n", "missing header key 'nrows'"),
    "duplicate key": ("ncols 2\nncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n", "duplicate"),
    "non-numeric key": ("ncols two\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n", "not a number"),
    "zero size": ("ncols 0\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n\n", "positive integer"),
    "negative cell": ("ncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize -1\n1 2\n", "cell size must be positive"),
    "ragged row": ("ncols 3\nnrows 2\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2 3\n4 5\n", "line 7: expected 3 values"),
    "long row": ("ncols 2\nnrows 2\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n4 5 6\n", "line 7: expected 2 values"),
    "short file": ("ncols 2\nnrows 3\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n4 5\n", "ends after 2 of 3 rows"),
    "extra rows": ("ncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n4 5\n", "more rows than nrows"),
    "bad value": ("ncols 2\nnrows 2\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n4 x5\n", "line 7: not a number: 'x5'"),
    "unknown key": ("ncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\nfoo 3\n1 2\n", "unknown header key"),
    "no body": ("ncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n", "no grid values"),
    "no body, no newline": ("ncols 2\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1", "no grid values"),
    "empty": ("", "empty file"),
    "grass reversed": ("north: 0\nsouth: 10\neast: 1\nwest: 0\nrows: 1\ncols: 1\n5\n", "north must exceed south"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_ascii_is_one_clear_error_and_leaves_no_store(tmp_path, case):
    text, message = BAD[case]
    src = tmp_path / "bad.asc"
    src.write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(")) as info:
        convert(src, tmp_path / "bad.zarr", tile=8, shard=2)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.asc"]


def test_unreadable_geotiff(tmp_path):
    src = tmp_path / "broken.tif"
    src.write_bytes(b"II*\x00" + bytes(range(256)) * 4)
    with pytest.raises(InputError, match="not a raster GDAL can read"):
        convert(src, tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()


def test_existing_output_needs_overwrite(tmp_path):
    src = tmp_path / "a.asc"
    src.write_text(esri_text(np.ones((2, 2))))
    convert(src, tmp_path / "a.zarr", tile=8, shard=2)
    with pytest.raises(TerrainError, match="already exists"):
        convert(src, tmp_path / "a.zarr", tile=8, shard=2)
    src.write_text(esri_text(np.full((2, 2), 7.0)))
    convert(src, tmp_path / "a.zarr", tile=8, shard=2, overwrite=True)
    assert (TerrainStore.open(tmp_path / "a.zarr").elevation[:] == 7).all()


def test_all_nodata_warns(tmp_path):
    src = tmp_path / "n.asc"
    src.write_text(esri_text(np.full((3, 3), np.nan)))
    with pytest.warns(UserWarning, match="every cell is nodata"):
        summary = convert(src, tmp_path / "n.zarr", tile=8, shard=2)
    assert summary.valid == 0


def test_interrupted_conversion_leaves_no_store(tmp_path, monkeypatch):
    src = tmp_path / "i.asc"
    src.write_text(esri_text(np.random.default_rng(0).uniform(0, 1, (40, 40))))
    calls = {"n": 0}
    original = convert_module.ShardRowWriter.add_band

    def add_band_then_interrupt(self, row0, band):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, row0, band)

    monkeypatch.setattr(convert_module.ShardRowWriter, "add_band", add_band_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "i.zarr", tile=8, shard=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.asc"]


def test_integer_dtype_keeps_declared_nodata(tmp_path):
    values = np.array([[1.0, 2.0], [np.nan, 4.0]])
    src = tmp_path / "i.asc"
    src.write_text(esri_text(values, fmt="%.0f"))
    st = TerrainStore.open(convert(src, tmp_path / "i.zarr", tile=8, shard=2, dtype="int16").path)
    assert st.dtype == np.int16 and st.nodata == -9999
    np.testing.assert_array_equal(st.elevation[:], [[1, 2], [-9999, 4]])
    assert st.attrs["valid_count"] == 3
    with pytest.raises(InputError, match="do not fit"):
        src.write_text(esri_text(np.array([[1.5]])))
        convert(src, tmp_path / "j.zarr", tile=8, shard=2, dtype="int16")


CONVERT_RSS = r"""
import sys
from terrain_io.convert import convert
from terrain_io.memory import peak_rss
convert(sys.argv[1], sys.argv[2], tile=64, shard=4)
print(peak_rss())
"""


@pytest.mark.slow  # long: the default run keeps CI under its 15 minutes (the slow run covers it)
def test_ascii_conversion_memory_does_not_grow_with_rows(tmp_path):
    """Streaming: 4x the rows (of the same width) adds far less than the grid's size to the peak RSS."""
    import subprocess
    import sys

    from terrain_io.synth import synthesize

    peaks = {}
    for rows in (2048, 8192):
        store = synthesize(tmp_path / f"s{rows}.zarr", rows, cols=2048, seed=1, tile=64, shard=4)
        asc = export(store.path, "elevation", tmp_path / f"s{rows}.asc", decimals=2)
        env = dict(os.environ, MALLOC_ARENA_MAX="2")  # fewer per-thread malloc arenas: less allocator noise
        runs = []
        for attempt in range(2):  # the least of two: the encoder threads' allocations vary by ~10 MiB a run
            out = subprocess.run([sys.executable, "-c", CONVERT_RSS, str(asc),
                                  str(tmp_path / f"c{rows}-{attempt}.zarr")], capture_output=True, text=True,
                                 check=True, env=env)
            runs.append(int(out.stdout.split()[-1]))
        peaks[rows] = min(runs)
    extra_bytes = (8192 - 2048) * 2048 * 4  # what the larger DEM adds as float32 (48 MiB); never held whole
    assert peaks[8192] - peaks[2048] < extra_bytes * 3 / 4, peaks
