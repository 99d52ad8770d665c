"""``read_shard`` into a caller's array fills only the cells of chunks that are not stored (issue 31: no
pass of fill value over the whole window first): every cell of ``out`` is set, stored chunks to their
values, absent ones to the fill value -- against plain zarr's read of the same files."""
import numpy as np
import zarr

from terrain_io.store import TerrainStore, Window, read_shard, write_shard


def test_every_cell_of_out_is_set_whole_shards_and_windows(tmp_path):
    rng = np.random.default_rng(0)
    shape = (203, 150)  # tile 16, shard 4: the last shard row and column cut inside a chunk
    values = rng.normal(size=shape).astype(np.float32)
    values[:40, :50] = np.nan  # chunks all of fill value, not stored, beside stored ones in a shard
    values[100:140, 60:] = np.nan
    st = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(shape, np.float32), tile=16, shard=4)
    with st.write_result("r") as writer:
        arr = writer.create_array("v", np.float32, float("nan"))
        for win in st.shards():
            write_shard(arr, win.r0 // 64, win.c0 // 64, values[win.slices])
    plain = zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r")[...]
    assert np.array_equal(plain, values, equal_nan=True)
    arr = TerrainStore.open(tmp_path / "s.zarr", mode="r").group["r/v"]
    for win in st.shards():
        sr, sc = win.r0 // 64, win.c0 // 64
        got = read_shard(arr, sr, sc, out=np.full(win.shape, 7, np.float32))  # 7: a cell never set
        assert np.array_equal(got, plain[win.slices], equal_nan=True), win
        for _ in range(10):
            r0 = int(rng.integers(win.r0, win.r1))
            r1 = int(rng.integers(r0 + 1, win.r1 + 1))
            c0 = int(rng.integers(win.c0, win.c1))
            c1 = int(rng.integers(c0 + 1, win.c1 + 1))
            got = read_shard(arr, sr, sc, part=Window(r0, r1, c0, c1), out=np.full((r1 - r0, c1 - c0), 7, np.float32))
            assert np.array_equal(got, plain[r0:r1, c0:c1], equal_nan=True), (r0, r1, c0, c1)
