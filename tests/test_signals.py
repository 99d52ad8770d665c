"""Ctrl-C and SIGTERM at any moment of a run -- the interpreter's imports, numba loading its cached
kernels, the computation, the writing of results and their commit -- end it the same way: exit 130
(SIGINT) or 143 (SIGTERM), exactly one line on stderr (``terrain: interrupted`` / ``terrain:
terminated``), no temporary and no file a clean run would not leave, any result present equal to a
clean run's, the inputs untouched (issue 27, "Safe under signals").

Randomized trials over ``convert``, ``mst``, ``sssp``, ``depressions`` and ``fill`` on a 256^2 DEM
with nodata, signalled a seeded delay after the command's first instruction: a quarter of the trials in the first 0.25 s (imports,
numba), the rest anywhere up to 1.1 times the clean run's duration. ``TERRAIN_SIGNAL_TRIALS`` sets
the count (default 20; the full run uses 1000: ``TERRAIN_SIGNAL_TRIALS=1000 pytest
tests/test_signals.py -m reliability``).
"""
from __future__ import annotations

import collections
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from references import VOLATILE, ascii_dem

pytestmark = pytest.mark.reliability

TRIALS = int(os.environ.get("TERRAIN_SIGNAL_TRIALS", "20"))
SIZE = 256
EXITS = {signal.SIGINT: (130, "terrain: interrupted"), signal.SIGTERM: (143, "terrain: terminated")}
TEMPORARY = (".partial", ".scratch-", ".old", ".tmp")


def _as_from_a_terminal():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job ignores SIGINT, and its children with it


def terrain(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "-q", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)


