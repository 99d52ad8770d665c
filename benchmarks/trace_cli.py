"""Where a fresh ``terrain`` process spends its wall, thread by thread: the command run as the
``terrain`` program (``python -m cli``) under a sampler thread that reads every thread's stack each
``--every`` ms (``sys._current_frames``; a sample waits for the GIL, so a thread holding it long
shows as a gap), from the process's start (``/proc``) to the command's return; then each thread's
runs of the same innermost frame of this repository (its innermost frame of any code beside it),
merged where shorter than ``--merge`` ms, as text on stderr, and the interpreter's exit timed by the
caller (the CLI wall less ``main returned``).

    python benchmarks/trace_cli.py [--every 2] [--merge 20] -- streams STORE --threshold 1000 -o x.gpkg
"""
from __future__ import annotations

import os
import sys
import threading
import time


def _since_start() -> float:
    """Seconds since this process started (its start time in clock ticks since boot, /proc)."""
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - start


def _label(frame, root: str) -> str:
    """The innermost frame of this repository (file:function), with the innermost frame of all."""
    inner = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith(root):
            own = f"{os.path.relpath(f.f_code.co_filename, root)}:{f.f_code.co_name}"
            return own if f is frame else f"{own} < {inner}"
        f = f.f_back
    return f"({inner})"


def main() -> None:
    args = sys.argv[1:]
    every, merge = 2.0, 20.0
    while args and args[0] != "--":
        opt, value, args = args[0], float(args[1]), args[2:]
        every, merge = (value, merge) if opt == "--every" else (every, value)
    argv = args[1:]
    import importlib.util

    root = os.path.dirname(os.path.dirname(importlib.util.find_spec("cli").origin)) + os.sep  # (the tree run)
    offset = _since_start() - time.perf_counter()  # perf_counter -> seconds since the process started
    samples: list = []  # (t, {thread name: label})
    done = threading.Event()

    def sample():
        me = threading.get_ident()
        while not done.wait(every / 1000):
            names = {t.ident: t.name for t in threading.enumerate()}
            now = time.perf_counter() + offset
            samples.append((now, {names.get(i, str(i)): _label(f, root) for i, f in sys._current_frames().items()
                                  if i != me}))

    threading.Thread(target=sample, name="sampler", daemon=True).start()
    sys.argv = ["terrain", *argv]
    import runpy

    try:
        runpy.run_module("cli", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        end = time.perf_counter() + offset
        done.set()
        _report(samples, end, merge / 1000)
        _free_gpu_pools()


def _free_gpu_pools() -> None:
    """Time what the exit frees where CuPy was used: its pinned host blocks (each unpinned) and its
    device blocks (the interpreter's exit frees them otherwise, untimed)."""
    if "cupy" not in sys.modules:
        return
    import cupy

    t = time.perf_counter()
    pinned = cupy.get_default_pinned_memory_pool()
    held = pinned.n_free_blocks()
    pinned.free_all_blocks()
    t1 = time.perf_counter()
    device = cupy.get_default_memory_pool()
    total = device.total_bytes()
    device.free_all_blocks()
    t2 = time.perf_counter()
    print(f"trace: exit's frees: {held} pinned blocks {t1 - t:.3f} s, {total / 2**20:.0f} MiB of device blocks "
          f"{t2 - t1:.3f} s", file=sys.stderr)


IDLE = ("(thread.py:_worker)", "(selectors.py:select)", "(threading.py:wait)", "(queues.py:get)")  # a pool's idle threads


def _report(samples, end: float, merge: float) -> None:
    runs: dict = {}  # thread -> [[t0, t1, label, count]]
    for t, threads in samples:
        for name, label in threads.items():
            if label in IDLE:
                continue
            seq = runs.setdefault(name, [])
            if seq and seq[-1][2] == label:
                seq[-1][1], seq[-1][3] = t, seq[-1][3] + 1
            else:
                seq.append([t, t, label, 1])
    out = sys.stderr
    first = samples[0][0] if samples else end
    print(f"trace: first sample {first:.3f} s after the process started, main returned at {end:.3f} s, "
          f"{len(samples)} samples", file=out)
    for name, seq in runs.items():
        print(f"-- thread {name}", file=out)
        shown = []
        for r in seq:  # short runs folded into the run before
            if shown and r[1] - r[0] < merge and shown[-1][1] >= r[0] - 0.05:
                shown[-1][1] = r[1]
                shown[-1][4][r[2]] = shown[-1][4].get(r[2], 0) + r[3]
            else:
                shown.append([r[0], r[1], r[2], r[3], {r[2]: r[3]}])
        for t0, t1, _, _, labels in shown:
            top = sorted(labels.items(), key=lambda kv: -kv[1])[:2]
            print(f"  {t0:6.3f}-{t1:6.3f}  " + " | ".join(f"{k} x{v}" for k, v in top), file=out)


if __name__ == "__main__":
    main()
