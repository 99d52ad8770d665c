"""Synthetic terrain (deterministic, tile-independent, realistic features) and exports."""
import math

import numba
import numpy as np
import pytest
import rasterio

from terrain_io.convert import convert
from terrain_io.export import export
from terrain_io.store import TerrainStore
from terrain_io.synth import synth_array, synthesize


def test_synth_is_deterministic_and_independent_of_tiling(tmp_path):
    a = synthesize(tmp_path / "a.zarr", 300, cols=170, seed=5, nodata_fraction=0.2, tile=16, shard=2)
    b = synthesize(tmp_path / "b.zarr", 300, cols=170, seed=5, nodata_fraction=0.2, tile=64, shard=4)
    va, vb = a.elevation[:], b.elevation[:]
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(va, synth_array(300, 170, seed=5, nodata_fraction=0.2))
    c = synth_array(300, 170, seed=6, nodata_fraction=0.2)
    assert not np.array_equal(va, c, equal_nan=True)
    # a window is a crop of the whole: generation has no state across tiles
    np.testing.assert_array_equal(synth_array(40, 30, seed=5, nodata_fraction=0.2, r0=100, c0=77), va[100:140, 77:107])


# -- an independent reference: the generator's formula in plain Python (math module, no caches) --
_M = (1 << 64) - 1


def _ref_noise(x, y, seed):
    def grad(ix, iy, dx, dy):
        h = ((ix & _M) * 0x9E3779B97F4A7C15 & _M) ^ ((iy & _M) * 0xC2B2AE3D27D4EB4F & _M) ^ (seed * 0x165667B19E3779F9 & _M)
        h ^= h >> 29
        h = h * 0xBF58476D1CE4E5B9 & _M
        h ^= h >> 32
        angle = float(h >> 11) * (2.0 * math.pi / 9007199254740992.0)
        return math.cos(angle) * dx + math.sin(angle) * dy

    x0, y0 = math.floor(x), math.floor(y)
    fx, fy = x - x0, y - y0
    fade = lambda t: t * t * t * (t * (t * 6.0 - 15.0) + 10.0)  # noqa: E731
    n00, n10 = grad(x0, y0, fx, fy), grad(x0 + 1, y0, fx - 1.0, fy)
    n01, n11 = grad(x0, y0 + 1, fx, fy - 1.0), grad(x0 + 1, y0 + 1, fx - 1.0, fy - 1.0)
    u, v = fade(fx), fade(fy)
    a = n00 + u * (n10 - n00)
    b = n01 + u * (n11 - n01)
    return 1.4142 * (a + v * (b - a))


def _ref_holes(x, y, seed):
    return _ref_noise(x * 2.5 + 31.7, y * 2.5 - 12.9, seed + 401) + 0.5 * _ref_noise(x * 5.0, y * 5.0, seed + 402)


def _ref_threshold(seed, fraction, samples=1 << 16):
    vals = []
    for k in range(samples):
        h = _ref_hash_sample(k, seed + 999)
        vals.append(_ref_holes((h & 0xFFFFFF) / 16777216.0 * 997.0, ((h >> 24) & 0xFFFFFF) / 16777216.0 * 991.0, seed))
    vals.sort()
    return vals[min(int(fraction * samples), samples - 1)]


def _ref_hash_sample(k, seed):
    h = (k * 0x9E3779B97F4A7C15 & _M) ^ (7 * 0xC2B2AE3D27D4EB4F & _M) ^ (seed * 0x165667B19E3779F9 & _M)
    h ^= h >> 29
    h = h * 0xBF58476D1CE4E5B9 & _M
    return h ^ (h >> 32)


def _ref_cell(r, c, seed, threshold, period=1024.0, octaves=9):
    x, y = c / period, r / period
    fbm, amp, freq = 0.0, 1.0, 1.0
    for o in range(octaves):
        fbm += amp * _ref_noise(x * freq, y * freq, seed + o)
        amp *= 0.5
        freq *= 2.0
    ridge, amp, freq, weight = 0.0, 0.5, 1.0, 1.0
    for o in range(min(octaves, 6)):
        s = 1.0 - abs(_ref_noise(x * freq + 17.3, y * freq - 5.1, seed + 101 + o))
        s *= s * weight
        weight = min(max(s * 2.0, 0.0), 1.0)
        ridge += s * amp
        amp *= 0.5
        freq *= 2.1
    mountains = 0.5 + 0.5 * _ref_noise(x * 0.35 + 3.7, y * 0.35 + 1.3, seed + 211)
    z = 300.0 * fbm + 1800.0 * ridge * mountains * mountains + 30.0
    if _ref_noise(x * 1.5 - 9.1, y * 1.5 + 4.4, seed + 307) > 0.3:
        z = math.floor(z / 40.0) * 40.0
    z = max(z, 0.0)
    if _ref_holes(x, y, seed) < threshold:
        z = math.nan
    return np.float32(z)


