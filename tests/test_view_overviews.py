"""Overviews written without zarr's event loop (terrain_io.overviews, issue 32): the levels' nodes are
the bytes zarr writes, every level of a store with many shards and levels is the reduction of the
level below (numpy), and ``--overviews`` gives a result its pyramid when the command writes it."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

from references import (check_cog_layout, overview_max, overview_mean, overview_mode, utm_store, zarr_coordinates,
                        zarr_tiled_array)
from terrain_io.overviews import write_overviews
from terrain_io.store import TerrainStore, tiled_array_metadata, write_coordinate_files, write_node

UTM_T = (500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("dtype,fill", [("float32", math.nan), ("float64", -math.inf), ("int16", -32768),
                                        ("uint8", 255), ("uint64", 0), ("int32", 7)])
def test_level_nodes_are_the_bytes_zarr_writes(tmp_path, dtype, fill):
    """A level's array metadata and coordinates, written as files, against zarr writing the same nodes."""
    ref = zarr.open_group(str(tmp_path / "zarr"), mode="w")
    zarr_tiled_array(ref, "a", (300, 41), np.dtype(dtype), 16, 4, fill, {"level": 2, "units": "m"})
    zarr_coordinates(ref, (300, 41), UTM_T, "PROJCS[...]")
    ours = tmp_path / "ours"
    write_node(ours / "a", tiled_array_metadata((300, 41), np.dtype(dtype), 16, 4, fill, {"level": 2, "units": "m"}))
    write_coordinate_files(ours, (300, 41), UTM_T, "PROJCS[...]")
    want = {k: v for k, v in _tree(tmp_path / "zarr").items() if k != "zarr.json"}
    assert _tree(ours) == want


def test_coordinates_of_several_chunks_are_the_bytes_zarr_writes(tmp_path):
    shape = (3, (1 << 20) + 5)  # x: two chunks, the last padded with the fill value
    zarr_coordinates(zarr.open_group(str(tmp_path / "zarr"), mode="w"), shape, None, None)
    write_coordinate_files(tmp_path / "ours", shape, None, None)
    want = {k: v for k, v in _tree(tmp_path / "zarr").items() if k != "zarr.json"}
    assert "x/c/1" in want and _tree(tmp_path / "ours") == want


def _many_shards(path, tile, shard):
    """150 x 90 cells: with tile 8 and shard 4, 5 x 3 shards and five levels, two of them whole chunks
    of a base shard's piece (encoded where the shard is read), three put together from pieces."""
    rng = np.random.default_rng(5)
    z = (rng.random((150, 90)) * 300 + 100).astype(np.float32)
    z[rng.random(z.shape) < 0.1] = np.nan
    z[40:80, 16:56] = np.nan  # whole chunks of nodata: left out of their shards, read back as nodata
    st = utm_store(path, z, tile=tile, shard=shard)
    acc = np.where(np.isnan(z), np.nan, rng.random(z.shape) * 1e4)
    ids = rng.integers(0, 4, z.shape).astype(np.uint32)
    with st.write_result("flow") as w:
        w.create_array("accumulation", "float64", math.nan)[...] = acc
    with st.write_result("fill") as w:
        w.create_array("depression", "uint32", 0)[...] = ids
    return {"elevation": (z, overview_mean), "flow/accumulation": (acc, overview_max),
            "fill/depression": (ids, lambda a: overview_mode(a, 0))}


def _levels(path, name):
    leaf = name.rsplit("/", 1)[-1]
    group = TerrainStore.open(path, mode="r").group[f"overviews/{name}"]
    return [group[f"{k}/{leaf}"][...] for k in range(1, len(group.attrs["multiscales"]["layout"]) + 1)]


def test_levels_of_many_shards_are_the_reductions_on_every_scheduler(tmp_path):
    arrays = _many_shards(tmp_path / "a.zarr", tile=8, shard=4)
    assert write_overviews(tmp_path / "a.zarr") == dict.fromkeys(arrays, 5)
    for name, (base, ref) in arrays.items():
        below = base
        for k, got in enumerate(_levels(tmp_path / "a.zarr", name), start=1):
            want = ref(below)
            assert got.dtype == want.dtype and got.shape == want.shape, (name, k)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} level {k}")
            below = got
    # on Dask's threads, and with shards of one tile (every level put together here; levels 1..4 of 4)
    pytest.importorskip("dask")
    _many_shards(tmp_path / "b.zarr", tile=16, shard=1)
    write_overviews(tmp_path / "b.zarr", ["elevation", "fill/depression"], scheduler="threads")
    # and one shard of 32 tiles: every level's piece is whole chunks, all compressed in the one task
    _many_shards(tmp_path / "c.zarr", tile=8, shard=32)
    write_overviews(tmp_path / "c.zarr", ["elevation", "fill/depression"])
    for other in ("b.zarr", "c.zarr"):
        for name in ("elevation", "fill/depression"):
            for got, want in zip(_levels(tmp_path / other, name), _levels(tmp_path / "a.zarr", name)):
                assert got.tobytes() == want.tobytes(), (other, name)


