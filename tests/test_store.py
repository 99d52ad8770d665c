"""TerrainStore: on-disk z-order, tile iteration with halos, atomic results, plain readers."""
import numpy as np
import pytest
import zarr

from terrain_io.errors import StoreError
from terrain_io.store import TerrainStore, Window, check_result_name, read_plain_chunk
from references import blocks_written


def interleave(row, col):
    key = 0
    for bit in range(16):
        key |= ((row >> bit) & 1) << (2 * bit) | ((col >> bit) & 1) << (2 * bit + 1)
    return key


@pytest.fixture
def dem(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.normal(100, 20, (150, 230)).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = np.nan
    return TerrainStore.from_array(tmp_path / "dem.zarr", values, tile=16, shard=4), values


def test_shard_lays_its_tiles_in_morton_order_on_disk(dem):
    store, _ = dem
    s = store.shard_size
    shard_file = store.path / "elevation" / "c" / "0" / "0"
    raw = shard_file.read_bytes()
    # sharding_indexed, index at the end: (offset, nbytes) uint64 per chunk in C order, then crc32c
    index = np.frombuffer(raw[-(s * s * 16 + 4) : -4], dtype="<u8").reshape(s, s, 2)
    offsets = index[:, :, 0]
    by_offset = sorted(((int(offsets[r, c]), (r, c)) for r in range(s) for c in range(s)))
    disk_order = [rc for _, rc in by_offset]
    assert disk_order == sorted(disk_order, key=lambda rc: interleave(*rc))
    assert disk_order[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_tiles_come_in_global_morton_order_with_halos(dem):
    store, values = dem
    padded = np.pad(values, 1, constant_values=np.nan)
    seen = []
    for tile in store.tiles(halo=1):
        seen.append((tile.row, tile.col))
        expect = padded[tile.r0 : tile.r0 + tile.h + 2, tile.c0 : tile.c0 + tile.w + 2]
        assert tile.data.shape == (tile.h + 2, tile.w + 2)
        np.testing.assert_array_equal(tile.data, expect)
        np.testing.assert_array_equal(tile.interior, values[tile.r0 : tile.r0 + tile.h, tile.c0 : tile.c0 + tile.w])
    n_tr, n_tc = store.tile_grid
    assert sorted(seen) == [(r, c) for r in range(n_tr) for c in range(n_tc)]
    assert seen == sorted(seen, key=lambda rc: interleave(*rc))


def test_plain_zarr_and_xarray_see_a_2d_array(dem):
    store, values = dem
    arr = zarr.open_array(str(store.path / "elevation"), mode="r")
    assert arr.shape == values.shape
    np.testing.assert_array_equal(arr[:], values)
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(store.path, consolidated=False)
    assert ds["elevation"].dims == ("y", "x")
    np.testing.assert_array_equal(ds["elevation"].values, values)


def test_xarray_and_rioxarray_see_coordinates_crs_and_transform(tmp_path, sample_data):
    """Elevation and every result array open in xarray with cell-centre coordinates, CRS, transform."""
    xr = pytest.importorskip("xarray")
    rioxarray = pytest.importorskip("rioxarray")  # noqa: F841 -- registers the .rio accessor
    import rasterio

    from terrain_io.convert import convert

    src = sample_data / "topobathy_land.tif"
    store = TerrainStore.open(convert(src, tmp_path / "t.zarr", tile=32, shard=2).path)
    with store.write_result("sssp/demo") as w:
        w.create_array("distance", "float32", np.nan)[:] = 1.0
    with rasterio.open(src) as ref:
        ref_crs, ref_transform = ref.crs, ref.transform
        xs, ys = rasterio.transform.xy(ref.transform, [0, 5], [0, 7])  # cell centres, rasterio's own
    for group, var in ((None, "elevation"), ("sssp/demo", "distance")):
        ds = xr.open_zarr(store.path, group=group, consolidated=False, decode_coords="all")
        da = ds[var]
        assert da.rio.crs == ref_crs
        assert da.rio.transform() == ref_transform
        np.testing.assert_allclose([float(da.x[0]), float(da.x[7])], xs)
        np.testing.assert_allclose([float(da.y[0]), float(da.y[5])], ys)
    assert "sssp/demo/x" not in store.results() and "x" not in store.results()


def test_statistics_attributes(dem):
    store, values = dem
    assert store.attrs["valid_count"] == int(np.isfinite(values).sum())
    assert store.attrs["min"] == float(np.nanmin(values))
    assert store.attrs["max"] == float(np.nanmax(values))


def test_read_window_with_halo_pads_outside_with_nodata(dem):
    store, values = dem
    block = store.read(Window(0, 5, 225, 230), halo=2)
    assert block.shape == (9, 9)
    assert np.isnan(block[:2]).all() and np.isnan(block[:, -2:]).all()
    np.testing.assert_array_equal(block[2:, :7], values[0:7, 223:230])


def test_result_written_atomically_and_listed(dem):
    store, _ = dem
    with store.write_result("sssp/a", attrs={"source": [1, 2]}) as w:
        arr = w.create_array("distance", "float32", np.nan)
        arr[:] = 1.0
        assert not (store.path / "sssp" / "a").exists()  # invisible until complete
    assert (store.path / "sssp" / "a" / "distance" / "zarr.json").exists()
    results = TerrainStore.open(store.path).results()
    assert results["sssp/a/distance"]["shape"] == store.shape
    assert results["sssp/a"]["source"] == [1, 2]
    assert not list(store.path.parent.glob(".*partial*")) and not list(store.path.glob(".*partial*"))


def test_failed_result_leaves_old_result_untouched(dem):
    store, _ = dem
    with store.write_result("mst") as w:
        w.create_array("edges", "uint8", 0)[:] = 3
    with pytest.raises(KeyboardInterrupt):
        with store.write_result("mst") as w:
            w.create_array("edges", "uint8", 0)[:] = 7
            raise KeyboardInterrupt
    reopened = TerrainStore.open(store.path)
    assert (reopened.group["mst/edges"][:] == 3).all()
    assert not list(store.path.parent.glob(".*partial*")) and not list(store.path.glob(".*partial*"))


@pytest.mark.parametrize("name", ["../x", "a/../../b", ".hidden", "", "elevation", "a\\b"])
def test_result_names_cannot_escape_the_store(name):
    with pytest.raises(StoreError):
        check_result_name(name)


def test_open_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        TerrainStore.open(tmp_path / "nope.zarr")


@pytest.mark.parametrize("tile,shard", [(24, 4), (16, 3), (4, 2)])
def test_tiling_must_be_powers_of_two(tmp_path, tile, shard):
    with pytest.raises(StoreError):
        TerrainStore.create(tmp_path / "x.zarr", (10, 10), tile=tile, shard=shard)


def test_map_and_cell_coordinates_invert(tmp_path):
    st = TerrainStore.from_array(tmp_path / "g.zarr", np.zeros((40, 50), np.float32), tile=16, shard=2,
                                 attrs={"transform": [500.0, 2.0, 0.0, 900.0, 0.0, -3.0]})
    rows, cols = np.meshgrid(np.arange(40), np.arange(50), indexing="ij")
    x, y = st.cell_to_map(rows, cols)
    assert all(st.map_to_cell(float(a), float(b)) == (int(r), int(c))
               for a, b, r, c in zip(x.ravel()[::37], y.ravel()[::37], rows.ravel()[::37], cols.ravel()[::37]))


@pytest.mark.parametrize("compressed", [False, True])
def test_blocks_written_past_zarr_read_back_through_zarr(tmp_path, compressed):
    """write_block puts whole plain chunks straight into their files (edge chunks padded), the rest
    through zarr: zarr reads every cell a numpy copy has, and read_plain_chunk reads zarr's chunks."""
    arr, want, chunks = blocks_written(tmp_path, zarr.codecs.ZstdCodec() if compressed else None)
    for a in range(3):
        for b in range(2):
            out = np.empty(chunks, np.float32)
            if not read_plain_chunk(arr, (a, b, 0, 0), out):
                assert compressed
                continue
            edge = np.full(chunks, np.inf, np.float32)  # the part outside the array is the fill value
            part = want[4 * a : 4 * a + 4, 4 * b : 4 * b + 4]
            edge[: part.shape[0], : part.shape[1]] = part
            np.testing.assert_array_equal(out, edge)
