"""What pinning host memory costs on this machine, and what it buys: cudaHostAlloc (CuPy's
empty_pinned) against plain NumPy memory touched and then registered (cudaHostRegister), with
transparent huge pages asked for (madvise) or not; then the copies GPU -> host and host -> GPU into
each kind. Prints one line a case (seconds, GB/s).

    python benchmarks/probe_pinning.py [--gb 1.0] [--reps 3]
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import time

import numpy as np


def _thp() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return "?"


_MAPS: list = []


def _anonymous(nbytes: int, huge: bool) -> np.ndarray:
    """nbytes of anonymous memory (2 MiB aligned), huge pages asked for with madvise when ``huge``."""
    m = mmap.mmap(-1, nbytes + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(m, np.uint8)
    off = (-base.ctypes.data) % (2 << 20)
    arr = base[off : off + nbytes]
    if huge:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.madvise(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(nbytes), 14)  # MADV_HUGEPAGE
        if rc != 0:
            print("madvise failed", ctypes.get_errno())
    _MAPS.append(m)  # (the mapping kept while the view is used)
    return arr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import cupy as cp
    import cupyx

    n = int(a.gb * (1 << 30))
    print("THP:", _thp())
    dev = cp.arange(n // 4, dtype=cp.float32).view(cp.uint8)
    cp.cuda.Device().synchronize()

    def copies(host, label):
        for r in range(a.reps):
            t = time.perf_counter()
            dev.get(out=host)
            cp.cuda.Device().synchronize()
            d2h = time.perf_counter() - t
            t = time.perf_counter()
            dev.set(host)
            cp.cuda.Device().synchronize()
            h2d = time.perf_counter() - t
            print(f"  {label} rep {r}: GPU->host {d2h:.3f} s ({n / d2h / 1e9:.1f} GB/s), "
                  f"host->GPU {h2d:.3f} s ({n / h2d / 1e9:.1f} GB/s)")

    for rep in range(2):
        t = time.perf_counter()
        pinned = cupyx.empty_pinned(n, np.uint8)
        alloc = time.perf_counter() - t
        print(f"cudaHostAlloc {a.gb} GB: {alloc:.3f} s")
        copies(pinned, "pinned")
        del pinned
        for huge in (False, True):
            t0 = time.perf_counter()
            buf = _anonymous(n, huge)
            buf[:: 4096] = 1  # first touch of every page
            t1 = time.perf_counter()
            cp.cuda.runtime.hostRegister(buf.ctypes.data, n, 0)
            t2 = time.perf_counter()
            print(f"anonymous {'THP' if huge else '4K'} {a.gb} GB: touched {t1 - t0:.3f} s, registered {t2 - t1:.3f} s")
            copies(buf, "registered")
            t3 = time.perf_counter()
            cp.cuda.runtime.hostUnregister(buf.ctypes.data)
            print(f"  unregistered {time.perf_counter() - t3:.3f} s")
            copies(buf, "pageable (same pages)")
            del buf
        fresh = np.empty(n, np.uint8)
        copies(fresh, "pageable numpy (fresh)")


if __name__ == "__main__":
    main()
