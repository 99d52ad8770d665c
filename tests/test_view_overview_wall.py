"""Issue 32's 1.2x target in wall time: level shards written piece by piece while the base is read, levels
stored without compression, and the fixed costs of every result (its groups, the seal) -- each against
zarr's own bytes, the manifests against the files on disk, and damage still found."""
from __future__ import annotations

import hashlib
import json
import math
import os
import random

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from references import utm_store
from terrain_io.errors import DamagedStoreError
from terrain_io.integrity import verify
from terrain_io.overviews import _ShardStream
from terrain_io.store import (TerrainStore, Window, array_handle, encode_chunks, read_shard, tiled_array_metadata,
                              write_node)


def _values(shape, seed=5):
    rng = np.random.default_rng(seed)
    z = (rng.random(shape) * 300).astype(np.float32)
    z[rng.random(shape) < 0.05] = np.nan
    z[0:8, 8:16] = np.nan  # a whole chunk of nodata: not stored
    return z


def _zarr_files(folder, values, level):
    """The chunk files zarr writes for ``values`` with the level's codecs (tile 8, shard 4)."""
    zstd = () if level is None else (ZstdCodec(level=level),)
    ref = zarr.create_array(str(folder), shape=values.shape, chunks=(8, 8), shards=(32, 32), dtype="float32",
                            fill_value=math.nan, compressors=(*zstd, Crc32cCodec()))
    ref[...] = values
    return {p.relative_to(folder): p.read_bytes() for p in (folder / "c").rglob("*") if p.is_file()}


@pytest.mark.parametrize("level", [None, -5])
@pytest.mark.parametrize("order", ["morton", "shuffled"])
def test_streamed_shard_is_the_file_zarr_writes(tmp_path, level, order):
    """A level's shards written from pieces of whole chunks (quarters of a shard, as base shards give
    them; edge shards clipped; pieces in Morton order or any order): zarr's files, byte for byte."""
    values = _values((56, 40))
    meta = tiled_array_metadata(values.shape, "float32", 8, 4, math.nan, {}, level)
    write_node(tmp_path / "ours" / "a", meta)
    arr = array_handle(tmp_path / "ours", "a", meta)
    rng = random.Random(1)
    for sr in range(2):
        for sc in range(2):
            block = values[sr * 32 : sr * 32 + 32, sc * 32 : sc * 32 + 32]
            pieces = [(i, j) for i in (0, 2) for j in (0, 2) if i * 8 < block.shape[0] and j * 8 < block.shape[1]]
            pieces.sort(key=lambda p: (p[1] // 2) * 2 + p[0] // 2)  # Morton: the first axis varies fastest
            if order == "shuffled":
                rng.shuffle(pieces)
            stream = _ShardStream(arr, sr, sc)
            for i, j in pieces:
                stream.add(encode_chunks(arr, block[i * 8 : i * 8 + 16, j * 8 : j * 8 + 16], (i, j)))
            stream.close()
    ours = {p.relative_to(tmp_path / "ours" / "a"): p.read_bytes()
            for p in (tmp_path / "ours" / "a" / "c").rglob("*") if p.is_file()}
    assert ours == _zarr_files(tmp_path / "zarr", values, level)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ours" / "a"), mode="r")[...], values)


def test_raw_level_chunks_are_read_checked_and_verified(tmp_path):
    """Chunks stored as their bytes (+ crc32c): read_shard (whole, a window, chunk by chunk) gives the
    values zarr gives; a flipped bit is damage to read_shard and to verify."""
    values = _values((56, 40))
    st = utm_store(tmp_path / "s.zarr", values, tile=8, shard=4)
    meta = tiled_array_metadata(values.shape, "float32", 8, 4, math.nan, {}, None)
    with st.write_result("r") as w:
        root = w.group.store.root
        write_node(os.path.join(root, "v"), meta)
        arr = array_handle(root, "v", meta)
        for sr in range(2):
            for sc in range(2):
                stream = _ShardStream(arr, sr, sc)
                stream.add(encode_chunks(arr, values[sr * 32 : sr * 32 + 32, sc * 32 : sc * 32 + 32]))
                stream.close()
    arr = TerrainStore.open(st.path, mode="r").group["r/v"]
    assert np.array_equal(zarr.open_array(str(st.path / "r" / "v"), mode="r")[...], values, equal_nan=True)
    np.testing.assert_array_equal(read_shard(arr, 1, 0), values[32:56, 0:32])
    np.testing.assert_array_equal(read_shard(arr, 0, 1, Window(3, 20, 35, 40)), values[3:20, 35:40])
    got = np.full((32, 32), np.nan, np.float32)

    def each(r, c, cells):
        got[r : r + cells.shape[0], c : c + cells.shape[1]] = cells

    read_shard(arr, 0, 0, each=each)
    np.testing.assert_array_equal(got, values[:32, :32])
    assert verify(st.path).sound
    shard = st.path / "r" / "v" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1  # inside the first chunk's cells
    shard.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError, match="checksum"):
        read_shard(TerrainStore.open(st.path, mode="r").group["r/v"], 0, 0)
    assert not verify(st.path).sound


def test_result_groups_and_manifests_as_before(tmp_path):
    """A result with parent groups: their zarr.json and the staged group's are zarr's bytes; every
    array's manifest lists exactly its chunk files on disk with their sizes, and the digest of every
    node's metadata (sha256 of its JSON, keys sorted, computed here); the store sees the result."""
    values = _values((40, 40))
    st = utm_store(tmp_path / "s.zarr", values, tile=8, shard=4)
    with st.write_result("a/b/c", attrs={"k": [1.5, "x"]}) as w:
        w.create_array("v", "float32", math.nan)[...] = values
    assert "a/b/c/v" in st.results()  # the store opened again on first use
    np.testing.assert_array_equal(st.read(Window(0, 40, 0, 40), "a/b/c/v"), values)
    ref = zarr.open_group(str(tmp_path / "ref"), mode="w-",
                          attributes={"k": [1.5, "x"], "generation": st.attrs["generation"]})
    ref.require_group("p")
    assert (st.path / "a/b/c/zarr.json").read_bytes() == (tmp_path / "ref" / "zarr.json").read_bytes()
    for parent in ("a", "a/b"):
        assert (st.path / parent / "zarr.json").read_bytes() == (tmp_path / "ref" / "p" / "zarr.json").read_bytes()
    tree = st.path / "a" / "b" / "c"
    nodes = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != "c"]
        if "zarr.json" in filenames:
            meta = json.loads(open(os.path.join(dirpath, "zarr.json"), "rb").read())
            rel = os.path.relpath(dirpath, tree).replace(os.sep, "/")
            nodes["" if rel == "." else rel] = hashlib.sha256(
                json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    arrays = [n for n in nodes if n and json.loads((tree / n / "zarr.json").read_text())["node_type"] == "array"]
    assert sorted(arrays) == ["spatial_ref", "v", "x", "y"]
    for name in arrays:
        folder = tree / name
        files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.glob("c/**/*") if p.is_file()}
        manifest = json.loads((folder / "terrain-manifest.json").read_text())
        assert manifest == {"chunks": files, "tree": "..", "nodes": nodes}, name
    assert verify(st.path).sound
