"""Where bench_io's store write and read spend their time, thread by thread (issue 31).

Runs ``bench_io.store_write`` and ``bench_io.store_read`` (the read cold: the result's pages dropped
first) with timers wrapped around the store's phases -- store open, zarr lookups, metadata, each
chunk's encode and decode, pwritev, fsync, the shard files' opening and integrity checks -- and
prints per phase: calls, the time summed over threads, how many threads, the first start and last
end (s from the call's start). Beside it, the disk as /proc/diskstats and /proc/meminfo show it every
5 ms (MiB read and written, I/Os in flight, dirty and writeback MiB), so that idle stretches of the
disk show. Linux only; wrappers cost a little of their own, so take bench_io's times as the figures.

``PROBE_VARIANT`` (comma-separated) changes the store for a measurement: ``nowb`` (no write-out
started as shards are written), ``run16`` (a shard written in one run), ``ownenc`` (chunks encoded in
the writer's thread, not the codec pool), ``pool`` (reads decoded chunk by chunk in the codec pool, where the kernels cannot run), ``piece1``
(reads in 1 MiB pieces), ``piece4`` (in 4 MiB pieces, the store's in session 20), ``nofadv`` (no readahead asked for), ``window``
(readahead asked for two pieces ahead of the read, not the whole shard at once), ``own`` (each reader
decodes its own shard's runs, in its thread, as before session 21); ``PROBE_RUN_BYTES``: the raw bytes of a
run of chunks encoded in one call, ``PROBE_READ_RUN_BYTES`` of one decoded as a shard is read.
``PROBE_EVENTS``: a path prefix; each measurement's events (thread, phase, start, end) and disk samples
are written to PREFIX.<measurement>.tsv.

    PYTHONPATH=$PWD python benchmarks/probe_io_phases.py --size 8192 --reps 3
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_io  # noqa: E402

from terrain_io import atomic, integrity  # noqa: E402
from terrain_io import store as S  # noqa: E402

EVENTS: list[tuple[str, str, float, float]] = []  # (thread, phase, start, end), s from T0
T0 = [0.0]
READS: list[tuple] = []  # (thread, fd, offset, bytes, start, end) of each preadv


def record(name: str, t0: float, t1: float) -> None:
    EVENTS.append((threading.current_thread().name, name, t0 - T0[0], t1 - T0[0]))


def wrap(owner, attr: str, name: str | None = None) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(name or attr, t0, time.perf_counter())

    setattr(owner, attr, timed)


def wrap_context(owner, attr: str) -> None:
    fn = getattr(owner, attr)

    @contextlib.contextmanager
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        with fn(*args, **kwargs) as value:
            record(attr + ":enter", t0, time.perf_counter())
            yield value
            t1 = time.perf_counter()
        record(attr + ":exit", t1, time.perf_counter())

    setattr(owner, attr, timed)


def instrument(variants: set[str]) -> None:
    import zarr
    from numcodecs import Zstd

    chunk_encoder = S._chunk_encoder

    def timed_encoder(arr, block):
        cells, encode = chunk_encoder(arr, block)

        def timed_encode(ij):
            t0 = time.perf_counter()
            try:
                return encode(ij)
            finally:
                record("encode", t0, time.perf_counter())

        return cells, timed_encode

    S._chunk_encoder = timed_encoder
    from terrain_io import chunkcodec

    wrap(chunkcodec, "encode_run")  # (runs of chunks a GIL-free call: the store's path where it can)
    wrap(chunkcodec, "decode_run")
    if os.environ.get("PROBE_RUN_BYTES"):
        S._CODEC_RUN_BYTES = int(os.environ["PROBE_RUN_BYTES"])
    for attr in ("pwrite_all", "write_coordinates", "write_coordinate_files", "write_node", "create_tiled_array",
                 "_start_writeback", "_new_group", "_chunk_jobs", "write_shard", "read_shard"):
        if hasattr(S, attr):
            wrap(S, attr)
    wrap(S, "_checked", "crc_check")
    wrap_context(S, "_shard_file")
    wrap(S.TerrainStore, "open", "store_open")
    wrap(S.TerrainStore, "_require_parents")
    wrap_context(S.TerrainStore, "_unchanged")
    wrap(S.ResultWriter, "create_array")
    wrap(S._ShardFile, "__init__", "shard_open")
    wrap(S._ShardFile, "close", "shard_close")
    wrap(integrity, "seal")
    wrap(integrity.Integrity, "array", "integrity_array")
    wrap(integrity.Integrity, "check_trees")
    wrap(atomic, "replace")
    wrap(zarr.Group, "__getitem__", "zarr_lookup")
    wrap(os, "fsync")
    preadv = os.preadv

    def timed_preadv(fd, buffers, at, *rest):
        t0 = time.perf_counter()
        n = preadv(fd, buffers, at, *rest)
        t1 = time.perf_counter()
        record("preadv", t0, t1)
        READS.append((threading.current_thread().name, fd, at, n, t0 - T0[0], t1 - T0[0]))
        return n

    os.preadv = timed_preadv
    decode = Zstd.decode

    def timed_decode(self, buf, out=None):
        t0 = time.perf_counter()
        try:
            return decode(self, buf, out)
        finally:
            record("zstd_decode", t0, time.perf_counter())

    Zstd.decode = timed_decode
    if "nowb" in variants:
        S._start_writeback = lambda *args, **kwargs: None
    if "run16" in variants:
        S._RUN_BYTES = 16 << 20
    if "piece1" in variants:
        S._READ_PIECE = 1 << 20
    if "piece4" in variants:
        S._READ_PIECE = 4 << 20
    if "nofadv" in variants:
        fadvise = os.posix_fadvise
        os.posix_fadvise = lambda fd, at, n, advice: (None if advice == os.POSIX_FADV_WILLNEED
                                                      else fadvise(fd, at, n, advice))
    if "pool" in variants:
        S.owns_cores = lambda: True
    if os.environ.get("PROBE_READ_RUN_BYTES"):
        S._READ_RUN_BYTES = int(os.environ["PROBE_READ_RUN_BYTES"])
    if "own" in variants:  # each reader decodes its own runs, in its own thread
        class Own:
            @staticmethod
            def decode(fn, pieces):
                for runs in pieces:
                    for run in runs:
                        fn(run)

        S._READY_RUNS = Own()
    if "window" in variants:  # readahead two pieces ahead of the read, not the whole body at once
        fadvise = os.posix_fadvise

        def no_body_fadvise(fd, at, n, advice):
            if advice == os.POSIX_FADV_WILLNEED and at == 0:  # (the body's; the index's lies at the end)
                return None
            return fadvise(fd, at, n, advice)

        def windowed(fd, buf, jobs, arr, shard):  # S._read_ahead, the readahead asked for as it goes
            done, k, asked = 0, 0, 0
            while k < len(jobs):
                stop = min(len(buf), max(jobs[k][2] + jobs[k][3], done + S._READ_PIECE))
                want = min(len(buf), stop + 2 * S._READ_PIECE)
                if asked < want:
                    fadvise(fd, asked, want - asked, os.POSIX_FADV_WILLNEED)
                    asked = want
                while done < stop:
                    n = os.preadv(fd, [buf[done:stop]], done)
                    if n == 0:
                        raise RuntimeError("shard file cut")
                    done += n
                first = k
                while k < len(jobs) and jobs[k][2] + jobs[k][3] <= done:
                    k += 1
                yield jobs[first:k]

        os.posix_fadvise = no_body_fadvise
        S._read_ahead = windowed
    if "ownenc" in variants:
        S._PARALLEL_SHARD_BYTES = 1 << 62


def disk_of(folder: str) -> str:
    dev = os.stat(folder).st_dev
    for line in open("/proc/diskstats"):
        f = line.split()
        if (int(f[0]), int(f[1])) == (os.major(dev), os.minor(dev)):
            return f[2]
    return ""


class DiskSampler(threading.Thread):
    """/proc/diskstats (sectors read and written, I/Os in flight) and Dirty / Writeback every 5 ms."""

    def __init__(self, disk: str):
        super().__init__(daemon=True)
        self.disk, self.samples, self.stop = disk, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t, rd, wr, busy, mem = time.perf_counter() - T0[0], 0, 0, 0, {}
            for line in open("/proc/diskstats"):
                f = line.split()
                if f[2] == self.disk:
                    rd, wr, busy = int(f[5]), int(f[9]), int(f[11])
            for line in open("/proc/meminfo"):
                key, value = line.split(":", 1)
                if key in ("Dirty", "Writeback"):
                    mem[key] = int(value.split()[0])
            self.samples.append((t, rd, wr, busy, mem.get("Dirty", 0), mem.get("Writeback", 0)))
            time.sleep(0.005)

    def line(self) -> str:
        if not self.samples:
            return "disk: no samples"
        r0, w0, out, last = self.samples[0][1], self.samples[0][2], [], -1.0
        for t, rd, wr, busy, dirty, wb in self.samples:
            if t - last >= 0.02:
                out.append(f"{t * 1000:.0f}ms r{(rd - r0) / 2048:.0f} w{(wr - w0) / 2048:.0f} q{busy} "
                           f"d{dirty // 1024} wb{wb // 1024}")
                last = t
        return "disk MiB (r read, w written, q I/Os in flight, d dirty, wb writeback): " + " | ".join(out)


def arrival(total: float, sampler: DiskSampler) -> str:
    """When each reader's bytes were all in (its last preadv's end), against the disk's end and the read's:
    whether the shards come evenly or one after another, and what is left to decode after the disk."""
    last = collections.defaultdict(float)
    first = collections.defaultdict(lambda: float("inf"))
    for thread, _, _, _, a, b in READS:
        last[thread] = max(last[thread], b)
        first[thread] = min(first[thread], a)
    ins = sorted(last.values())
    rd0, rd1 = sampler.samples[0][1], sampler.samples[-1][1] if sampler.samples else 0
    disk_end = next((t for t, rd, *_ in sampler.samples if rd - rd0 >= 0.99 * (rd1 - rd0)), float("nan"))
    runs = collections.Counter("pool" if t.startswith(S._POOL_THREADS) else "reader"
                               for t, name, _, _ in EVENTS if name == "decode_run")
    after = sum(min(b, total) - max(a, disk_end) for t, name, a, b in EVENTS if name == "decode_run" and b > disk_end)
    ms = lambda v: f"{1000 * v:.0f}"  # noqa: E731
    return (f"arrival: first preadv {ms(min(first.values()))} ms; readers' bytes all in at "
            f"{' '.join(ms(v) for v in ins)} ms; disk 99% read at {ms(disk_end)} ms; end {ms(total)} ms; "
            f"decode runs by readers {runs['reader']}, by the pool {runs['pool']}; decode s after the disk {after:.3f}")


def measured(title: str, fn, disk: str):
    EVENTS.clear()
    READS.clear()
    sampler = DiskSampler(disk)
    T0[0] = time.perf_counter()
    sampler.start()
    out = fn()
    total = time.perf_counter() - T0[0]
    sampler.stop.set()
    sampler.join()
    print(f"\n## {title}: {total:.3f} s\n| phase | calls | s summed | threads | first start | last end | longest |"
          "\n|---|---|---|---|---|---|---|")
    phases = collections.defaultdict(list)
    for thread, name, a, b in EVENTS:
        phases[name].append((thread, a, b))
    for name, ev in sorted(phases.items(), key=lambda kv: min(a for _, a, _ in kv[1])):
        print(f"| {name} | {len(ev)} | {sum(b - a for _, a, b in ev):.4f} | {len({t for t, _, _ in ev})} "
              f"| {min(a for _, a, _ in ev):.4f} | {max(b for _, _, b in ev):.4f} | {max(b - a for _, a, b in ev):.4f} |")
    print(sampler.line())
    if READS:
        print(arrival(total, sampler))
    prefix = os.environ.get("PROBE_EVENTS")
    if prefix:
        with open(f"{prefix}.{title.replace(' ', '_')}.tsv", "w") as f:
            for thread, name, a, b in EVENTS:
                f.write(f"{thread}\t{name}\t{a:.6f}\t{b:.6f}\n")
            for thread, fd, at, n, a, b in READS:
                f.write(f"{thread}\tpread {fd} {at} {n}\t{a:.6f}\t{b:.6f}\n")
            for t, rd, wr, busy, dirty, wb in sampler.samples:
                f.write(f"disk\t{rd}\t{wr}\t{busy}\t{t:.6f}\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: the system temp folder)")
    args = ap.parse_args()
    variants = set(filter(None, os.environ.get("PROBE_VARIANT", "").split(",")))
    instrument(variants)
    print(f"# probe_io_phases: {args.size}^2 float32, {args.threads} threads; variants {sorted(variants) or 'none'}; "
          f"terrain_io of {Path(S.__file__).parents[1]}")
    folder = Path(tempfile.mkdtemp(prefix="probe_io.", dir=args.dir))
    disk = disk_of(str(folder))
    try:
        S.TerrainStore.create(folder / "bench.zarr", (args.size, args.size), "float32").seal()
        values = bench_io.test_array(args.size, "float32")
        S.codec_pool()
        from terrain_io import chunkcodec

        chunkcodec.load()  # (the chunk kernels loaded first, as bench_io does)
        for rep in range(args.reps):
            shutil.rmtree(folder / "bench.zarr" / "w", ignore_errors=True)
            os.sync()
            files = measured(f"write rep {rep}", lambda: bench_io.store_write(folder, "w", values, args.threads), disk)
            for p in files:
                bench_io.drop_cache(p)
            out = measured(f"read rep {rep}", lambda: bench_io.store_read(folder, "w", args.threads), disk)
            if not np.array_equal(out, values):
                raise SystemExit("probe_io_phases: the store read back other values than written")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
