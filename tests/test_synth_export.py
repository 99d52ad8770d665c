"""Synthetic terrain (deterministic, tile-independent, realistic features) and exports."""
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
    assert img.shape == (4,) + st.shape
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
