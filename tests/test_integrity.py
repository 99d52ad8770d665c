"""Store integrity (issue #17): a damaged or missing chunk is an error, never a silently different result.

References are independent of ``terrain_io.integrity``: the codec chains are read from zarr.json,
the shard format (chunks, then the index of (offset, nbytes) little-endian uint64 pairs, then its
crc32c) is parsed here from the Zarr sharding spec, files are listed with os.walk, and every
command's output on a damaged store is compared with the same command's output on the clean store.

The seeded damage trials flip bytes in, truncate or delete one chunk/shard file of one array
(elevation, mst/edges, sssp/NAME/distance and predecessor, the SSSP index d and v, a coordinate
array), then run info, verify, path, export, mst, sssp with the stored index and sssp in-core.
Every command either fails with one line naming the store and the damaged array, leaving every
result as it was and no temporaries, or exits 0 with exactly the clean run's output.
``TERRAIN_DAMAGE_TRIALS`` sets the number of trials (default 8; the reliability figure uses 100+).
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.errors import DamagedStoreError, UnverifiedStoreWarning
from terrain_io.store import TerrainStore, read_shard
from terrain_io.synth import synth_array
from references import tree_digest

_register()

TRIALS = int(os.environ.get("TERRAIN_DAMAGE_TRIALS", "8"))
ROWS, COLS, TILE, SHARD = 200, 260, 32, 2
SOURCE = (90, 170)
TARGETS = [(5, 5), (195, 255), (150, 20)]
ARRAYS = ["elevation", "mst/edges", "sssp/s/distance", "sssp/s/predecessor", "index/absdiff/d",
          "index/absdiff/v", "x"]
DAMAGES = ["flip", "truncate", "delete"]


def run(*args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r.exit_code, r.output  # stdout and stderr, as a terminal shows them


def dem_values() -> np.ndarray:
    v = synth_array(ROWS, COLS, seed=3, nodata_fraction=0.05).astype(np.float32)
    v[64:128, 64:128] = np.nan  # one whole shard of nodata: never written, and not damage
    return v


def chunk_files(array_dir: Path) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(array_dir / "c"):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(array_dir))] = p.stat().st_size
    return out


def shard_index(raw: bytes, n: int):
    """The Zarr sharding index at the end of a shard file: (offset, nbytes) per inner chunk, C order."""
    tail = raw[len(raw) - n * 16 - 4:]
    assert np.uint32(google_crc32c.value(tail[:-4])).tobytes() == tail[-4:]
    return np.frombuffer(tail[:-4], "<u8").reshape(n, 2)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A store with every array kind, and the clean outputs of every command."""
    root = tmp_path_factory.mktemp("clean")
    store = root / "dem.zarr"
    TerrainStore.from_array(store, dem_values(), tile=TILE, shard=SHARD)
    for args in (["mst", store], ["sssp", store, "--cell", "--source", "%d,%d" % SOURCE, "--name", "s",
                                  "--method", "index"]):
        code, out = run("-q", *args)
        assert code == 0, out
    outputs = {}
    for i, (r, c) in enumerate(TARGETS):
        code, out = run("-q", "path", store, "--name", "s", "--cell", "--to", f"{r},{c}", "-o", root / f"p{i}.geojson")
        assert code == 0, out
        outputs[f"path{i}"] = (root / f"p{i}.geojson").read_bytes()
    for name in ("elevation", "mst/edges", "sssp/s/distance", "sssp/s/predecessor"):
        code, out = run("-q", "export", store, name, "-o", root / "e.asc")
        assert code == 0, out
        outputs[name] = (root / "e.asc").read_bytes()
        (root / "e.asc").unlink()
    outputs["mst"] = zarr_values(store / "mst")
    outputs["sssp index"] = zarr_values(store / "sssp" / "s")
    other = root / "incore.zarr"  # the in-core engine's own clean result (its tie rule may pick other parents)
    shutil.copytree(store, other)
    code, out = run("-q", "sssp", other, "--cell", "--source", "%d,%d" % SOURCE, "--name", "s", "--method", "incore")
    assert code == 0, out
    outputs["sssp incore"] = zarr_values(other / "sssp" / "s")
    return store, outputs


