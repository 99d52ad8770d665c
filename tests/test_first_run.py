"""A fast first run, kept fast (issue 27): on a cold numba cache ``terrain demo`` shares its work with
two helper processes (forks of itself). Their results are the demo's own (the same arrays as a demo
that runs every step in one process), their warm-ups compile every kernel signature the steps then
run, a helper that fails leaves its step to the demo, and a killed demo leaves no helper behind.
The cold timing itself is ``benchmarks/bench_first_run.py`` (its verdict is tested behind ``slow``)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from cli.main import _register, cli

_register()
ROOT = Path(__file__).resolve().parents[1]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the demo's helpers are Linux only")


def _arrays(store: Path) -> dict:
    group = zarr.open_group(str(store), mode="r")
    return {name: node[...] for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)}


@linux
def test_demo_with_helpers_writes_what_the_demo_alone_writes(tmp_path, monkeypatch):
    """The cold-cache layout (shortest paths, fill, flow and streams computed in the helper processes) and the
    one-process demo write the same arrays, pictures and summary lines."""
    from cli import demo
    from terrain_io import jit

    started = []
    start = demo._Helpers.start

    def spy(out):
        started.append(start(out))
        return started[-1]

    monkeypatch.setattr(demo._Helpers, "start", staticmethod(spy))
    monkeypatch.setattr(jit, "mark_compiled", lambda *a: None)
    outputs = {}
    for cold in (True, False):
        monkeypatch.setattr(jit, "compiled_before", lambda *a, cold=cold: not cold)
        result = CliRunner().invoke(cli, ["demo", "-o", str(tmp_path / str(cold))])
        assert result.exit_code == 0, result.output
        lines = [line.split(" (")[0] for line in result.output.splitlines() if line[:2] in {f"{k}." for k in range(1, 9)}]
        outputs[cold] = lines, _arrays(tmp_path / str(cold) / demo.STORE)
    assert len(started) == 1 and started[0] is not None and not started[0].procs  # both helpers were reaped
    assert sorted(started[0].lines) == ["fill", "flow", "sssp", "streams"]  # and sent their steps' lines
    assert [line[:2] for line in outputs[True][0]] == [f"{k}." for k in range(1, 9)]
    assert [line.replace("/True/", "/False/") for line in outputs[True][0]] == outputs[False][0]
    cold, warm = outputs[True][1], outputs[False][1]
    assert cold.keys() == warm.keys() and {"mst/edges", "fill/depth", "flow/accumulation", "streams/order"} <= cold.keys()
    for name in cold:
        np.testing.assert_array_equal(cold[name], warm[name], err_msg=name)
    for name in demo.FILES:
        assert (tmp_path / "True" / name).stat().st_size > 1000, name


def test_warm_ups_compile_every_kernel_the_steps_run(tmp_path):
    """The helpers' warm-ups (flow on a small DEM, streams on a small grid of directions) compile (or
    load) every kernel signature that the demo's flow and stream steps then run on the sample: none
    is added after them."""
    script = f"""
import numba
from pathlib import Path
from terrain_io.grid.flow import _cpu as flow_cpu
from terrain_io.grid.hydro import _cpu as hydro_cpu
from cli import demo
def signatures():
    kernels = [v for m in (flow_cpu, hydro_cpu) for v in vars(m).values()]
    return {{(k.py_func.__qualname__, s) for k in kernels if isinstance(k, numba.core.dispatcher.Dispatcher)
            for s in k.signatures}}
