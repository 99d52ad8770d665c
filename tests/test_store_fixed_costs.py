"""The store's fixed costs around a shard write and read (issue 31's bench_io target): a result's array
and coordinate metadata written as files (checked against zarr-python's own create_array and coordinate
writes, the reference: file for file, byte for byte), result arrays looked up once a store, and a shard
file's index read before the kernel is asked to read its body ahead."""
import os

import numpy as np
import pytest
import zarr

from references import zarr_coordinates, zarr_tiled_array
from terrain_io import store as store_mod
from terrain_io.errors import StoreError
from terrain_io.store import TerrainStore, Window, fill_value_for, write_shard

SHAPE = (300, 170)  # 2 x 2 shards of 128^2 (32^2 tiles), the last ones partial
GEO = {"transform": [500000.0, 10.0, 0.0, 4000000.0, 0.0, -10.0], "crs": "EPSG:32633"}


def files_of(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dtype, fill, attrs", [("float32", float("nan"), {"units": "m"}),
                                                ("float64", float("nan"), None),
                                                ("uint8", 255, {"codes": [1, 2, 4, 8]}),
                                                ("uint64", 0, None), ("bool", False, None)])
def test_result_metadata_is_zarrs_own(tmp_path, dtype, fill, attrs):
    """A result made by ResultWriter.create_array holds the files zarr-python writes for the same group
    (its own create_array and coordinate arrays), manifests included, and opens in plain zarr."""
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4,
                                    attrs=GEO)
    with store.write_result("ours") as writer:
        writer.create_array("v", dtype, fill, attrs)
        writer.create_array("w", "uint32", 0)
    with store.write_result("ref") as writer:  # through zarr-python's API
        zarr_coordinates(writer.group, store.shape, store.transform, store.crs)
        for name, dt, fv, at in (("v", dtype, fill, attrs), ("w", "uint32", 0, None)):
            zarr_tiled_array(writer.group, name, SHAPE, dt, 32, 4, fv, at)
    ours, ref = files_of(tmp_path / "s.zarr" / "ours"), files_of(tmp_path / "s.zarr" / "ref")
    assert ours.keys() == ref.keys() and "v/zarr.json" in ours and "x/c/0" in ours
    assert {k for k in ours if ours[k] != ref[k]} == set()
    arr = zarr.open_group(tmp_path / "s.zarr", mode="r")["ours/v"]
    assert arr.dtype == np.dtype(dtype) and arr.shape == SHAPE and arr.attrs.get("units") == (attrs or {}).get("units")


@pytest.mark.parametrize("dtype, nodata", [("float32", None), ("int16", -9999), ("uint8", 0)])
def test_a_new_stores_files_are_zarrs_own(tmp_path, dtype, nodata):
    """A new store (TerrainStore.create: convert's, synth's) holds the files zarr-python writes for the
    same group, elevation array and coordinates through its own API, byte for byte."""
    store = TerrainStore.create(tmp_path / "ours.zarr", SHAPE, dtype, tile=32, shard=4, nodata=nodata, attrs=GEO)
    ref = zarr.open_group(str(tmp_path / "ref.zarr"), mode="w-")
    ref.attrs.update(dict(store.attrs))  # (its creation time and generation: this store's)
    zarr_tiled_array(ref, "elevation", SHAPE, dtype, 32, 4, store.elevation.fill_value)
    zarr_coordinates(ref, SHAPE, store.transform, store.crs)
    ours, want = files_of(tmp_path / "ours.zarr"), files_of(tmp_path / "ref.zarr")
    assert ours.keys() == want.keys() and "elevation/zarr.json" in ours and "x/c/0" in ours
    assert {k for k in ours if ours[k] != want[k]} == set()
    with pytest.raises(StoreError, match="exists"):
        TerrainStore.create(tmp_path / "ours.zarr", SHAPE, dtype)