def zarr_values(group_dir: Path) -> dict:
    """The arrays of a result group as plain zarr reads them (zarr checks the chunk checksums too)."""
    g = zarr.open_group(str(group_dir), mode="r")
    return {name: node[...] for name, node in g.members(max_depth=None) if isinstance(node, zarr.Array)}


# ---------------------------------------------------------------------------------------------
# What is written
# ---------------------------------------------------------------------------------------------
def test_every_array_ends_its_chunks_in_a_crc32c_and_has_a_true_manifest(clean):
    store, _ = clean
    assert json.loads((store / "zarr.json").read_text())["attributes"]["format_version"] == 2
    arrays = [p.parent for p in store.rglob("zarr.json") if json.loads(p.read_text())["node_type"] == "array"]
    names = {str(a.relative_to(store)) for a in arrays}
    assert set(ARRAYS) <= names and "mst/x" in names and "index/absdiff/d" in names
    for a in arrays:
        meta = json.loads((a / "zarr.json").read_text())
        codecs = meta["codecs"]
        if codecs[0]["name"] == "sharding_indexed":
            assert [c["name"] for c in codecs[0]["configuration"]["codecs"]] == ["bytes", "zstd", "crc32c"], a
            assert codecs[0]["configuration"]["index_codecs"][-1]["name"] == "crc32c"
        else:
            assert codecs[-1]["name"] == "crc32c", a
        manifest = json.loads((a / "terrain-manifest.json").read_text())["chunks"]
        assert manifest == chunk_files(a), a
    assert not (store / "elevation" / "c" / "1" / "1").exists()  # the all-nodata shard was never written
    assert "c/0/0" in json.loads((store / "elevation" / "terrain-manifest.json").read_text())["chunks"]


def test_plain_zarr_reads_our_checksummed_shards_and_checks_them(clean, tmp_path):
    store, _ = clean
    ours = TerrainStore.open(store, mode="r")
    plain = zarr.open_array(str(store / "elevation"), mode="r")
    want = dem_values()
    np.testing.assert_array_equal(plain[:], want)
    np.testing.assert_array_equal(read_shard(ours.elevation, 2, 3), want[128:192, 192:256])
    np.testing.assert_array_equal(ours.elevation[:], want)
    copy = tmp_path / "c.zarr"
    shutil.copytree(store, copy)
    f = copy / "elevation" / "c" / "0" / "0"
    raw = bytearray(f.read_bytes())
    raw[10] ^= 0xFF  # inside the first chunk of the shard
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):  # zarr itself verifies the crc32c codec
        zarr.open_array(str(copy / "elevation"), mode="r")[:8, :8]


def test_write_shard_gives_zarrs_bytes_with_checksums(tmp_path):
    from references import zarr_tiled_array
    from terrain_io.store import array_handle, tiled_array_metadata, write_node, write_shard

    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    rng = np.random.default_rng(1)
    block = rng.random((64, 40)).astype(np.float32)
    block[:32, :32] = np.nan  # an all-fill chunk is left out, as zarr does
    meta = tiled_array_metadata((100, 40), "float32", 32, 2, float("nan"))
    write_node(tmp_path / "g.zarr" / "ours", meta)
    a = array_handle(str(tmp_path / "g.zarr"), "ours", meta)
    b = zarr_tiled_array(g, "zarrs", (100, 40), "float32", 32, 2, float("nan"))
    write_shard(a, 0, 0, block)
    b[0:64, 0:40] = block
    assert (tmp_path / "g.zarr/ours/c/0/0").read_bytes() == (tmp_path / "g.zarr/zarrs/c/0/0").read_bytes()


def test_damaged_store_error_is_one_line_and_survives_pickling():
    e = DamagedStoreError("/d/x.zarr", "elevation", (3, 4), "chunk fails its checksum")
    assert str(e) == "/d/x.zarr: array elevation chunk (3, 4): chunk fails its checksum"
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is DamagedStoreError and str(again) == str(e) and again.chunk == (3, 4)