demo._warm_flow()
demo._warm_streams()
warm = signatures()
from terrain_io.convert import convert
from terrain_io.grid.fill import fill
from terrain_io.store import TerrainStore
out = Path({str(tmp_path)!r})
st = convert(demo.SAMPLE, out / demo.STORE, tile=demo.TILE, shard=demo.SHARD).path
fill(TerrainStore.open(st), progress=False)
demo._demo_flow(TerrainStore.open(st), out)
demo._demo_streams(TerrainStore.open(st), out)
print(sorted(signatures() - warm) or "none", sorted({{name for name, _ in warm}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    new, warmed = out.stdout.split(" ", 1)
    assert new == "none", out.stdout + out.stderr
    kernels = ("'accumulate'", "'flats'", "'d8_serial'", "'stream_cells'", "'walk_network'", "'link_orders'")
    assert all(k in warmed for k in kernels), warmed


_FAKE_LANE = """
import os, sys, time, tempfile
from pathlib import Path
from cli import demo
folder = Path(sys.argv[1])
def warm_forever(run):  # a helper busy compiling, with a temporary folder of its own
    tmp = tempfile.mkdtemp(prefix="warm-", dir=folder)
    demo._WARM.append(tmp)
    (folder / "ready.part").write_text(tmp)
    os.replace(folder / "ready.part", folder / "ready")  # whole, or not there: the test reads it at once
    time.sleep(600)
def fail(st, out):
    raise RuntimeError("a helper's step failed")
demo._on_warm_dem = warm_forever if sys.argv[2] == "forever" else (lambda run: None)
demo.STEPS = {"x": fail}
demo.LANES = {"a": ((lambda: demo._on_warm_dem(None),), ("x",))}
if sys.argv[3:] == ["signals"]:  # as the command line: a signal is one line and exit 130 / 143
    from terrain_io import interrupts
    interrupts.install()
helpers = demo._Helpers.start(folder)
interrupts.at_leave(helpers.stop) if sys.argv[3:] == ["signals"] else None
print(helpers.procs["a"][0], flush=True)
if sys.argv[2] == "forever":
    time.sleep(600)
helpers.go(folder)
print(helpers.line("x"), flush=True)
helpers.finish()
print(helpers.procs, flush=True)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie no one reaps (PID 1 of a container) has ended


@linux
def test_a_killed_demo_leaves_no_helper_behind(tmp_path):
    """SIGKILL to the demo while a helper compiles: the helper ends at once (PR_SET_PDEATHSIG) and
    removes its temporary folder."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_LANE, str(tmp_path), "forever"], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    helper = int(proc.stdout.readline())
    deadline = time.monotonic() + 20
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    warm = Path((tmp_path / "ready").read_text())
    assert warm.is_dir() and not _gone(helper)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while not _gone(helper) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(helper)
    assert not warm.exists()


@linux
@pytest.mark.parametrize("signum,code,line", [(signal.SIGTERM, 143, "terrain: terminated"),
                                              (signal.SIGINT, 130, "terrain: interrupted")])
def test_a_signalled_demo_ends_its_helpers_before_it_exits(tmp_path, signum, code, line):
    """SIGTERM or Ctrl-C to the demo while a helper compiles: one line, exit 143 / 130, and by then the
    helper has ended and removed its temporary folder (the demo waited for it)."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_LANE, str(tmp_path), "forever", "signals"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    helper = int(proc.stdout.readline())
    deadline = time.monotonic() + 20
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    warm = Path((tmp_path / "ready").read_text())
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == code and err.splitlines() == [line], err
    assert _gone(helper) and not warm.exists()


@linux
def test_a_failed_helper_leaves_its_step_to_the_demo(tmp_path):
    """A helper whose step raises sends no line: the demo gets None (and runs the step itself), and
    the helper is reaped."""
    out = subprocess.run([sys.executable, "-c", _FAKE_LANE, str(tmp_path), "fail"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == ["None", "{}"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_first_run", ROOT / "benchmarks" / "bench_first_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_verdict_is_wall_when_quiet_else_cpu(tmp_path):
    """The benchmark judges the cold demo on its wall time on a quiet machine, else on its CPU time
    against the cores the demo keeps busy; a row over the budget is flagged in the results file."""
    bench = _bench()
    assert bench.verdict(20.0, 14.0, True, 15.0) == ("wall", 14.0, 15.0)
    assert bench.verdict(20.0, 90.0, False, 15.0) == ("cpu", 20.0, 15.0 * bench.CORES_BUSY)
    results = tmp_path / "RESULTS.md"
    bench.results_row(results, 30.0, 16.0, 2.0, [0.1, 0.2], bench.verdict(30.0, 16.0, True, 15.0))
    bench.results_row(results, 24.0, 60.0, 2.0, [9.0, 9.0], bench.verdict(24.0, 60.0, False, 15.0))
    first, second = results.read_text().splitlines()
    assert "wall 16.0 <= 15.0 s: **REGRESSION**" in first
    assert second.endswith(": ok |") and "cpu 24.0" in second


@pytest.mark.slow
def test_bench_first_run_fails_loudly_over_its_budget(tmp_path):
    """The benchmark runs the cold demo in a fresh cache; over its budget it exits 1 with REGRESSION and
    a flagged row."""
    results = tmp_path / "RESULTS.md"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_first_run.py"), "--only", "demo",
                          "--no-warm", "--budget", "0.5", "--results", str(results)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "REGRESSION" in out.stderr and "**REGRESSION**" in results.read_text()