def test_result_attributes_are_zarrs_group_written_once_without_a_rename(tmp_path, monkeypatch):
    """A result's attributes (set and updated while it is written) end in its group's zarr.json as
    zarr-python writes the same group, and never through a rename over that file: zarr's own
    attrs.update replaces it by a rename, which ext4 makes wait for the shard data still being
    written out (the GPU SSSP's 0.40 s, benchmarks/RESULTS.md, session 20)."""
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4, attrs=GEO)
    replaced = []
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        replaced.append(os.fspath(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with store.write_result("ours", attrs={"weight_model": "max"}) as writer:
        writer.create_array("v", "float32", float("nan"))
        writer.attrs.update({"reached": 12, "max_distance": 3.5, "timings": {"read": 0.1}})
        writer.attrs["table"] = {"a": [1, 2]}
        writer.attrs["reached"] = 13
    assert [p for p in replaced if p.endswith("zarr.json")] == []
    monkeypatch.setattr(os, "replace", real_replace)
    ref = zarr.open_group(tmp_path / "ref", mode="w-",
                          attributes={"weight_model": "max", "generation": store.attrs["generation"]})
    ref.attrs.update({"reached": 12, "max_distance": 3.5, "timings": {"read": 0.1}})
    ref.attrs["table"] = {"a": [1, 2]}
    ref.attrs["reached"] = 13
    ours = (tmp_path / "s.zarr" / "ours" / "zarr.json").read_bytes()
    assert ours == (tmp_path / "ref" / "zarr.json").read_bytes()
    assert dict(zarr.open_group(tmp_path / "s.zarr", mode="r")["ours"].attrs)["reached"] == 13


def test_attributes_after_a_seal_ahead_are_refused(tmp_path):
    """A result sealed ahead (its nodes' digests taken, as the overviews do) that then changed its
    attributes would verify as damaged: refused, and the store keeps no result."""
    from terrain_io import integrity

    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    with pytest.raises(RuntimeError, match="sealed ahead"), store.write_result("r") as writer:
        writer.create_array("v", "float32", float("nan"))
        writer.sealed = integrity.seal_ahead(writer.group.store.root, lambda rel: False)
        writer.attrs["late"] = 1
    assert "r" not in store.results()


def test_an_array_made_twice_is_refused(tmp_path):
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    with pytest.raises(StoreError, match="already"), store.write_result("r") as writer:
        writer.create_array("v", "float32", float("nan"))
        writer.create_array("v", "uint8", 0)
    assert "r" not in store.results()


def write(store, values):
    with store.write_result("r") as writer:
        arr = writer.create_array("v", values.dtype, fill_value_for(values.dtype, None))
        for win in store.shards():
            write_shard(arr, win.r0 // arr.shards[0], win.c0 // arr.shards[1], values[win.slices])


def test_a_result_written_again_is_read_anew(tmp_path):
    """The store's array looked up once is looked up again once the store writes that result anew
    (other dtype, other values)."""
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    whole = Window(0, SHAPE[0], 0, SHAPE[1])
    first = np.arange(SHAPE[0] * SHAPE[1], dtype="float32").reshape(SHAPE)
    write(store, first)
    assert np.array_equal(store.read(whole, "r/v"), first)
    assert np.array_equal(store.read(Window(0, 128, 0, 128), "r/v"), first[:128, :128])
    again = (first % 7).astype("uint8")
    write(store, again)
    got = store.read(Window(0, 128, 0, 128), "r/v")
    assert got.dtype == np.uint8 and np.array_equal(got, again[:128, :128])
    assert np.array_equal(store.read(whole, "r/v"), again)


def test_a_result_written_again_by_another_handle_is_read_anew(tmp_path):
    """A reader's array looked up once is looked up again once another handle (another process, as
    ``terrain flow --weights --overwrite`` beside a long-lived reader) writes that result anew: its
    zarr.json is then another file (written under a temporary name and renamed)."""
    reader = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    part = Window(0, 128, 0, 128)
    first = np.arange(SHAPE[0] * SHAPE[1], dtype="uint32").reshape(SHAPE)
    write(reader, first)
    assert np.array_equal(reader.read(part, "r/v"), first[:128, :128])
    again = first.astype("float32") / 2
    write(TerrainStore.open(tmp_path / "s.zarr"), again)
    got = reader.read(part, "r/v")
    assert got.dtype == np.float32 and np.array_equal(got, again[:128, :128])


def test_the_index_is_read_before_the_body_is_read_ahead(tmp_path, monkeypatch):
    """A whole shard's read asks the kernel for its index (the file's tail) first, reads it, then asks
    for the body's readahead: asked together, the index waited behind the whole file's readahead."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise here")
    store = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    values = np.random.default_rng(3).normal(size=SHAPE).astype("float32")
    write(store, values)
    arr = TerrainStore.open(tmp_path / "s.zarr", mode="r").group["r/v"]
    length = os.path.getsize(tmp_path / "s.zarr" / "r" / "v" / "c" / "0" / "0")
    body = length - 4 * 4 * 16 - 4  # 4 x 4 chunks of (offset, size) and the index's crc32c
    calls = []
    pread, fadvise = os.pread, os.posix_fadvise
    monkeypatch.setattr(os, "pread", lambda fd, n, at: calls.append(("pread", at, n)) or pread(fd, n, at))
    monkeypatch.setattr(os, "posix_fadvise",
                        lambda fd, at, n, advice: calls.append(("fadvise", at, n)) or fadvise(fd, at, n, advice))
    got = store_mod.read_shard(arr, 0, 0)
    assert np.array_equal(got, values[:128, :128])
    calls = [c for c in calls if c != ("fadvise", 0, 0)]  # (the store's metadata read ahead: whole files)
    assert calls[:3] == [("fadvise", body, length - body), ("pread", body, length - body), ("fadvise", 0, body)]


def test_parallel_first_reads_check_the_stores_metadata_once(tmp_path, monkeypatch):
    """The first reads of an array's shards from many threads: one of them checks the trees (the others
    wait for it), the metadata it reads asked of the kernel at once beforehand -- every node's zarr.json
    and manifest of the store and of the result."""
    import concurrent.futures
    import threading
    import time

    from terrain_io import integrity

    if not (hasattr(os, "posix_fadvise") and os.path.isdir("/proc/self/fd")):
        pytest.skip("no posix_fadvise or /proc here")
    base = TerrainStore.from_array(tmp_path / "s.zarr", np.zeros(SHAPE, "float32"), tile=32, shard=4)
    values = np.random.default_rng(5).normal(size=SHAPE).astype("float32")
    write(base, values)
    checks, asked = [], set()
    check_trees, fadvise = integrity.Integrity.check_trees, os.posix_fadvise

    def slow_check(self, name):
        checks.append(name)
        time.sleep(0.05)  # (the other threads arrive meanwhile)
        return check_trees(self, name)

    def recording(fd, at, n, advice):
        if (at, n) == (0, 0):
            asked.add(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path / "s.zarr"))
        return fadvise(fd, at, n, advice)

    monkeypatch.setattr(integrity.Integrity, "check_trees", slow_check)
    monkeypatch.setattr(os, "posix_fadvise", recording)
    store = TerrainStore.open(tmp_path / "s.zarr", mode="r")
    out = np.empty(SHAPE, "float32")
    wins = list(store.shards())
    start = threading.Barrier(len(wins))

    def one(win):
        start.wait()
        store.read(win, "r/v", out=out[win.slices])

    with concurrent.futures.ThreadPoolExecutor(len(wins)) as pool:
        list(pool.map(one, wins))
    assert np.array_equal(out, values) and checks == ["r/v"]
    nodes = ("", "elevation", "x", "y", "spatial_ref", "r", "r/v", "r/x", "r/y", "r/spatial_ref")
    assert {os.path.join(n, "zarr.json") for n in nodes} <= asked
    assert {os.path.join(n, integrity.MANIFEST) for n in nodes if n not in ("", "r")} <= asked
