"""Reliability: killed runs, Ctrl-C, full disks and read-only folders never cost data or give a
wrong result that looks right (issue "Reliability").

The kill harness starts ``terrain convert``, ``terrain mst`` and ``terrain sssp`` as subprocesses
on a mid-size DEM and SIGKILLs them at seeded random moments. After every kill the source file
and the store's elevation are unchanged (checksums), any result that is present equals the clean
run's, and a rerun succeeds and equals the clean run. ``TERRAIN_KILL_TRIALS`` sets the number of
trials (default 9 in the normal test run; the full run uses 30 or more).
"""
from __future__ import annotations

import hashlib
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from references import VOLATILE, ascii_dem, make_read_only, make_writable, tree_digest

pytestmark = pytest.mark.reliability

TRIALS = int(os.environ.get("TERRAIN_KILL_TRIALS", "9"))
SIZE = 768


def terrain(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "-q", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run_ok(*args):
    proc = terrain(*args)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    return out


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(store: Path, result: str) -> dict | None:
    """Arrays and stable attributes of a result group, or None when absent."""
    if not (store / result / "zarr.json").exists():
        return None
    if result == "elevation":  # a converted store: its elevation and the group's attributes
        return {"attrs": {k: v for k, v in zarr.open_group(str(store), mode="r").attrs.items() if k not in VOLATILE},
                "elevation": zarr.open_array(str(store / result), mode="r")[:]}
    group = zarr.open_group(str(store / result), mode="r")
    snap = {"attrs": {k: v for k, v in group.attrs.items() if k not in VOLATILE}}
    for name, node in group.members(max_depth=None):
        if isinstance(node, zarr.Array):
            snap[name] = node[...]
    return snap


def assert_same(a: dict | None, b: dict | None):
    assert a is not None and b is not None
    assert a.keys() == b.keys() and a["attrs"] == b["attrs"]
    for k in a:
        if k != "attrs":
            np.testing.assert_array_equal(a[k], b[k])


def leftovers(folder: Path) -> list[str]:
    """Temporaries in ``folder`` and inside its stores (where results and scratch are staged)."""
    places = [folder, *(p for p in folder.glob("*.zarr") if p.is_dir())]
    return sorted(str(p.relative_to(folder)) for place in places for p in place.iterdir()
                  if ".partial-" in p.name or ".scratch-" in p.name)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A mid-size DEM as ASCII, its clean store, and the clean results of each command."""
    root = tmp_path_factory.mktemp("reliability")
    src = ascii_dem(root, SIZE)
    base = root / "base.zarr"
    run_ok("convert", src, "-o", base, "--tile", "64", "--shard", "2")
    commands = {
        "convert": lambda d: ["convert", src, "-o", d / "out.zarr", "--tile", "64", "--shard", "2", "--overwrite"],
        "mst": lambda d: ["mst", d / "dem.zarr", "--device", "cpu"],
        "sssp": lambda d: ["sssp", d / "dem.zarr", "--cell", "--source", "300,400", "--name", "k", "--device", "cpu",
                           "--method", "index"],
    }
    outputs = {"convert": ("out.zarr", "elevation"), "mst": ("dem.zarr", "mst"), "sssp": ("dem.zarr", "sssp/k")}
    clean, duration = {}, {}
    for cmd, make in commands.items():  # kernels compiled first: the kills are drawn over a warm run's length
        d = root / f"warm-{cmd}"
        d.mkdir()
        shutil.copytree(base, d / "dem.zarr")
        run_ok(*make(d))
        shutil.rmtree(d)
    for cmd, make in commands.items():
        d = root / f"clean-{cmd}"
        d.mkdir()
        shutil.copytree(base, d / "dem.zarr")
        t = time.perf_counter()
        run_ok(*make(d))
        duration[cmd] = time.perf_counter() - t
        store, result = outputs[cmd]
        clean[cmd] = snapshot(d / store, result)
    return dict(root=root, src=src, base=base, commands=commands, outputs=outputs, clean=clean, duration=duration,
                src_digest=file_digest(src), elevation_digest=tree_digest(base / "elevation"))


def test_sigkill_at_random_moments_never_costs_data_or_correctness(world):
    rng = random.Random(2026)
    names = list(world["commands"])
    survived = 0
    for trial in range(TRIALS):
        cmd = names[trial % len(names)]
        d = world["root"] / f"trial-{trial}"
        d.mkdir()
        shutil.copytree(world["base"], d / "dem.zarr")
        store, result = world["outputs"][cmd]
        proc = terrain(*world["commands"][cmd](d))
        time.sleep(rng.uniform(0.05, world["duration"][cmd] * 1.1))
        proc.kill()
        proc.communicate()
        # the inputs are untouched
        assert file_digest(world["src"]) == world["src_digest"]
        assert tree_digest(d / "dem.zarr" / "elevation") == world["elevation_digest"]
        # whatever looks complete is correct
        found = snapshot(d / store, result)
        if found is not None:
            assert_same(found, world["clean"][cmd])
        # and a rerun succeeds, equals the clean run, and leaves no leftovers
        run_ok(*world["commands"][cmd](d))
        assert_same(snapshot(d / store, result), world["clean"][cmd])
        assert leftovers(d) == [], (cmd, trial)
        survived += 1
        shutil.rmtree(d)
    assert survived == TRIALS


@pytest.mark.parametrize("cmd", ["convert", "mst", "sssp"])
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_interrupt_is_one_line_exit_code_and_no_temporaries(world, cmd, sig, code, word):
    d = world["root"] / f"int-{cmd}-{code}"
    d.mkdir()
    shutil.copytree(world["base"], d / "dem.zarr")
    proc = terrain(*world["commands"][cmd](d))
    deadline = time.monotonic() + 60
    while not leftovers(d) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # signal the run while it is writing its temporaries
    proc.send_signal(sig)
    out, err = proc.communicate()
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"terrain: {word}"]
    assert leftovers(d) == []
    store, result = world["outputs"][cmd]
    assert snapshot(d / store, result) is None or cmd == "convert" and not (d / "out.zarr").exists()


def _limit_file_size(nbytes):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


@pytest.mark.parametrize("cmd", ["convert", "mst", "sssp"])
def test_full_disk_is_a_clear_error_and_leaves_no_partial_result(world, cmd):
    d = world["root"] / f"full-{cmd}"
    d.mkdir()
    shutil.copytree(world["base"], d / "dem.zarr")
    proc = terrain(*world["commands"][cmd](d), preexec_fn=_limit_file_size(2_000))
    out, err = proc.communicate()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: error:") and "File too large" in lines[0], err
    assert leftovers(d) == []
    store, result = world["outputs"][cmd]
    assert snapshot(d / store, result) is None
    assert tree_digest(d / "dem.zarr" / "elevation") == world["elevation_digest"]


@pytest.mark.parametrize("cmd", ["convert", "mst"])
def test_read_only_output_folder_is_a_clear_error(world, tmp_path, cmd):
    shutil.copytree(world["base"], tmp_path / "dem.zarr")
    target = tmp_path if cmd == "convert" else tmp_path / "dem.zarr"  # mst writes inside the store only
    make_read_only(target)
    try:
        proc = terrain(*world["commands"][cmd](tmp_path))
        out, err = proc.communicate()
        assert proc.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("terrain: error:"), err
        assert "Permission denied" in lines[0] or "Operation not permitted" in lines[0] or "Read-only" in lines[0]
    finally:
        make_writable(target)
    assert leftovers(tmp_path) == [] and not (tmp_path / "out.zarr").exists()
    assert snapshot(target if cmd == "mst" else tmp_path, "mst") is None


def test_concurrent_sssp_runs_on_one_store_are_both_correct(world, tmp_path):
    """Two sources at once on a store without an index, and `terrain info` polling meanwhile: the
    index is built once, both results equal their sequential runs, info never sees a half result."""
    shutil.copytree(world["base"], tmp_path / "dem.zarr")
    store = tmp_path / "dem.zarr"
    z = zarr.open_array(str(store / "elevation"), mode="r")[:]
    valid = np.argwhere(np.isfinite(z))
    picks = valid[[len(valid) // 5, 4 * len(valid) // 5]]
    runs = {"a": f"{picks[0][0]},{picks[0][1]}", "b": f"{picks[1][0]},{picks[1][1]}"}
    procs = [terrain("sssp", store, "--cell", "--source", src, "--name", name, "--device", "cpu", "--method", "index")
             for name, src in runs.items()]
    polls = 0
    while any(p.poll() is None for p in procs):
        info = subprocess.run([sys.executable, "-m", "cli", "info", str(store), "--json"], capture_output=True,
                              text=True)
        assert info.returncode == 0, info.stderr
        polls += 1
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err
    assert polls > 0
    reused = sorted(zarr.open_group(str(store / "sssp" / name), mode="r").attrs["index_reused"] for name in runs)
    assert reused == [False, True]  # the second run waited for the index the first one built
    for name, src in runs.items():
        seq = tmp_path / f"seq-{name}"
        seq.mkdir()
        shutil.copytree(world["base"], seq / "dem.zarr")
        run_ok("sssp", seq / "dem.zarr", "--cell", "--source", src, "--name", name, "--device", "cpu", "--method",
               "index")
        assert_same(snapshot(store, f"sssp/{name}"), snapshot(seq / "dem.zarr", f"sssp/{name}"))
    assert leftovers(tmp_path) == []
