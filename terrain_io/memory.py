"""Memory budgets (``--memory 2GB``) and peak-memory measurement for the out-of-core pipelines."""
from __future__ import annotations

import functools
import re
import resource
import sys

from .errors import TerrainError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
          "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4, "TB": 1024**4, "TIB": 1024**4}


def parse_size(text) -> int:
    """Bytes in a size such as ``2GB``, ``512M``, ``1.5GiB`` or ``1048576`` (binary units)."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise TerrainError(f"cannot read memory size {text!r} (examples: 2GB, 512MB, 1.5GiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise TerrainError(f"memory size must be positive, got {text!r}")
    return value


def _proc_bytes(path: str, key: str) -> int | None:
    """The ``key:`` line of a /proc file whose values are in kB (meminfo, status), in bytes; None
    where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory() -> int:
    """Bytes of RAM available now (MemAvailable), or 4 GiB when it cannot be read."""
    available = _proc_bytes("/proc/meminfo", "MemAvailable")
    return 4 * 1024**3 if available is None else available


def memory_budget(text=None, fraction: float = 0.5) -> int:
    """The budget in bytes: ``text`` parsed if given, else ``fraction`` of the available RAM."""
    return parse_size(text) if text is not None else int(available_memory() * fraction)


MMAP_THRESHOLD = 1 << 20  # glibc's mmap threshold under a budget (see return_freed_memory_to_os)


@functools.cache
def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def return_freed_memory_to_os(threshold: int = MMAP_THRESHOLD) -> None:
    """Make glibc serve every allocation of ``threshold`` bytes or more by mmap, given back on
    free (pipelines under a ``--memory`` budget call this at their start).

    Its default threshold grows to the largest block freed so far, after which batch-sized arrays
    come from per-thread heaps that keep their freed pages: with the pipeline's threads (reader,
    writers, merges, numba) resident memory then creeps well past the budget (measured: +98 MiB
    on an 8192^2 store under a 64 MiB budget, +55 MiB with this). At most two such heaps
    (arenas) besides the main one, too: each reader or writer thread would otherwise keep its own,
    each holding the high-water mark of its small allocations. Process-wide; Linux/glibc only.
    The shard SSSP asks for 128 KiB (glibc's own starting value): its units' blocks (256 KiB -
    1 MiB) crept in the heap at 1 MiB, +10.9-13.7 MiB at 4096^2 under 10 MB, 8.0-9.1 MiB at 128 KiB.
    Not for every pipeline: depressions' 8x test (2048 x 5120 under 5 MiB) grew by 6.5 MiB at
    128 KiB, 1.75 at 1 MiB (its blocks then reuse the heap the warm-up left).
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, int(threshold))  # M_MMAP_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes.

    Reads VmHWM (reset at exec, so a child started by fork+exec reports its own peak, unlike
    ru_maxrss, which can carry the parent's); falls back to getrusage elsewhere.
    """
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_rss() -> int:
    """Resident set size of this process now, in bytes (VmRSS; 0 where /proc is missing)."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


def reset_peak_rss() -> bool:
    """Reset the peak RSS (VmHWM) to the current RSS (Linux: ``5`` into /proc/self/clear_refs), so
    that :func:`peak_rss` then measures one step alone; False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
