"""The I/O floor of this machine against our store, side by side in one run (issue 31).

Measured, each the best of ``--reps`` (wall s; CPU s of the process beside it):
- raw disk: one new file per thread (all cores), written in 4 MiB calls and fsync'd; then read back
  cold (each file's pages dropped with ``posix_fadvise(DONTNEED)`` before each read); what each
  measurement starts from (the payload, the last files removed, the pages dropped) is made outside
  its time, as the store's is;
- codec: numcodecs Zstd at the store's level over the store's chunks (T x T) of each array, encoded
  and decoded in a pool of threads (all cores; zstd releases the GIL), and google-crc32c over the
  encoded chunks;
- our store (its chunk kernels loaded first, as a pipeline's process has them): one array per dtype
  (float32, float64, uint8, uint32) written as a result
  (``write_result`` + ``write_window`` of whole shards from a pool of threads, its manifest sealed)
  with each shard file fsync'd by its writer thread once written, as the raw floor's files are (the
  result's small files after it is complete), then read back cold by ``TerrainStore.read`` of whole
  shards from a pool of threads, each into its place.

The floor of a store write is max(encode + crc32c on all cores, compressed bytes at the raw write
bandwidth); of a read, max(compressed bytes at the raw read bandwidth, decode + crc32c on all cores).
"% floor" = floor time / store time (100% = at the floor). Bandwidths are of raw (decoded) bytes
unless marked "disk". The store measured is the ``terrain_io`` on the path (PYTHONPATH). Needs
numpy, numcodecs, zarr, google-crc32c and this repository only.

    python benchmarks/bench_io.py --size 4096
    python benchmarks/bench_io.py --size 32768 --dtypes float32 --dir /scratch
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

BLOCK = 4 << 20  # raw file I/O call size
DTYPES = ("float32", "float64", "uint8", "uint32")


def timed(fn, reps: int, before=None) -> tuple[float, float, object, list[float]]:
    """(best wall s, CPU s of that call, its result, every call's wall s) of ``fn()`` over ``reps``
    calls, each after ``before()`` (untimed: clearing what the last call left)."""
    best, walls = (float("inf"), 0.0, None), []
    for _ in range(reps):
        if before is not None:
            before()
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls.append(wall)
        if wall < best[0]:
            best = (wall, cpu, out)
    return (*best, walls)


def drop_cache(path) -> None:
    """Evict a (synced) file's pages, so that the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write(folder: Path, nbytes: int, threads: int, payload: bytes) -> list[Path]:
    """``nbytes`` in ``threads`` files written in parallel from ``payload`` (:data:`BLOCK` bytes, made
    before: its making is no part of the floor), each fsync'd before it is closed."""
    share = -(-nbytes // threads)
    paths = [folder / f"raw{i}.bin" for i in range(threads)]

    def one(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < share:
                done += os.write(fd, payload[: min(BLOCK, share - done)])
            os.fsync(fd)
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, paths))
    return paths


def raw_read(paths: list[Path]) -> int:
    def one(path):
        buf, got = bytearray(BLOCK), 0
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                got += n
        return got

    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        return sum(pool.map(one, paths))


def test_array(n: int, dtype: str) -> np.ndarray:
    """A deterministic n x n array: smooth terrain with centimetre noise (floats), its values folded
    into the dtype's range (uint8), blocky labels (uint32, as a depression or basin map)."""
    rng = np.random.default_rng(1)
    y = np.linspace(0, 6 * np.pi, n, dtype=np.float32)[:, None]
    x = np.linspace(0, 4 * np.pi, n, dtype=np.float32)[None, :]
    z = 300 * np.sin(y) * np.cos(x) + 80 * np.sin(3.1 * x + 1.7 * y) + 500
    z += rng.normal(0, 0.01, (n, n)).astype(np.float32)
    if dtype.startswith("float"):
        return z.astype(dtype)
    if dtype == "uint8":
        return (z.astype(np.int64) % 256).astype(np.uint8)
    labels = (np.arange(n)[:, None] // 61) * (n // 47 + 1) + np.arange(n)[None, :] // 47
    return np.where(z > 450, labels, 0).astype(np.uint32)


def chunks_of(values: np.ndarray, tile: int) -> list[np.ndarray]:
    return [np.ascontiguousarray(values[r : r + tile, c : c + tile])
            for r in range(0, values.shape[0], tile) for c in range(0, values.shape[1], tile)]


def codec(values: np.ndarray, tile: int, level: int, threads: int, reps: int) -> dict:
    """Encode, decode and crc32c of the array's chunks on ``threads`` threads (the crc32c the store
    computes: :func:`terrain_io.integrity.crc32c`, which lets go of the GIL)."""
    from numcodecs import Zstd

    from terrain_io.integrity import crc32c

    parts = chunks_of(values, tile)
    zstd = Zstd(level=level)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        enc = timed(lambda: list(pool.map(zstd.encode, parts)), reps)
        encoded = enc[2]
        dec = timed(lambda: list(pool.map(zstd.decode, encoded)), reps)
        crc = timed(lambda: list(pool.map(crc32c, encoded)), reps)
        crc_raw = timed(lambda: list(pool.map(crc32c, parts)), reps)
    return {"encode": enc[:2], "decode": dec[:2], "crc": crc[:2], "crc_raw": crc_raw[:2],
            "compressed": sum(len(e) for e in encoded)}


def store_write(folder: Path, name: str, values: np.ndarray, threads: int) -> list[Path]:
    """Our store's write of one result array, whole shards from ``threads`` threads, each shard file
    fsync'd by its writer once written (as each raw floor file is), the rest of the result's files
    (metadata, coordinates, manifest) after it is complete."""
    from terrain_io.store import TerrainStore, fill_value_for, write_window

    def sync(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    store = TerrainStore.open(folder / "bench.zarr", mode="r+")
    with store.write_result(name) as writer:
        arr = writer.create_array("values", values.dtype, fill_value_for(values.dtype, None))
        wins = list(store.shards())

        def one(w):
            write_window(arr, w, values[w.slices], True)
            shard = Path(arr.store.root, arr.path, arr.metadata.encode_chunk_key((w.r0 // arr.shards[0],
                                                                                   w.c0 // arr.shards[1])))
            if shard.exists():
                sync(shard)

        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(wins)))) as pool:
            list(pool.map(one, wins))
    root = folder / "bench.zarr" / name
    files = [p for p in root.rglob("*") if p.is_file()]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(files)))) as pool:
        list(pool.map(sync, [p for p in files if "/c/" not in p.as_posix()[len(str(root)):]]))
    return files