# -- --overviews on the commands that write results ---------------------------------------------------
def _cli(*args):
    from click.testing import CliRunner

    from cli.main import _register, cli

    _register()
    res = CliRunner().invoke(cli, ["-q", *map(str, args)])
    assert res.exit_code == 0, res.output
    return res


def _pyramids(path) -> set[str]:
    """The arrays that have a pyramid, by the store's folders (overviews/ARRAY/zarr.json with a source)."""
    import json

    found = set()
    for meta in (Path(path) / "overviews").rglob("zarr.json"):
        attrs = json.loads(meta.read_text()).get("attributes", {})
        if "multiscales" in attrs:
            found.add(attrs["source"])
    return found


@pytest.mark.parametrize("command,written", [
    (["fill"], {"fill/elevation", "fill/depth", "fill/depression"}),
    (["sssp", "--cell", "5,7", "--name", "a"], {"sssp/a/distance", "sssp/a/predecessor"}),
    (["flow"], {"flow/direction", "flow/accumulation", "fill/elevation", "fill/depth", "fill/depression"}),
    (["mst"], {"mst/edges"}),
    (["depressions"], {"depressions/basin"}),
    (["streams", "--threshold", "20"], {"streams/order", "streams/link", "streams/magnitude"}),
])
def test_overviews_option_gives_what_the_command_wrote_its_pyramid(tmp_path, command, written):
    rng = np.random.default_rng(3)
    z = (np.add.outer(np.arange(70), np.arange(45)) + rng.random((70, 45)) * 30).astype(np.float32)
    path = tmp_path / "s.zarr"
    utm_store(path, z, tile=16, shard=2)
    if command[0] == "streams":
        _cli("flow", path)  # without --overviews: flow's arrays get none
    _cli(command[0], path, *command[1:], "--overviews")
    assert _pyramids(path) == written  # and nothing else: not the elevation, not an earlier command's
    st = TerrainStore.open(path, mode="r")
    for name in written:
        base = st.group[name][...]
        level1 = st.group[f"overviews/{name}/1/{name.rsplit('/', 1)[-1]}"][...]
        assert level1.shape == (35, 23)
        if base.dtype.kind == "f":
            np.testing.assert_array_equal(level1, overview_mean(base))
    if command[0] == "fill":  # the command again: its arrays rewritten, their pyramids made again (current)
        from terrain_io.overviews import source_digest

        _cli("fill", path, "--outputs", "depth", "--overviews")
        st = TerrainStore.open(path, mode="r")
        assert (st.group["overviews/fill/depth"].attrs["source_manifest_sha256"]
                == source_digest(st, "fill/depth"))


# -- COG overviews of the maximum: the store's own pyramid ---------------------------------------------
def test_cog_of_accumulation_has_the_maximum_as_overviews(tmp_path):
    rasterio = pytest.importorskip("rasterio")
    rng = np.random.default_rng(9)
    z = (rng.random((700, 650)) * 100).astype(np.float32)
    z[rng.random(z.shape) < 0.05] = np.nan
    st = utm_store(tmp_path / "s.zarr", z, tile=64, shard=2)
    acc = np.where(np.isnan(z), np.nan, rng.pareto(1.0, z.shape) * 10)  # heavy-tailed: a mean is far off the max
    order = rng.integers(1, 6, z.shape).astype(np.uint8)
    with st.write_result("flow") as w:
        w.create_array("accumulation", "float64", math.nan)[...] = acc
    with st.write_result("streams") as w:
        w.create_array("order", "uint8", 0)[...] = order
    out = tmp_path / "acc.tif"
    from terrain_io.errors import TerrainNote

    with pytest.warns(TerrainNote, match="flow/accumulation: GDAL has no maximum"):  # no pyramid yet: averages
        _cli("export", tmp_path / "s.zarr", "flow/accumulation", "-o", out, "--cog")
    _cli("overviews", tmp_path / "s.zarr", "flow/accumulation", "streams/order")
    for name, base in (("flow/accumulation", acc), ("streams/order", order)):
        out = tmp_path / f"{name.replace('/', '_')}.tif"
        with warnings.catch_warnings():
            warnings.simplefilter("error", TerrainNote)  # no note: the pyramid is current
            _cli("export", tmp_path / "s.zarr", name, "-o", out, "--cog", "--overwrite")
        assert check_cog_layout(out) >= 3
        with rasterio.open(out) as ds:
            assert ds.overviews(1)[:3] == [2, 4, 8] and ds.crs.to_epsg() == 32633
            np.testing.assert_array_equal(ds.read(1), base)
            below = base.astype(np.float64) if base.dtype.kind == "u" else base
            for f in ds.overviews(1):
                want = overview_max(np.where(below == 0, np.nan, below) if base.dtype.kind == "u" else below)
                got = ds.read(1, out_shape=want.shape)
                np.testing.assert_array_equal(got, np.nan_to_num(want, nan=0) if base.dtype.kind == "u" else want,
                                              err_msg=f"{name} overview {f}")
                below = want
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch left