def first_instruction(proc: subprocess.Popen) -> float:
    """Wait until ``terrain`` runs its first instruction -- it blocks SIGINT and SIGTERM, then
    catches SIGTERM, which the interpreter's own start-up does not (``/proc/PID/status``) -- and
    return how long that took. Before it the interpreter's defaults hold, as for any Python program."""
    t0 = time.perf_counter()
    bits = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    while proc.poll() is None:
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
        except (OSError, ValueError):
            break
        if int(status["SigBlk"], 16) & bits or int(status["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)):
            break
        time.sleep(0.0002)
    return time.perf_counter() - t0


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + p.read_bytes())
    return h.hexdigest()


def snapshot(group_path: Path) -> dict | None:
    """Arrays and stable attributes of a result group (or a store), None when absent."""
    if not (group_path / "zarr.json").exists():
        return None
    group = zarr.open_group(str(group_path), mode="r")
    snap = {"attrs": {k: v for k, v in group.attrs.items() if k not in VOLATILE}}
    for name, node in group.members(max_depth=None):
        if isinstance(node, zarr.Array):
            snap[name] = node[...]
    return snap


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys() and a["attrs"] == b["attrs"]
    for k in a:
        if k != "attrs":
            np.testing.assert_array_equal(a[k], b[k])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 256^2 DEM as ASCII, its store, and each command's clean run: result, files and duration."""
    root = tmp_path_factory.mktemp("signals")
    src = ascii_dem(root, SIZE)
    base = root / "base.zarr"
    assert terrain("convert", src, "-o", base, "--tile", "64", "--shard", "2").wait() == 0
    commands = {
        "convert": (lambda d: ["convert", src, "-o", d / "out.zarr", "--tile", "64", "--shard", "2"], "out.zarr"),
        "mst": (lambda d: ["mst", d / "dem.zarr", "--device", "cpu"], "dem.zarr/mst"),
        "sssp": (lambda d: ["sssp", d / "dem.zarr", "--cell", "--source", "100,120", "--name", "k", "--device", "cpu"],
                 "dem.zarr/sssp/k"),
        "depressions": (lambda d: ["depressions", d / "dem.zarr", "--device", "cpu"], "dem.zarr/depressions"),
        "fill": (lambda d: ["fill", d / "dem.zarr", "--device", "cpu"], "dem.zarr/fill"),
    }
    clean = {}
    for name, (make, result) in commands.items():
        for _ in range(2):  # the second run only if the first compiled kernels (the trials time warm runs)
            d = root / f"clean-{name}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            shutil.copytree(base, d / "dem.zarr")
            t = time.perf_counter()
            proc = terrain(*make(d))
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            if "compiling" not in err and time.perf_counter() - t < 10:
                break
        clean[name] = dict(make=make, result=result, seconds=time.perf_counter() - t, files=files(d),
                           snapshot=snapshot(d / result))
    return dict(root=root, src=src, src_digest=hashlib.sha256(src.read_bytes()).hexdigest(), base=base,
                elevation=tree_digest(base / "elevation"), clean=clean)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to see the first instruction")
def test_a_signal_at_any_moment_is_one_line_its_exit_code_and_nothing_left(world):
    rng = random.Random(27)
    outcomes = collections.Counter()
    startup, failures = [], []
    for trial in range(TRIALS):
        name = rng.choice(sorted(world["clean"]))
        clean = world["clean"][name]
        sig = rng.choice(list(EXITS))
        delay = rng.uniform(0, 0.25) if trial % 4 == 0 else rng.uniform(0, 1.1 * clean["seconds"])
        d = world["root"] / f"trial-{trial}"
        d.mkdir()
        shutil.copytree(world["base"], d / "dem.zarr")
        before = files(d)
        proc = terrain(*clean["make"](d))
        startup.append(first_instruction(proc))
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
        what = f"trial {trial}: {name}, {signal.Signals(sig).name} after {delay:.3f} s"
        try:
            _check_trial(world, d, before, clean, proc, sig, err, outcomes)
        except AssertionError as exc:  # every trial runs: the report tells each kind of failure
            failures.append(f"{what}: {exc}")
        shutil.rmtree(d)
    assert hashlib.sha256(world["src"].read_bytes()).hexdigest() == world["src_digest"]
    print(f"{TRIALS} trials: {dict(outcomes)}, {len(failures)} failed; the interpreter reached the first "
          f"instruction in {np.median(startup) * 1e3:.0f} ms (median; max {max(startup) * 1e3:.0f} ms)")
    assert not failures, "\n".join(failures)
    assert TRIALS < 10 or outcomes["SIGINT"] and outcomes["SIGTERM"], outcomes  # both signals were felt


def _check_trial(world, d: Path, before: set, clean: dict, proc, sig, err: str, outcomes):
    if proc.returncode == 0:
        outcomes["finished first"] += 1
    else:
        code, line = EXITS[sig]
        assert (proc.returncode, err.splitlines()) == (code, [line]), f"exit {proc.returncode}\n{err}"
        outcomes[signal.Signals(sig).name] += 1
    left = files(d)
    assert left <= before | clean["files"], f"left {sorted(left - before - clean['files'])}"
    assert not [f for f in left if any(t in f.rsplit("/", 1)[-1] for t in TEMPORARY)], "temporaries left"
    found = snapshot(d / clean["result"])
    if found is not None:
        assert_same(found, clean["snapshot"])
    assert proc.returncode != 0 or found is not None, "exit 0 without its result"
    assert tree_digest(d / "dem.zarr" / "elevation") == world["elevation"], "the elevation changed"


def test_a_signal_during_a_commit_ends_the_run_after_it():
    """A signal inside :func:`terrain_io.interrupts.deferred` (a result's renames) is held until the
    section ends: the section completes, then the run ends with its line and exit status."""
    code = ("import os, signal, time\n"
            "from terrain_io import interrupts\n"
            "interrupts.install()\n"
            "with interrupts.deferred():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(0.2)\n"
            "    print('commit done', flush=True)\n"
            "print('not reached', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (143, "commit done\n", "terrain: terminated\n")


def test_a_program_calling_main_gets_its_signal_handlers_back():
    """``cli.main.main()`` called by another program (not the ``terrain`` command) leaves SIGINT,
    SIGTERM and SIGXFSZ as it found them, not ignored, once the command is over."""
    code = ("import signal; from cli.main import main\n"
            "nums = (signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ)\n"
            "before = [signal.getsignal(n) for n in nums]\n"
            "assert before[:2] == [signal.default_int_handler, signal.SIG_DFL], before\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "after = [signal.getsignal(n) for n in nums]\n"
            "assert after == before, (before, after)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
