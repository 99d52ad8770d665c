"""Where a first run's compilation goes: one ``terrain`` command in this process, with numba's
``numba:compile`` events recorded per kernel and signature (run it with a fresh ``NUMBA_CACHE_DIR``:
numba fires the event only on a cache miss).

A kernel's *total* includes the kernels compiled while it was (a callee's dispatcher compiles inside
its caller's type inference); *own* is total minus those nested compiles. Sorted by own CPU time.

    NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/profile_compile.py mst some.zarr
    NUMBA_CACHE_DIR=$(mktemp -d) TERRAIN_DEMO_HELPERS=0 python benchmarks/profile_compile.py demo -o DIR
    (the demo in one process: on a cold cache it would fork helpers, whose compilations this does not see)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    from numba.core import event

    records, stack = [], []

    class Listener(event.Listener):
        def on_start(self, ev):
            d = ev.data.get("dispatcher") if ev.data else None
            name = getattr(getattr(d, "py_func", None), "__qualname__", "?")
            module = getattr(getattr(d, "py_func", None), "__module__", "?")
            stack.append([f"{module.rsplit('.', 1)[-1]}.{name}", str(ev.data.get("args", "")), time.process_time(),
                          0.0])

        def on_end(self, ev):
            name, args, t0, nested = stack.pop()
            total = time.process_time() - t0
            if stack:
                stack[-1][3] += total
            records.append((name, args, total, total - nested))

    event.register("numba:compile", Listener())
    from cli.main import _register, cli

    _register()

    t0 = time.process_time()
    try:
        cli.main(argv, standalone_mode=False)
    finally:
        cpu = time.process_time() - t0
        by_kernel: dict[str, list] = {}
        for name, args, total, own in records:
            entry = by_kernel.setdefault(name, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += own
            entry[2] += total
        print(f"{'kernel':<60} {'builds':>6} {'own s':>7} {'total s':>8}", file=sys.stderr)
        for name, (n, own, total) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
            print(f"{name:<60} {n:>6} {own:7.2f} {total:8.2f}", file=sys.stderr)
        compiled = sum(own for *_, own in records)
        print(f"compile {compiled:.2f} s CPU of {cpu:.2f} s CPU in the command ({len(records)} builds)",
              file=sys.stderr)
        for name, args, total, own in records:  # kernels built for several signatures
            if by_kernel[name][0] > 1 and not name.startswith(("arrayobj", "builtins", "arraymath")):
                print(f"  {name} {own:.2f} s: {args}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