def store_read(folder: Path, name: str, threads: int) -> np.ndarray:
    from terrain_io.store import TerrainStore

    store = TerrainStore.open(folder / "bench.zarr", mode="r")
    # (the array looked up as the store's read looks it up, once: a second lookup through zarr's group
    # read its zarr.json again, cold, before any shard -- a step of this benchmark's, not of the store's)
    out = np.empty(store.shape, store.array(f"{name}/values").dtype)
    wins = list(store.shards())

    def one(w):
        store.read(w, f"{name}/values", out=out[w.slices])  # decoded in place, as the pipelines' bands are

    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(wins)))) as pool:
        list(pool.map(one, wins))
    return out


def commit(root) -> str:
    try:
        git = ["git", "-C", str(root)]
        top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
        if Path(top.stdout.strip()).resolve() != Path(root).resolve().parent:  # a copy inside another checkout
            return "? (not a git checkout)"
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="side of each square test array (cells)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads (default: all cores)")
    ap.add_argument("--reps", type=int, default=3, help="best of this many of each measurement")
    ap.add_argument("--raw-bytes", type=float, default=0,
                    help="MiB the raw disk measurement moves (default: one float32 array, at least 256 MiB)")
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: the system temp folder)")
    args = ap.parse_args()

    import numcodecs
    import zarr

    import terrain_io

    from terrain_io import store as store_mod
    from terrain_io.store import DEFAULT_TILE, TerrainStore

    n, threads, reps = args.size, args.threads, args.reps
    level = store_mod._COMPRESSOR.level
    folder = Path(tempfile.mkdtemp(prefix="bench_io.", dir=args.dir))
    mib = 1 << 20
    try:
        raw_bytes = int(args.raw_bytes * mib) or max(n * n * 4, 256 * mib)
        print(f"# bench_io: {n}^2, {threads} threads, best of {reps}; {platform.node()} {platform.machine()}, "
              f"{os.cpu_count()} cores; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
              f"terrain_io of {Path(terrain_io.__file__).parents[1]} commit {commit(Path(terrain_io.__file__).parent)}; "
              f"numcodecs {numcodecs.__version__}, zarr {zarr.__version__}; disk {folder}")
        raw = folder / "raw"
        raw.mkdir()
        payload = np.random.default_rng(0).integers(0, 256, BLOCK, dtype=np.uint8).tobytes()
        # (each write into new files, the last ones removed outside its time, as the store's result is)
        w = timed(lambda: raw_write(raw, raw_bytes, threads, payload), reps,
                  lambda: [p.unlink() for p in raw.iterdir()])
        paths = w[2]
        # (the pages dropped before each read, outside its time, as the store's read's are)
        r = timed(lambda: raw_read(paths), reps, lambda: [drop_cache(p) for p in paths])
        shutil.rmtree(raw)
        write_bw, read_bw = raw_bytes / w[0], raw_bytes / r[0]
        print("\n| floor | MiB | wall s | CPU s | MB/s |\n|---|---|---|---|---|")
        print(f"| raw write, {threads} files, fsync'd | {raw_bytes / mib:.0f} | {w[0]:.3f} | {w[1]:.2f} "
              f"| {write_bw / 1e6:.0f} |")
        print(f"| raw read, cold | {raw_bytes / mib:.0f} | {r[0]:.3f} | {r[1]:.2f} | {read_bw / 1e6:.0f} |")

        TerrainStore.create(folder / "bench.zarr", (n, n), "float32").seal()
        # The store's chunk kernels loaded first (terrain_io.chunkcodec), as a pipeline has them by its writes:
        # its own kernels start numba (the first kernel a process runs pays ~0.25 s, once; a cold cache compiles).
        from terrain_io import chunkcodec

        chunkcodec.load()
        rows = []
        for dtype in args.dtypes:
            values = test_array(n, dtype)
            nbytes = values.nbytes
            c = codec(values, DEFAULT_TILE, level, threads, reps)
            name = f"w{dtype}"

            sw = timed(lambda: store_write(folder, name, values, threads), reps,
                       lambda: shutil.rmtree(folder / "bench.zarr" / name, ignore_errors=True))
            for p in sw[2]:
                drop_cache(p)

            sr = timed(lambda: store_read(folder, name, threads), reps, lambda: [drop_cache(p) for p in sw[2]])
            if not np.array_equal(sr[2], values):
                raise SystemExit(f"bench_io: {dtype}: the store read back other values than written")
            disk = sum(p.stat().st_size for p in sw[2])
            floor_w = max(c["encode"][0] + c["crc"][0], disk / write_bw)
            floor_r = max(disk / read_bw, c["decode"][0] + c["crc"][0])
            rows.append((dtype, nbytes, disk, c, sw, sr, floor_w, floor_r))
        print(f"\n| codec ({threads} threads) | MiB raw | ratio | zstd-{level} encode MB/s | decode MB/s "
              f"| crc32c MB/s (encoded) | crc32c MB/s (raw) | encode + crc32c CPU s |\n"
              f"|---|---|---|---|---|---|---|---|")
        for dtype, nbytes, disk, c, *_ in rows:
            print(f"| {dtype} | {nbytes / mib:.0f} | {nbytes / c['compressed']:.2f} | "
                  f"{nbytes / c['encode'][0] / 1e6:.0f} | {nbytes / c['decode'][0] / 1e6:.0f} | "
                  f"{c['compressed'] / c['crc'][0] / 1e6:.0f} | {nbytes / c['crc_raw'][0] / 1e6:.0f} | "
                  f"{c['encode'][1] + c['crc'][1]:.2f} |")
        print("\n| store | write wall s | CPU s | MB/s | floor s | % floor | read wall s | CPU s | MB/s | floor s "
              "| % floor | write, read: every rep s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
        for dtype, nbytes, disk, c, sw, sr, floor_w, floor_r in rows:
            print(f"| {dtype} ({disk / mib:.1f} MiB on disk) | {sw[0]:.3f} | {sw[1]:.2f} | {nbytes / sw[0] / 1e6:.0f} "
                  f"| {floor_w:.3f} | {100 * floor_w / sw[0]:.0f}% | {sr[0]:.3f} | {sr[1]:.2f} | "
                  f"{nbytes / sr[0] / 1e6:.0f} | {floor_r:.3f} | {100 * floor_r / sr[0]:.0f}% | "
                  f"{' '.join(f'{t:.3f}' for t in sw[3])}; {' '.join(f'{t:.3f}' for t in sr[3])} |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
