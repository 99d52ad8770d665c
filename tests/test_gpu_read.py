"""Arrays read onto the GPU as their zstd frames (issue 30's reads): ``store.shard_frames`` gives each
shard's frames, checked on the host, and ``pinned.read_device`` decodes them on the GPU with nvCOMP
(``nvzstd.BandDecoder``) straight into the array's rows. On any machine: the frames, decoded by zstd's
own decoder (numcodecs), are zarr-python's cells of the array, and damage is found before any frame
leaves the host. On a GPU machine with nvCOMP (``pytest -m gpu``): the array on the GPU holds zarr's
cells bit for bit (every dtype, array edges inside a chunk, chunks and shards never stored, the
converted reads of the hydrology), damage raises DamagedStoreError, and ``streams`` and ``hand`` read
their arrays this way and store the CPU route's cells."""
import numpy as np
import pytest
import zarr
from numcodecs import Zstd

from terrain_io.errors import DamagedStoreError
from terrain_io.store import TerrainStore, fill_value_for, shard_frames

SHAPE = (203, 150)  # tile 16, shard 2: 7 x 5 shards, the last row and column cut inside a chunk
TILE, SHARD = 16, 2


def values_of(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    v = {"f4": lambda: rng.normal(size=SHAPE).astype(np.float32), "f8": lambda: rng.normal(size=SHAPE) * 1e9,
         "u1": lambda: rng.integers(0, 9, SHAPE, dtype=np.uint8),
         "u4": lambda: rng.integers(0, 2**32, SHAPE, dtype=np.uint32),
         "u8": lambda: rng.integers(0, 2**63, SHAPE, dtype=np.uint64) >> rng.integers(0, 60, SHAPE).astype(np.uint64)}[dtype]()
    fill = fill_value_for(v.dtype, None)
    v[:32, :32] = fill  # a whole shard of fill value: no file
    v[40:56, 64:96] = fill  # two chunks of fill value: left out of their shard
    if v.dtype.kind == "f":
        v[rng.random(SHAPE) < 0.05] = np.nan
    return v


def stored(tmp_path, dtype):
    """A store holding ``values_of(dtype)`` as result ``r/v`` (this tool's writer), and zarr's own read of it."""
    values = values_of(dtype)
    store = TerrainStore.from_array(tmp_path / f"{dtype}.zarr", np.zeros(SHAPE, np.float32), tile=TILE, shard=SHARD)
    with store.write_result("r") as writer:
        arr = writer.create_array("v", values.dtype, fill_value_for(values.dtype, None))
        arr[...] = values
    ref = zarr.open_array(tmp_path / f"{dtype}.zarr" / "r" / "v", mode="r")[...]
    assert ref.tobytes() == values.tobytes()
    return TerrainStore.open(tmp_path / f"{dtype}.zarr"), ref


def damaged(tmp_path, dtype, at: int):
    """``stored``'s store with one bit of byte ``at`` of shard file (1, 1) of ``r/v`` flipped (inside
    its first chunk), and that file's bytes so."""
    store, _ = stored(tmp_path, dtype)
    path = store.path / "r" / "v" / "c" / "1" / "1"
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    return TerrainStore.open(store.path), path, data


@pytest.mark.parametrize("lent", [False, True])
@pytest.mark.parametrize("dtype, align", [("f4", 8), ("u1", 8), ("u8", 8), ("u8", 1)])
def test_shard_frames_decode_to_zarrs_cells(tmp_path, dtype, align, lent):
    """Each shard's frames, at multiples of the alignment asked for (1: where they lie in the file),
    decoded by numcodecs' zstd and put at their chunks: zarr-python's read of the array; chunks not
    listed and shards without a file (None) are those zarr fills. ``lent``: the frames given in
    buffers lent by read_device's PinnedSlots (plain memory here), each given back after its shard and
    lent again: one buffer made for the 34 shards, and a second only when a shard needs more."""
    from terrain_io.pinned import PinnedSlots

    made = []
    slots = PinnedSlots(allocate=lambda n: made.append(n) or np.empty(n, np.uint8)) if lent else None
    store, ref = stored(tmp_path, dtype)
    arr = store.group["r/v"]
    side, fill = TILE * SHARD, fill_value_for(ref.dtype, None)
    got = np.full((-(-SHAPE[0] // TILE) * TILE, -(-SHAPE[1] // TILE) * TILE), fill, ref.dtype)
    files = 0
    for sr in range(-(-SHAPE[0] // side)):
        for sc in range(-(-SHAPE[1] // side)):
            frames = shard_frames(arr, sr, sc, align=align, out=slots.take if lent else None)
            if frames is None:
                continue
            files += 1
            packed, chunks = frames
            assert (chunks[:, 2] % align == 0).all()
            for i, j, at, nb in chunks.tolist():
                cells = np.frombuffer(Zstd().decode(packed[at : at + nb].tobytes()), ref.dtype).reshape(TILE, TILE)
                r, c = sr * side + i * TILE, sc * side + j * TILE
                got[r : r + TILE, c : c + TILE] = cells
            if lent:
                slots.give(packed)
    assert files == 7 * 5 - 1  # the shard of fill value has no file
    if lent:  # (a buffer given back is lent again: one made a size class of the shards' frames)
        assert 1 <= len(made) <= 3 and all(n >= 1 << 20 for n in made)
    assert got[: SHAPE[0], : SHAPE[1]].tobytes() == ref.tobytes()


def test_shard_frames_find_damage(tmp_path):
    """A flipped byte inside a stored chunk fails its crc32c on the host (nvCOMP never sees it); a
    file cut short fails the manifest."""
    store, path, data = damaged(tmp_path, "f4", 20)
    with pytest.raises(DamagedStoreError, match="checksum"):
        shard_frames(store.group["r/v"], 1, 1)
    path.write_bytes(bytes(data[:-100]))
    with pytest.raises(DamagedStoreError):
        shard_frames(TerrainStore.open(store.path).group["r/v"], 1, 1)


def decoder_or_skip():
    pytest.importorskip("cupy")
    from terrain_io import nvzstd

    if nvzstd.decoder() is None:
        pytest.skip("nvCOMP (pip nvidia-libnvcomp-cu13) is not installed")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f4", "f8", "u1", "u4", "u8"])
def test_read_device_gives_zarrs_cells(tmp_path, dtype):
    """The array on the GPU bit for bit zarr's (NaN payloads, fill values, edges), for bands of one
    and of several shard rows, and the hydrology's converted reads (uint32, the stream mask) equal
    the conversion of zarr's cells."""
    from terrain_io import pinned

    decoder_or_skip()
    store, ref = stored(tmp_path, dtype)
    for threads in (1, 5, 16):
        got = pinned.read_device(store, "r/v", threads)
        assert got.dtype == ref.dtype and got.get().tobytes() == ref.tobytes(), threads
    if dtype == "u8":
        narrow = pinned.read_device(store, "r/v", 5, (np.uint32, lambda b: b.astype(np.uint32))).get()
        assert narrow.tobytes() == ref.astype(np.uint32).tobytes()
        mask = pinned.read_device(store, "r/v", 5, (np.bool_, lambda b: b >= 2**40)).get()
        np.testing.assert_array_equal(mask, ref >= 2**40)


@pytest.mark.gpu
def test_read_device_refuses_damage(tmp_path):
    from terrain_io import pinned

    decoder_or_skip()
    store, _, _ = damaged(tmp_path, "u8", 30)
    with pytest.raises(DamagedStoreError, match="checksum"):
        pinned.read_device(store, "r/v", 4)


@pytest.mark.gpu
def test_a_failing_gpu_decoder_is_a_note_and_the_cpus_read(tmp_path, monkeypatch):
    from terrain_io import nvzstd, pinned
    from terrain_io.errors import TerrainNote
    from terrain_io.grid.flow.upload import upload_held

    decoder_or_skip()
    store, ref = stored(tmp_path, "f4")

    def fail(*_):
        raise RuntimeError("nvCOMP zstd decompress: status 11")

    def refuse_one(*_):  # a frame the decoder does not take, though its crc32c holds: not a damaged store
        return np.array([0])

    for decode in (fail, refuse_one):
        monkeypatch.setattr(nvzstd.BandDecoder, "decode", decode)
        with pytest.warns(TerrainNote, match="decoded on the CPU"):
            assert pinned.read_device(store, "r/v", 4) is None
        with pytest.warns(TerrainNote):
            got, _ = upload_held(store, "r/v", None)
        assert got.get().tobytes() == ref.tobytes()


@pytest.mark.gpu
def test_streams_and_hand_read_through_the_gpu_decoder(tmp_path, monkeypatch):
    """``streams -o`` and ``hand`` on the GPU decode their arrays there (the decoder spied: direction,
    accumulation, and the elevations: HAND's, and the links' end elevations gathered on the GPU), store
    the CPU route's cells and write the CPU route's features (pyogrio's raw read: WKB and every field)."""
    import pyogrio

    from test_io_gpu_zstd import pitted_dem

    from terrain_io import nvzstd
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.grid.hydro.pipeline import hand, streams

    decoder_or_skip()
    calls, decode = [], nvzstd.BandDecoder.decode
    monkeypatch.setattr(nvzstd.BandDecoder, "decode", lambda self, *a: calls.append(a[2].dtype) or decode(self, *a))
    h = pitted_dem(300, 257, 5)
    got = {}
    for device in ("cpu", "gpu"):
        st = TerrainStore.from_array(tmp_path / f"{device}.zarr", h, tile=32, shard=2)
        flow(st, condition="fill", device="cpu", progress=False)
        for run in (lambda: streams(st, 20, device=device, progress=False, vectors=tmp_path / f"{device}.gpkg"),
                    lambda: hand(st, 20, device=device, progress=False)):
            calls.clear()
            run()
            assert set(calls) == ({np.dtype(np.uint8), np.dtype(np.uint64), np.dtype(np.float32)} if device == "gpu"
                                  else set())
        grp = zarr.open_group(tmp_path / f"{device}.zarr", mode="r")
        got[device] = {n: grp[n][...] for n in ("streams/order", "streams/magnitude", "streams/link", "hand/height",
                                                "hand/drainage")}
        _, _, geometry, fields = pyogrio.raw.read(tmp_path / f"{device}.gpkg")
        got[device]["features"] = (list(geometry), [np.asarray(f) for f in fields])
    for n, v in got["cpu"].items():
        if n == "features":
            assert len(v[0]) > 50 and got["gpu"][n][0] == v[0]
            for a, b in zip(got["gpu"][n][1], v[1]):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        else:
            assert got["gpu"][n].dtype == v.dtype and got["gpu"][n].tobytes() == v.tobytes(), n