def test_the_issue_case_mst_refuses_and_names_the_chunk(clean, tmp_path):
    """100 bytes overwritten in the middle of one elevation shard: mst exits 1 naming the chunk
    that holds the middle byte (found from the shard's own index), and writes no result."""
    store, outputs = clean
    copy = tmp_path / "d.zarr"
    shutil.copytree(store, copy)
    f = copy / "elevation" / "c" / "2" / "1"
    raw = bytearray(f.read_bytes())
    mid = len(raw) // 2
    index = shard_index(bytes(raw), SHARD * SHARD)
    hit = [k for k, (off, nb) in enumerate(index) if off <= mid < off + nb]
    assert len(hit) == 1
    want = (2 * SHARD + hit[0] // SHARD, 1 * SHARD + hit[0] % SHARD)
    raw[mid : mid + 100] = bytes(b ^ 0x5A for b in raw[mid : mid + 100])
    f.write_bytes(bytes(raw))
    before = tree_digest(copy / "mst")
    code, out = run("-q", "mst", copy)
    assert code == 1
    errors = [line for line in out.splitlines() if line.startswith("terrain: error:")]
    assert errors == [f"terrain: error: {copy}: array elevation chunk {want}: chunk fails its checksum"]
    assert tree_digest(copy / "mst") == before
    assert not [p for p in tmp_path.rglob("*") if ".partial" in p.name or ".scratch" in p.name]


def test_version_1_store_opens_with_a_note_and_verify_says_it_has_no_checksums(tmp_path):
    """A store as format_version 1 wrote it (zstd without crc32c, no manifests) still opens and runs."""
    from zarr.codecs import ZstdCodec

    path = tmp_path / "old.zarr"
    g = zarr.open_group(str(path), mode="w")
    g.attrs.update({"format": "terrain", "format_version": 1, "tile_size": 32, "shard_size": 2, "nodata": None})
    values = dem_values()[:100, :100]
    a = g.create_array("elevation", shape=values.shape, chunks=(32, 32), shards=(64, 64), dtype="float32",
                       fill_value=float("nan"), compressors=ZstdCodec(level=1), dimension_names=("y", "x"))
    a[...] = values
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        st = TerrainStore.open(path, mode="r")
    assert any(issubclass(w.category, UnverifiedStoreWarning) for w in caught)
    np.testing.assert_array_equal(read_shard(st.elevation, 1, 0), values[64:100, 0:64])
    np.testing.assert_array_equal(st.elevation[:], values)
    code, out = run("-q", "mst", path)
    assert code == 0, out
    code, out = run("verify", path)
    assert code == 0 and "no checksums" in out
    f = path / "elevation" / "c" / "0" / "1"
    raw = bytearray(f.read_bytes())
    raw[-5] ^= 1  # the shard index still has its crc32c in format 1
    f.write_bytes(bytes(raw))
    code, out = run("verify", path)
    assert code == 1 and "array elevation shard (0, 1): the shard index fails its checksum" in out


# ---------------------------------------------------------------------------------------------
# Seeded damage trials
# ---------------------------------------------------------------------------------------------
def damage(store: Path, rng: random.Random, array: str, how: str):
    """Damage one chunk file of ``array``; returns (file key, the chunk(s) a report may name)."""
    array_dir = store / array
    files = sorted(chunk_files(array_dir))
    key = rng.choice(files)
    f = array_dir / key
    raw = f.read_bytes()
    coords = tuple(int(p) for p in key.split("/")[1:])
    sharded = json.loads((array_dir / "zarr.json").read_text())["codecs"][0]["name"] == "sharding_indexed"
    if how == "delete":
        f.unlink()
        return key, {coords}
    if how == "truncate":
        f.write_bytes(raw[: rng.randrange(0, len(raw))])
        return key, {coords} | ({tuple(c * SHARD + i for c, i in zip(coords, ij))
                                 for ij in np.ndindex(SHARD, SHARD)} if sharded else set())
    n = rng.randint(1, 16)
    at = rng.randrange(0, len(raw) - n + 1)
    flipped = bytearray(raw)
    for k in range(at, at + n):
        flipped[k] ^= rng.randint(1, 255)
    f.write_bytes(bytes(flipped))
    if not sharded:
        return key, {coords}
    index = shard_index(raw, SHARD * SHARD)
    named = set()
    for k, (off, nb) in enumerate(index):
        if off != 2**64 - 1 and off < at + n and at < off + nb:
            named.add((coords[0] * SHARD + k // SHARD, coords[1] * SHARD + k % SHARD))
    if at + n > len(raw) - SHARD * SHARD * 16 - 4:  # the index (or its crc) was hit: the shard is named
        named.add(coords)
    return key, named


def coords_in(text: str) -> tuple[int, ...]:
    """(2, 3) from '... chunk (2, 3): ...'; (0,) from '(0,)'."""
    inside = text.split("(", 1)[1].split(")", 1)[0]
    return tuple(int(v) for v in inside.replace(" ", "").rstrip(",").split(","))


def check_outcome(code, out, store, array, allowed, what):
    """Exit 1 with one error line naming the store and the damaged array (and a damaged chunk), or exit 0."""
    if code == 0:
        return False
    lines = [line for line in out.splitlines() if line.startswith("terrain: error:")]
    assert code == 1 and lines, f"{what}: exit {code} without an error line: {out[-2000:]}"
    assert all(f"{store}: array {array}" in line for line in lines), f"{what}: {lines}"
    named = {coords_in(line.split(": ", 3)[3]) for line in lines if "(" in line.split(": ", 3)[3].split(":")[0]}
    assert named <= allowed or not named, f"{what}: named {named}, damaged {allowed}"
    return True


def trial(clean_store: Path, outputs: dict, tmp_path: Path, seed: int) -> dict:
    rng = random.Random(seed)
    array = ARRAYS[seed % len(ARRAYS)] if seed < 2 * len(ARRAYS) else rng.choice(ARRAYS)
    how = DAMAGES[(seed // len(ARRAYS)) % 3] if seed < 3 * len(ARRAYS) else rng.choice(DAMAGES)
    work = tmp_path / f"t{seed}"
    work.mkdir()
    store = work / "dem.zarr"
    shutil.copytree(clean_store, store)
    key, allowed = damage(store, rng, array, how)
    what = f"seed {seed}: {how} {array}/{key}"
    failed = {}

    code, out = run("verify", store)  # every damage is found, and named
    assert code == 1, f"{what}: verify said sound: {out}"
    problems = [line for line in out.splitlines() if line.startswith(f"{store}: array ")]
    assert problems and all(line.startswith(f"{store}: array {array} ") for line in problems), f"{what}: {out}"
    named = {coords_in(line) for line in problems if "(" in line}
    assert named <= allowed and named, f"{what}: verify named {named}, damaged {allowed}"
    code, out = run("verify", "--json", store)
    assert code == 1 and not json.loads(out[out.index("{"):])["sound"]

    code, out = run("-q", "info", store)
    failed["info"] = check_outcome(code, out, store, array, allowed, what + " info")
    if how != "flip":  # a missing or cut file is seen without reading a chunk
        assert failed["info"], f"{what}: info did not report a {how}d file"

    for i, (r, c) in enumerate(TARGETS):
        out_file = work / f"p{i}.geojson"
        code, out = run("-q", "path", store, "--name", "s", "--cell", "--to", f"{r},{c}", "-o", out_file)
        if not check_outcome(code, out, store, array, allowed, what + " path"):
            assert out_file.read_bytes() == outputs[f"path{i}"], f"{what}: path {i} silently differs"
        else:
            failed[f"path{i}"] = True
            assert not out_file.exists()
    for name in ("elevation", "mst/edges", "sssp/s/distance", "sssp/s/predecessor"):
        out_file = work / "e.asc"
        code, out = run("-q", "export", store, name, "-o", out_file)
        if not check_outcome(code, out, store, array, allowed, what + " export " + name):
            assert out_file.read_bytes() == outputs[name], f"{what}: export {name} silently differs"
            out_file.unlink()
        else:
            failed[f"export {name}"] = True
            assert not out_file.exists()

    # writers: a failure replaces nothing; a success is the clean result
    for label, args, result in (
            ("mst", ["mst", store], "mst"),
            ("sssp index", ["sssp", store, "--cell", "--source", "%d,%d" % SOURCE, "--name", "s", "--method", "index"],
             "sssp/s"),
            ("sssp incore", ["sssp", store, "--cell", "--source", "%d,%d" % SOURCE, "--name", "s", "--method", "incore"],
             "sssp/s")):
        before = tree_digest(store / result)
        code, out = run("-q", *args)
        if check_outcome(code, out, store, array, allowed, f"{what} {label}"):
            failed[label] = True
            assert tree_digest(store / result) == before, f"{what}: {label} failed but changed {result}"
        else:
            got, want = zarr_values(store / result), outputs[label]
            assert got.keys() == want.keys()
            for k in got:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {label} {k} silently differs")
    leftovers = [p for p in list(work.iterdir()) + list(store.iterdir()) if ".partial" in p.name or ".scratch" in p.name]
    assert not leftovers, f"{what}: left {leftovers}"
    shutil.rmtree(work)
    return {"array": array, "how": how, "failed": sorted(k for k, v in failed.items() if v)}


@pytest.mark.reliability
def test_seeded_damage_is_always_reported_never_silent(clean, tmp_path):
    store, outputs = clean
    log = [trial(store, outputs, tmp_path, seed) for seed in range(TRIALS)]
    # every elevation damage is refused by every command that reads all of the elevation
    for t in log:
        if t["array"] == "elevation":
            assert {"mst", "sssp index", "sssp incore", "export elevation"} <= set(t["failed"]), t
    if os.environ.get("TERRAIN_DAMAGE_LOG"):
        Path(os.environ["TERRAIN_DAMAGE_LOG"]).write_text(json.dumps(log, indent=1))


def test_unreadable_array_metadata_is_damage_too(clean, tmp_path):
    store, _ = clean
    copy = tmp_path / "m.zarr"
    shutil.copytree(store, copy)
    meta = copy / "sssp" / "s" / "distance" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])  # cut: no longer JSON
    code, out = run("verify", copy)
    assert code == 1 and f"{copy}: array sssp/s/distance: its zarr.json cannot be read" in out
    code, out = run("-q", "export", copy, "sssp/s/distance", "-o", tmp_path / "d.asc")
    lines = [line for line in out.splitlines() if line.startswith("terrain: error:")]
    assert code == 1 and len(lines) == 1 and "array sssp/s/distance: its zarr.json is not valid JSON" in lines[0]
    assert not (tmp_path / "d.asc").exists()


def test_edited_array_metadata_is_damage_not_a_bug(clean, tmp_path):
    """A zarr.json still JSON but no longer zarr's metadata (a shape cut to one dimension) is damage:
    one 'terrain: error:' line naming the array, exit 1 -- not zarr's ValueError as an internal error."""
    store, _ = clean
    for node, args in (("sssp/s/distance", ["export", "{copy}", "sssp/s/distance", "-o", tmp_path / "d.asc"]),
                       ("elevation", ["info", "{copy}"])):
        copy = tmp_path / (node.replace("/", "_") + ".zarr")
        shutil.copytree(store, copy)
        meta = copy / node / "zarr.json"
        edited = json.loads(meta.read_text())
        edited["shape"] = edited["shape"][:1]
        meta.write_text(json.dumps(edited))
        code, out = run("-q", *[copy if a == "{copy}" else a for a in args])
        lines = [line for line in out.splitlines() if line.startswith("terrain:")]
        assert code == 1 and len(lines) == 1, out
        assert lines[0].startswith(f"terrain: error: {copy}: array {node}: its zarr.json is not valid metadata"), out


def test_plain_chunks_with_crc32c_written_directly_are_zarrs_and_checked(tmp_path):
    """write_block writes whole plain chunks itself (edge chunks padded), the rest through zarr; with the
    crc32c codec zarr reads (and checks) every chunk, read_plain_chunk reads zarr's, and a flipped byte
    or a cut file is DamagedStoreError naming the chunk."""
    from zarr.codecs import Crc32cCodec

    from terrain_io.store import read_plain_chunk
    from references import blocks_written

    arr, want, chunks = blocks_written(tmp_path, Crc32cCodec())
    f = tmp_path / "a.zarr" / "c" / "2" / "1" / "0" / "0"
    raw = f.read_bytes()
    assert len(raw) == 4 * 4 * 3 * 3 * 4 + 4  # whole chunk (padded at the edge) + its crc32c
    assert raw[-4:] == np.uint32(google_crc32c.value(raw[:-4])).tobytes()
    out = np.empty(chunks, np.float32)
    assert read_plain_chunk(arr, (2, 1, 0, 0), out)
    edge = np.full(chunks, np.inf, np.float32)
    edge[:3, :3] = want[8:11, 4:7]
    np.testing.assert_array_equal(out, edge)
    f.write_bytes(raw[:100] + bytes([raw[100] ^ 4]) + raw[101:])
    with pytest.raises(DamagedStoreError, match=r"chunk \(2, 1, 0, 0\): chunk fails its checksum"):
        read_plain_chunk(arr, (2, 1, 0, 0), out)
    f.write_bytes(raw[:-9])
    with pytest.raises(DamagedStoreError, match=r"chunk \(2, 1, 0, 0\)"):
        read_plain_chunk(arr, (2, 1, 0, 0), out)


def test_damage_found_by_a_dask_worker_is_the_same_one_line(clean, tmp_path):
    """A worker process raises DamagedStoreError; it crosses the process boundary whole."""
    pytest.importorskip("distributed")
    store, _ = clean
    copy = tmp_path / "w.zarr"
    shutil.copytree(store, copy)
    f = copy / "elevation" / "c" / "0" / "2"
    raw = bytearray(f.read_bytes())
    index = shard_index(bytes(raw), SHARD * SHARD)
    raw[int(index[3][0]) + 7] ^= 0x20  # inside inner chunk (1, 1) of shard (0, 2): tile (1, 5)
    f.write_bytes(bytes(raw))
    before = tree_digest(copy / "mst")
    code, out = run("-q", "mst", copy, "--scheduler", "processes")
    lines = [line for line in out.splitlines() if line.startswith("terrain: error:")]
    assert code == 1 and lines == [f"terrain: error: {copy}: array elevation chunk (1, 5): chunk fails its checksum"]
    assert tree_digest(copy / "mst") == before


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_the_shard_method_refuses_a_damaged_or_missing_shard(clean, tmp_path, damage):
    """The out-of-core SSSP (units of shards read in turn) stops with one line at the damaged
    shard and writes no result."""
    store, _ = clean
    copy = tmp_path / "u.zarr"
    shutil.copytree(store, copy)
    f = copy / "elevation" / "c" / "2" / "3"
    if damage == "delete":
        f.unlink()
    else:
        raw = bytearray(f.read_bytes())
        raw[int(shard_index(bytes(raw), SHARD * SHARD)[0][0]) + 5] ^= 0x11
        f.write_bytes(bytes(raw))
    code, out = run("-q", "sssp", copy, "--cell", "--source", "%d,%d" % SOURCE, "--name", "u", "--method", "shards",
                    "--memory", "3MB")
    lines = [line for line in out.splitlines() if line.startswith("terrain: error:")]
    assert code == 1 and len(lines) == 1 and f"{copy}: array elevation" in lines[0], out
    assert ("missing" in lines[0]) == (damage == "delete")
    assert not (copy / "sssp" / "u").exists()
    assert not [p for p in tmp_path.rglob("*") if ".partial" in p.name or ".scratch" in p.name]
