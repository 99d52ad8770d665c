"""The codec and level per array, by measurement (issue 31): size and one-core speed of candidate chunk
codecs on the arrays of real and synthetic stores.

For each array named (a store's ``elevation`` or a result's array), its chunks (the store's tiles)
are encoded and decoded on one thread by each candidate; reported are the compression ratio (raw /
encoded bytes) and encode and decode MB/s of raw bytes (CPU time of the thread, so a loaded machine
does not distort it). Candidates: zstd levels 1 (the store's) and 3, lz4, and a byte shuffle (the
dtype's width) before zstd-1 and lz4 -- numcodecs' implementations, the ones zarr's codecs wrap.

    python benchmarks/bench_codecs.py s.zarr elevation fill/depth fill/depression mst/edges
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def candidates(itemsize: int) -> dict:
    from numcodecs import LZ4, Shuffle, Zstd

    shuffle = Shuffle(elementsize=itemsize)
    chains = {"zstd-1": [Zstd(1)], "zstd-3": [Zstd(3)], "lz4": [LZ4(1)]}
    if itemsize > 1:
        chains.update({"shuffle+zstd-1": [shuffle, Zstd(1)], "shuffle+lz4": [shuffle, LZ4(1)]})
    return chains


def measure(chunks: list[np.ndarray], chain: list, reps: int) -> tuple[float, float, float]:
    """(ratio, encode MB/s, decode MB/s) of ``chain`` over ``chunks``, best CPU time of ``reps``."""
    raw = sum(c.nbytes for c in chunks)

    def encode():
        out = []
        for c in chunks:
            b = c
            for codec in chain:
                b = codec.encode(b)
            out.append(b)
        return out

    def decode(encoded):
        for b in encoded:
            for codec in reversed(chain):
                b = codec.decode(b)

    enc_s, dec_s = float("inf"), float("inf")
    for _ in range(reps):
        t = time.thread_time()
        encoded = encode()
        enc_s = min(enc_s, time.thread_time() - t)
        t = time.thread_time()
        decode(encoded)
        dec_s = min(dec_s, time.thread_time() - t)
    size = sum(len(memoryview(b).cast("B")) for b in encoded)
    return raw / size, raw / max(enc_s, 1e-9) / 1e6, raw / max(dec_s, 1e-9) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("arrays", nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-chunks", type=int, default=256, help="chunks sampled evenly from each array")
    args = ap.parse_args()

    from terrain_io.store import TerrainStore

    st = TerrainStore.open(args.store, mode="r")
    t = st.tile_size
    print(f"# bench_codecs: {args.store} ({st.shape[0]} x {st.shape[1]}, tile {t}); one thread, CPU time, "
          f"best of {args.reps}\n")
    print("| array | dtype | codec | ratio | encode MB/s | decode MB/s |\n|---|---|---|---|---|---|")
    for name in args.arrays:
        arr = st.group[name]
        ntr, ntc = st.tile_grid
        cells = [(r, c) for r in range(ntr) for c in range(ntc)]
        pick = np.linspace(0, len(cells) - 1, min(args.max_chunks, len(cells))).astype(int)
        chunks = []
        for k in pick:
            w = st.tile_window(*cells[k])
            c = np.full((t, t), arr.fill_value, arr.dtype)
            c[: w.shape[0], : w.shape[1]] = st.read(w, name)
            chunks.append(c)
        for label, chain in candidates(arr.dtype.itemsize).items():
            ratio, enc, dec = measure(chunks, chain, args.reps)
            print(f"| {name} | {arr.dtype} | {label} | {ratio:.2f} | {enc:.0f} | {dec:.0f} |", flush=True)


if __name__ == "__main__":
    main()
