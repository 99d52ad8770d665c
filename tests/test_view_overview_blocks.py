"""Overviews read in blocks smaller than a shard (issue 32's 1.2x target: a store of few shards keeps both
threads busy to its last read): a block halved as it is read is numpy's reduction of its cells, a pyramid
made of blocks has the bytes of one made of whole shards, and a window of a shard read in one piece is
the window of the whole shard."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

import terrain_io.overviews as ov
from references import overview_mean, overview_mode, utm_store
from test_view_overview_speed import _values  # (nodata cells, and whole chunks of them)
from terrain_io.store import TerrainStore, Window, read_shard


def _tree(root):
    """The pyramids' files but their manifests and groups' zarr.json (which name each store's own
    elevation manifest, different in each store)."""
    tree = {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
            if f.is_file() and f.name != "terrain-manifest.json"}
    return {k: v for k, v in tree.items() if k not in ("elevation/zarr.json", "fill/depression/zarr.json")}


def test_block_side_splits_few_shards_only():
    assert ov._block_side((2, 2), 2048, 256, 2) == 1024  # 4 shards on 2 threads: 16 blocks
    assert ov._block_side((1, 1), 2048, 256, 2) == 512  # stops at 2 tiles a side
    assert ov._block_side((16, 16), 2048, 256, 16) == 2048  # the H100's 32768^2: whole shards
    assert ov._block_side((3, 2), 32, 8, 2) == 16
    assert ov._block_side((1, 1), 6 * 256, 256, 2) == 6 * 256  # (a shard of 6 tiles: left whole)


@pytest.mark.parametrize("method", ["average", "mode"])
def test_halved_block_is_the_reduction_of_its_cells(tmp_path, method):
    """Each quarter of each shard (interior, at the odd edges, of missing chunks) halved as it is read."""
    shape = (75, 45)
    z = _values(shape)
    values = z if method == "average" else np.where(np.isnan(z), 0, z % 4).astype(np.uint32)
    st = utm_store(tmp_path / "s.zarr", z, tile=8, shard=4)
    with st.write_result("r") as w:
        w.create_array("v", values.dtype, math.nan if method == "average" else 0)[...] = values
    arr = TerrainStore.open(st.path, mode="r").group["r/v"]
    ref = overview_mean if method == "average" else (lambda a: overview_mode(a, 0))
    for sr in range(3):
        for sc in range(2):
            for r0 in range(sr * 32, min(sr * 32 + 32, shape[0]), 16):
                for c0 in range(sc * 32, min(sc * 32 + 32, shape[1]), 16):
                    part = Window(r0, min(r0 + 16, shape[0]), c0, min(c0 + 16, shape[1]))
                    got = ov.read_halved(arr, sr, sc, method, None if method == "average" else 0, part)
                    want = ref(values[part.slices])
                    assert got.dtype == want.dtype and got.shape == want.shape, part
                    np.testing.assert_array_equal(got, want, err_msg=str(part))


def test_pyramid_of_blocks_is_the_pyramid_of_shards(tmp_path, monkeypatch):
    """Blocks of a quarter and a sixteenth of a shard against whole shards, file for file (the level
    shards, their zarr.json, the coordinates), at odd sizes; and the levels against numpy's reductions
    of the level below."""
    z = _values((150, 90))
    trees = {}
    for split in (1, 2, 4):
        st = utm_store(tmp_path / f"s{split}.zarr", z, tile=8, shard=8)
        with st.write_result("fill") as w:
            w.create_array("depression", "uint32", 0)[...] = np.where(np.isnan(z), 0, z % 5).astype(np.uint32)
        monkeypatch.setattr(ov, "_block_side", lambda grid, side, tile, threads, split=split: side // split)
        assert ov.write_overviews(st.path, ["elevation", "fill/depression"]) == {"elevation": 5, "fill/depression": 5}
        trees[split] = _tree(st.path / "overviews")
    assert len(trees[1]) > 40 and trees[2] == trees[1] and trees[4] == trees[1]
    pytest.importorskip("dask")  # and blocks on Dask's threads
    shutil.rmtree(tmp_path / "s2.zarr" / "overviews")
    monkeypatch.setattr(ov, "_block_side", lambda grid, side, tile, threads: side // 2)
    ov.write_overviews(tmp_path / "s2.zarr", ["elevation", "fill/depression"], scheduler="threads")
    assert _tree(tmp_path / "s2.zarr" / "overviews") == trees[1]
    group = TerrainStore.open(tmp_path / "s2.zarr", mode="r").group
    below = z
    for k in range(1, 6):
        got = group[f"overviews/elevation/{k}/elevation"][...]
        np.testing.assert_array_equal(got, overview_mean(below), err_msg=f"level {k}")
        below = got


def test_window_read_in_one_piece_is_the_shard_window(tmp_path):
    """A window of whole chunks (a quadrant: one run of the file) and a window of scattered chunks
    (a row: read chunk by chunk) against the whole shard."""
    z = _values((64, 64))
    st = utm_store(tmp_path / "s.zarr", z, tile=8, shard=8)
    arr = TerrainStore.open(st.path, mode="r").elevation
    whole = read_shard(arr, 0, 0)
    for part in (Window(32, 64, 0, 32), Window(0, 32, 32, 64), Window(8, 13, 0, 64), Window(3, 61, 5, 59)):
        np.testing.assert_array_equal(read_shard(arr, 0, 0, part), whole[part.slices], err_msg=str(part))


def test_seal_ahead_then_seal_is_the_seal(tmp_path):
    """The coordinates sealed while a level is still written, the rest once it is: every manifest as
    one seal of the finished tree writes it."""
    import zarr

    from terrain_io import integrity

    def tree(root):
        group = zarr.open_group(str(root), mode="w")
        group.create_group("1").create_array("x", shape=(40,), chunks=(8,), dtype="float64")[...] = np.arange(40.0)
        return group["1"].create_array("elevation", shape=(16, 16), chunks=(8, 8), dtype="float32", fill_value=0)

    ahead = tree(tmp_path / "a")
    ahead[:8, :8] = 1.0  # one chunk written when the coordinates are sealed
    sealed = integrity.seal_ahead(tmp_path / "a", lambda rel: rel != "1/elevation")
    assert sealed.done == {"1/x"} and (tmp_path / "a/1/x" / integrity.MANIFEST).is_file()
    assert not (tmp_path / "a/1/elevation" / integrity.MANIFEST).exists()
    ahead[8:, :] = 2.0  # the rest of the level after
    integrity.seal(tmp_path / "a", staged=True, ahead=sealed)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for m in (tmp_path / "b").rglob(integrity.MANIFEST):
        m.unlink()
    integrity.seal(tmp_path / "b")
    for m in (tmp_path / "b").rglob(integrity.MANIFEST):
        assert (tmp_path / "a" / m.relative_to(tmp_path / "b")).read_bytes() == m.read_bytes(), m
    assert len(list((tmp_path / "b").rglob(integrity.MANIFEST))) == 2


def test_checksums_are_google_crc32c_and_leave_the_gil_to_other_threads():
    """integrity.crc32c against google_crc32c's own value on both sides of the size where it stops
    holding the GIL; and a Python thread runs while a large buffer is checksummed (the extension
    module holds the GIL: a second reader thread waited)."""
    import sys
    import threading
    import time

    import google_crc32c

    from terrain_io import integrity

    for n in (0, 10, (1 << 16) - 1, 1 << 16, (1 << 20) + 3):
        b = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
        for data in (b, b.tobytes(), b[: n // 2], b.view(np.int8)):
            assert integrity.crc32c(data) == np.uint32(google_crc32c.value(bytes(data))).astype("<u4").tobytes()
    big = np.random.default_rng(1).random(1 << 26).astype(np.float32)  # 256 MB: tens of ms

    def ran_inside(fn) -> bool:
        """Whether another Python thread ran in the first half of ``fn``'s C call: a call that
        holds the GIL lets no other Python code run until it ends (or, as the extension does with
        an array, until it has copied it), however loaded the machine (a rate of spins would
        depend on the load)."""
        stop, stamps = [], []

        def spin():
            last = 0.0
            while not stop:
                now = time.perf_counter()
                if now - last > 0.0005:
                    stamps.append(now)
                    last = now

        thread = threading.Thread(target=spin)
        thread.start()
        time.sleep(0.02)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        stop.append(1)
        thread.join()
        return any(t0 + 0.1 * (t1 - t0) < t < t0 + 0.5 * (t1 - t0) for t in stamps)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        assert ran_inside(lambda: time.sleep(0.05))  # the harness sees a thread that runs
        assert ran_inside(lambda: integrity.crc32c(big))
    finally:
        sys.setswitchinterval(interval)
