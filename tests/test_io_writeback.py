"""A stored shard starts its write-out to the disk as soon as it is written (issue 31: a command left
its files dirty for the kernel to flush 30 s later, in the middle of the next command), scratch that
is written again does not; the shard's bytes are what they were (zarr reads them)."""
import os
import sys

import numpy as np
import pytest
import zarr

from terrain_io import store as store_mod
from terrain_io.store import TerrainStore, overwrite_file, write_shard


@pytest.fixture
def started(monkeypatch):
    """The ranges whose write-out was started: (path (the fd resolved through /proc), offset, bytes)."""
    paths = []

    def record(fd, offset, nbytes, flags):
        assert flags == 2  # SYNC_FILE_RANGE_WRITE: started, not waited for
        paths.append((os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")), offset, nbytes))
        return 0

    monkeypatch.setattr(store_mod, "_sync_file_range", lambda: record)
    return paths


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_each_stored_shard_starts_its_writeback_and_scratch_does_not(tmp_path, started):
    values = np.arange(100 * 90, dtype=np.float32).reshape(100, 90)
    st = TerrainStore.from_array(tmp_path / "s.zarr", values, tile=16, shard=2)
    started.clear()
    with st.write_result("r") as writer:
        arr = writer.create_array("v", np.float32, float("nan"))
        for win in st.shards():
            write_shard(arr, win.r0 // 32, win.c0 // 32, values[win.slices])
    store_mod._writeback_done()  # (the calls are made by a background thread)
    folder = tmp_path / "s.zarr" / "r" / "v" / "c"
    sizes = {os.path.realpath(p).replace(os.path.realpath(folder), ""): p.stat().st_size
             for p in folder.rglob("*") if p.is_file()}
    assert len(sizes) == len(list(st.shards()))
    covered = {}  # each file's ranges, from its start on without a gap (0 bytes: to its end)
    for path, offset, nbytes in started:  # (written under the result's temporary name, renamed when complete)
        name = path[path.index("/v/c/") + 4:]
        assert offset == covered.get(name, 0)
        covered[name] = sizes[name] if nbytes == 0 else offset + nbytes
    assert covered == sizes
    started.clear()
    overwrite_file(tmp_path / "scratch.bin", [b"x" * 100])
    store_mod._writeback_done()
    assert started == []
    assert np.array_equal(zarr.open_array(tmp_path / "s.zarr" / "r" / "v", mode="r")[...], values)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_real_call_is_found_and_harmless(tmp_path):
    assert store_mod._sync_file_range() is not None
    overwrite_file(tmp_path / "f.bin", [b"abc", b"def"], writeback=True)
    store_mod._writeback_done()
    assert (tmp_path / "f.bin").read_bytes() == b"abcdef"
    assert store_mod._WRITEBACK[1].empty()  # the call was made (on its own copy of the descriptor)