@pytest.mark.parametrize("seed,fraction,r0,c0", [(0, 0.0, 0, 0), (3, 0.3, -50, 123457), (11, 0.2, 40000, 7)])
def test_synth_equals_its_formula_evaluated_cell_by_cell(seed, fraction, r0, c0):
    """Bit for bit the formula of the module docstring, computed afresh per cell in plain Python (the
    generator reuses lattice gradients along rows: that must change no bit)."""
    rows, cols = 70, 1500  # long rows: every octave crosses lattice cells many times
    got = synth_array(rows, cols, seed, fraction, r0=r0, c0=c0)
    threshold = _ref_threshold(seed, fraction) if fraction > 0 else -math.inf
    rng = np.random.default_rng(seed)
    cells = [(int(r), int(c)) for r, c in zip(rng.integers(0, rows, 400), rng.integers(0, cols, 400))]
    cells += [(rows - 1, c) for c in range(0, cols, 7)]  # one whole row, densely
    want = np.array([_ref_cell(r0 + r, c0 + c, seed, threshold) for r, c in cells], dtype=np.float32)
    have = np.array([got[r, c] for r, c in cells], dtype=np.float32)
    assert want.tobytes() == have.tobytes()
    if fraction > 0:
        assert np.isnan(have).any() and not np.isnan(have).all()


def test_synth_same_bytes_for_any_threads_writers_and_tiling(tmp_path):
    """Numba threads (1 vs all), writer threads (1 vs 4), tilings and a Dask scheduler: the same values,
    and the same shard files for the same tiling."""
    kw = dict(cols=333, seed=9, nodata_fraction=0.15)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = synth_array(300, 333, seed=9, nodata_fraction=0.15)
        a = synthesize(tmp_path / "a.zarr", 300, tile=32, shard=2, writers=1, **kw)
    finally:
        numba.set_num_threads(before)
    b = synthesize(tmp_path / "b.zarr", 300, tile=32, shard=2, writers=4, **kw)
    c = synthesize(tmp_path / "c.zarr", 300, tile=64, shard=4, writers=3, **kw)
    d = synthesize(tmp_path / "d.zarr", 300, tile=32, shard=2, scheduler="threads", **kw)
    for st in (a, b, c, d):
        assert st.elevation[:].tobytes() == one.tobytes()
    files = lambda st: {p.relative_to(st.path): p.read_bytes() for p in (st.path / "elevation").rglob("c/*/*")}  # noqa: E731
    written = sum(not np.isnan(one[r:r + 64, c:c + 64]).all() for r in range(0, 300, 64) for c in range(0, 333, 64))
    assert files(a) == files(b) == files(d) and len(files(a)) == written  # all-nodata shards: no file, as zarr
    assert a.group.attrs["valid_count"] == np.count_nonzero(~np.isnan(one))


def test_synth_has_ties_flats_relief_and_nodata():
    z = synth_array(1024, 1024, seed=2, nodata_fraction=0.25)
    valid = z[np.isfinite(z)]
    assert 0.05 < np.isnan(z).mean() < 0.6  # nodata regions, roughly the share asked for
    assert valid.max() - valid.min() > 300  # real relief
    values, counts = np.unique(valid, return_counts=True)
    assert counts.max() > 1000  # large flat areas with exact ties (sea level, terraces)
    eq_neighbours = np.mean(z[:, 1:] == z[:, :-1])
    assert 0.01 < eq_neighbours < 0.9


def test_synth_without_nodata_has_none():
    assert np.isfinite(synth_array(200, 200, seed=1)).all()


def test_ascii_export_reconverts_to_the_same_grid(tmp_path, sample_data):
    st = TerrainStore.open(convert(sample_data / "topobathy_land.tif", tmp_path / "t.zarr", tile=32, shard=2).path)
    export(st.path, "elevation", tmp_path / "t.asc", decimals=3)
    again = TerrainStore.open(convert(tmp_path / "t.asc", tmp_path / "t2.zarr", tile=16, shard=2).path)
    ref = st.elevation[:]
    np.testing.assert_allclose(again.elevation[:], ref, atol=5e-4, equal_nan=True)
    assert again.transform == pytest.approx(st.transform)


def test_png_picture_has_alpha_for_nodata(tmp_path, sample_data):
    st = TerrainStore.open(convert(sample_data / "topobathy_land.tif", tmp_path / "t.zarr", tile=32, shard=2).path)
    png = export(st.path, "elevation", tmp_path / "t.png")
    with rasterio.open(png) as ds:
        img = ds.read()
    assert img.shape[1] > st.shape[0] and img.shape[2] >= st.shape[1]  # the legend band below
    img = img[:, : st.shape[0], : st.shape[1]]  # the picture: a pixel a cell from the top-left corner
    np.testing.assert_array_equal(img[3] == 0, np.isnan(st.elevation[:]))
    assert img[:3].std() > 10  # not a blank picture


def test_export_refuses_unknown_suffix_and_array(tmp_path, sample_data):
    st = TerrainStore.open(convert(sample_data / "topobathy_land.tif", tmp_path / "t.zarr", tile=32, shard=2).path)
    with pytest.raises(Exception, match="unknown output type"):
        export(st.path, "elevation", tmp_path / "x.jpg")
    with pytest.raises(Exception, match="no array 'nope'"):
        export(st.path, "nope", tmp_path / "x.tif")
    assert not list(tmp_path.glob("x.*"))


def test_tiled_geotiff_converts_window_by_window(tmp_path):
    store = synthesize(tmp_path / "s.zarr", 300, cols=520, seed=4, nodata_fraction=0.2, tile=32, shard=2)
    tif = export(store.path, "elevation", tmp_path / "s.tif")
    with rasterio.open(tif) as ds:
        assert ds.block_shapes[0] == (256, 256)  # tiled, not striped
        ref = ds.read(1)
    again = TerrainStore.open(convert(tif, tmp_path / "again.zarr", tile=16, shard=4).path)
    np.testing.assert_array_equal(again.elevation[:], ref)
    np.testing.assert_array_equal(ref, store.elevation[:])
