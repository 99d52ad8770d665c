"""The overviews' fast path (issue 32's 1.2x target): levels stored with a faster zstd level that their
metadata names (Zarr v3's zstd codec takes -131072..22), the base read halved chunk by chunk as it is
decoded (``read_shard(each=)``): the same cells as reading the shard and reducing it (numpy)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from references import overview_max, overview_mean, overview_mode, utm_store
from terrain_io.overviews import LEVEL_ZSTD, read_halved, write_overviews
from terrain_io.store import TerrainStore, Window, read_shard


def _values(shape, seed=3):
    rng = np.random.default_rng(seed)
    z = (rng.random(shape) * 300 + 100).astype(np.float32)
    z[rng.random(shape) < 0.1] = np.nan
    z[16:48, 0:32] = np.nan  # whole chunks of nodata: not stored
    return z


def test_levels_are_plain_zarr_at_the_codec_their_metadata_names(tmp_path):
    """Every level file against zarr itself writing the level's values with the codecs the level's
    zarr.json names (zstd at LEVEL_ZSTD, crc32c): the same bytes; and xarray reads them."""
    st = utm_store(tmp_path / "s.zarr", _values((150, 90)), tile=8, shard=4)
    assert write_overviews(st.path, ["elevation"]) == {"elevation": 5}
    assert LEVEL_ZSTD < 1  # faster than the store's own level 1 (benchmarks/RESULTS.md)
    below = _values((150, 90))
    for k in range(1, 6):
        folder = st.path / "overviews" / "elevation" / str(k) / "elevation"
        meta = json.loads((folder / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        assert inner[1] == {"name": "zstd", "configuration": {"level": LEVEL_ZSTD, "checksum": False}}
        got = zarr.open_array(str(folder), mode="r")[...]
        np.testing.assert_array_equal(got, overview_mean(below), err_msg=f"level {k}")
        ref = zarr.create_array(str(tmp_path / f"zarr{k}"), shape=got.shape, chunks=(8, 8), shards=(32, 32),
                                dtype="float32", fill_value=math.nan,
                                compressors=(ZstdCodec(level=LEVEL_ZSTD), Crc32cCodec()))
        ref[...] = got
        want = {p.relative_to(tmp_path / f"zarr{k}"): p.read_bytes() for p in (tmp_path / f"zarr{k}" / "c").rglob("*")
                if p.is_file()}
        ours = {p.relative_to(folder): p.read_bytes() for p in (folder / "c").rglob("*") if p.is_file()}
        assert ours == want, f"level {k}"
        below = got
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(st.path, group="overviews/elevation/2", consolidated=False)
    np.testing.assert_array_equal(ds["elevation"].values, overview_mean(overview_mean(_values((150, 90)))))


def test_read_shard_each_gives_every_stored_chunk(tmp_path):
    """Chunks given to ``each`` (whole shard and a window), laid over the fill value: read_shard's array."""
    z = _values((100, 70))
    st = utm_store(tmp_path / "s.zarr", z, tile=8, shard=4)
    arr = st.elevation
    given = {}
    for sr, sc, part in [(0, 0, None), (3, 2, None), (1, 1, Window(40, 60, 35, 50)), (0, 0, Window(16, 32, 0, 20))]:
        r0, c0 = (part.r0, part.c0) if part else (sr * 32, sc * 32)
        want = read_shard(arr, sr, sc, part)
        got = np.full(want.shape, np.nan, np.float32)
        seen = []

        def each(r, c, cells, got=got, r0=r0, c0=c0, seen=seen):
            seen.append((r, c))
            got[r - r0 : r - r0 + cells.shape[0], c - c0 : c - c0 + cells.shape[1]] = cells

        assert read_shard(arr, sr, sc, part, each=each) is None
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, z[r0 : r0 + want.shape[0], c0 : c0 + want.shape[1]])
        assert len(seen) == len(set(seen))
        given[sr, sc, part] = seen
    assert (0, 0) in given[0, 0, None] and (16, 0) not in given[0, 0, None]  # a chunk of nodata only: not stored
    assert given[0, 0, Window(16, 32, 0, 20)] == []


@pytest.mark.parametrize("dtype,fill,method", [("float32", math.nan, "average"), ("float64", math.nan, "max"),
                                               ("uint32", 0, "mode"), ("int16", 7, "average")])
def test_halved_read_is_the_reduction_of_the_shard(tmp_path, dtype, fill, method):
    """Each shard (interior, edge, odd sizes, missing chunks) halved as it is read, against numpy's
    reduction of the shard's cells; for an integer array whose fill value is a valid value too."""
    rng = np.random.default_rng(1)
    shape = (75, 45)
    st = utm_store(tmp_path / "s.zarr", _values(shape), tile=8, shard=4)
    if np.dtype(dtype).kind == "f":
        values = np.where(np.isnan(_values(shape)), np.nan, rng.random(shape) * 1e4).astype(dtype)
    else:
        values = rng.integers(0, 4, shape).astype(dtype)
        values[0:16, 8:24] = fill  # whole chunks of the fill value: not stored
    with st.write_result("r") as w:
        w.create_array("v", dtype, fill)[...] = values
    arr = TerrainStore.open(st.path, mode="r").group["r/v"]
    if dtype == "int16":  # the mean of integer cells, rounded half up (none is missing)
        def ref(a):
            b = np.pad(a.astype(np.float64), ((0, a.shape[0] % 2), (0, a.shape[1] % 2)), constant_values=np.nan)
            b = b.reshape(b.shape[0] // 2, 2, b.shape[1] // 2, 2)
            return np.floor(np.nanmean(b, axis=(1, 3)) + 0.5).astype(a.dtype)
    else:
        ref = {"average": overview_mean, "max": overview_max, "mode": lambda a: overview_mode(a, 0)}[method]
    missing = None if np.dtype(dtype).kind == "f" else 0 if method == "mode" else None
    for sr in range(3):
        for sc in range(2):
            cells = values[sr * 32 : sr * 32 + 32, sc * 32 : sc * 32 + 32]
            got = read_halved(arr, sr, sc, method, missing)
            want = ref(cells)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"shard {sr, sc}")
