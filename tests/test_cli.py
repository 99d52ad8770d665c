"""The command line: exit codes, one-line errors, the demo, info."""
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io import backend
from terrain_io.errors import DeviceError

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_demo_runs_end_to_end(tmp_path):
    result = run("demo", "-o", tmp_path / "demo")
    assert result.exit_code == 0, result.output
    assert "convert" in result.output
    assert (tmp_path / "demo" / "jacksboro.zarr" / "zarr.json").exists()
    assert (tmp_path / "demo" / "elevation.png").stat().st_size > 10_000


def test_convert_info_export(tmp_path, sample_data):
    out = tmp_path / "t.zarr"
    r = run("-q", "convert", sample_data / "topobathy_land.tif", "-o", out, "--tile", "32", "--shard", "2")
    assert r.exit_code == 0 and r.output == ""
    r = run("info", out)
    assert r.exit_code == 0
    assert "91 rows x 120 cols" in r.output and "EPSG:4326" in r.output and "44.33%" in r.output
    r = run("export", out, "-o", tmp_path / "t.tif")
    assert r.exit_code == 0 and (tmp_path / "t.tif").exists()


@pytest.mark.parametrize("args,message", [
    (["convert", "missing.asc"], "no such file"),
    (["info", "missing.zarr"], "no such store"),
    (["convert", "{bad}"], "line 7: expected 2 values"),
    (["convert", "{bad}", "--tile", "100"], "power of two"),
    (["synth", "-o", "{tmp}/s.zarr", "--size", "0"], "size must be positive"),
    (["export", "{store}", "nope", "-o", "{tmp}/x.tif"], "no array 'nope'"),
])
def test_errors_are_one_line_with_nonzero_exit(tmp_path, args, message):
    bad = tmp_path / "bad.asc"
    bad.write_text("ncols 2\nnrows 2\nxllcorner 0\nyllcorner 0\ncellsize 1\n1 2\n3\n")
    store = tmp_path / "ok.zarr"
    run("-q", "synth", "-o", store, "--size", "20", "--tile", "8", "--shard", "2")
    args = [a.format(bad=bad, tmp=tmp_path, store=store) for a in args]
    result = run(*args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: error:") and message in lines[0], result.output
    assert "Traceback" not in result.output


def test_entry_point_exit_code_and_stderr(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cli", "convert", str(tmp_path / "nope.asc")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("terrain: error:") and proc.stdout == ""


def test_device_gpu_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    assert backend.resolve_device("auto") == "cpu"
    with pytest.raises(DeviceError, match="no usable CUDA GPU"):
        backend.resolve_device("gpu")
    with pytest.raises(DeviceError, match="unknown device"):
        backend.resolve_device("tpu")
    assert backend.array_module("cpu") is np


def test_device_follows_inputs():
    assert backend.device_of(np.zeros(3)) == "cpu"
    assert backend.device_of(np.zeros(3), device="cpu") == "cpu"


@pytest.mark.gpu
def test_gpu_backend_round_trip():
    import cupy

    x = np.arange(10)
    g = backend.to_device(x, "gpu")
    assert isinstance(g, cupy.ndarray) and backend.device_of(g) == "gpu"
    np.testing.assert_array_equal(backend.to_host(g), x)


def test_demo_mst_beside_on_a_cold_cache(tmp_path, monkeypatch):
    """On a cold cache the demo computes its MST in a second process (started before the convert, it
    compiles the kernels meanwhile): that process succeeds, and the store holds the same MST -- the
    same edge bitmask and summary -- as when the demo computes it in its own process."""
    import zarr

    from cli import demo
    from terrain_io import jit

    started = []

    def start(function):
        started.append((function, start_child(function)))
        return started[-1][1]

    start_child = demo._start_child
    monkeypatch.setattr(demo, "_start_child", start)
    outputs = {}
    for cold in (True, False):
        monkeypatch.setattr(jit, "compiled_before", lambda *a, cold=cold: not cold)
        monkeypatch.setattr(jit, "mark_compiled", lambda *a: None)
        result = run("demo", "-o", tmp_path / str(cold))
        assert result.exit_code == 0, result.output
        line = next(x for x in result.output.splitlines() if x.startswith("3. mst"))
        fill_line = next(x for x in result.output.splitlines() if x.startswith("6. fill"))
        edges = zarr.open_array(tmp_path / str(cold) / "jacksboro.zarr" / "mst" / "edges", mode="r")[...]
        outputs[cold] = (line.split(" [")[0], edges, fill_line.split(" (")[0])
    assert sorted(f for f, _ in started) == ["_mst_beside", "_warm_fill"]
    assert all(p.returncode == 0 for _, p in started)
    assert outputs[True][2] == outputs[False][2]  # the fill's summary (its kernels compiled beside)
    assert outputs[True][0] == outputs[False][0]
    np.testing.assert_array_equal(outputs[True][1], outputs[False][1])


def test_demo_mst_beside_warms_every_kernel_and_stops_without_a_store(tmp_path):
    """The second process's warm-up on a small DEM compiles (or loads) every kernel signature that the
    demo's MST then runs (none is added after it); with no store on stdin it exits with 1."""
    script = f"""
import numba, sys
from terrain_io.grid import _radix_cpu
from terrain_io.grid.mst import _cpu as _mst_cpu
from cli import demo
def signatures():
    kernels = [v for m in (_mst_cpu, _radix_cpu) for v in vars(m).values()] + list(_mst_cpu._TILE_PHASE.values())
    return {{(k.py_func.__qualname__, s) for k in kernels if isinstance(k, numba.core.dispatcher.Dispatcher)
            for s in k.signatures}}
demo._warm_mst()
warm = signatures()
from terrain_io.convert import convert
from terrain_io.grid.mst import mst
from terrain_io.store import TerrainStore
convert(demo.SAMPLE, {str(tmp_path / "s.zarr")!r}, tile=demo.TILE, shard=demo.SHARD)
mst(TerrainStore.open({str(tmp_path / "s.zarr")!r}), progress=False)
print(sorted(signatures() - warm) or "none", sorted({{name for name, _ in warm}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    new, warmed = out.stdout.split(" ", 1)
    assert new == "none", out.stdout + out.stderr
    kernels = ("'merge_candidates'", "'merge_kruskal'", "'tile_forest_max'", "'apply_decisions'")
    assert all(k in warmed for k in kernels), warmed
    code = subprocess.run([sys.executable, "-c", "import sys, cli.demo; sys.exit(cli.demo._mst_beside())"],
                          stdin=subprocess.DEVNULL, capture_output=True)
    assert code.returncode == 1, code.stderr
