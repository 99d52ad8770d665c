"""The in-core GPU SSSP's write (issue 31): :func:`terrain_io.pinned.write_bands` on a stored SSSP
result's distances and predecessors (decoded onto the GPU first), by bands of shard rows a call of
nvCOMP's encoder, the frames copied into pinned or plain host buffers (made before the timing, their
pages not touched): with writers that do nothing (the GPU's encode and the frames' copy alone) and
with writers that only checksum the frames (their GIL against the encoding thread's).
Needs a GPU and nvCOMP.

    python benchmarks/probe_sssp_write.py STORE sssp/NAME [BANDS_A_CALL ...]
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cupy as cp

from terrain_io import chunkcodec, pinned, store as store_mod
from terrain_io.pinned import PinnedBands, read_device, write_bands
from terrain_io.store import TerrainStore
from terrain_io.timings import Timings


def main(path: str, result: str, per_calls: list[int]) -> None:
    st = TerrainStore.open(path, mode="r")
    arrays = [st.group[f"{result}/distance"], st.group[f"{result}/predecessor"]]
    held = [read_device(st, f"{result}/{name}", 16) for name in ("distance", "predecessor")]
    nsr, nsc = st.shard_grid
    bands = [[st.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    real = store_mod.write_frames

    def crc_only(arr, sr, sc, frames, sums=None):  # (sums: the GPU's, which the real writers take instead)
        chunkcodec.checksums([f for f in frames if f is not None])

    def probe(sets, per_call, kind):
        for label, fn in (("no writers", lambda *a: None), ("checksums only", crc_only), ("no writers", lambda *a: None)):
            store_mod.write_frames = fn
            tm = Timings()
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                write_bands(arrays, bands, lambda r0, r1: [h[r0:r1] for h in held], sets, pool, None, tm, per_call)
            wall = time.perf_counter() - t
            store_mod.write_frames = real
            print(f"{per_call} band(s) a call, {kind}, {label}: {wall:.3f} s; {tm.rounded()}", flush=True)

    for per_call in per_calls:
        nbytes = pinned._headroom(per_call * st.tile_size * st.shard_size * st.shape[1] * 5)
        for kind in ("pinned",):  # (session 20 also had plain memory: the pinning cost more before empty_pinned)
            sets = PinnedBands(2)
            t = time.perf_counter()
            for k in range(2):
                sets.buffer(k, "frames", (nbytes,), "u1")
            print(f"{kind}: 2 x {nbytes / 2**20:.0f} MiB in {time.perf_counter() - t:.3f} s (not touched)", flush=True)
            probe(sets, per_call, kind)
            sets.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3:]] or [1, 2, 4])
