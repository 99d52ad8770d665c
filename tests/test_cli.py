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




def test_a_bug_is_one_line_and_its_traceback_under_debug(tmp_path, monkeypatch):
    """An exception no error of ours names (a bug) reaches the user as one line and exit 1, not a
    traceback; --debug shows it whole."""
    import terrain_io.store as store_mod

    store = tmp_path / "ok.zarr"
    run("-q", "synth", "-o", store, "--size", "20", "--tile", "8", "--shard", "2")

    def broken(*args, **kwargs):
        raise AttributeError("something half made")

    monkeypatch.setattr(store_mod.TerrainStore, "open", broken)
    result = run("info", str(store))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith("terrain: internal error: AttributeError: something half made")
    debug = run("--debug", "info", str(store))
    assert debug.exit_code != 0 and isinstance(debug.exception, AttributeError)


@pytest.mark.parametrize("kind", ["device_memory", "worker_killed"])
def test_the_machine_out_of_memory_is_no_bug(tmp_path, monkeypatch, kind):
    """The GPU's memory taken (CuPy's OutOfMemoryError, no MemoryError) or a worker process killed
    (BrokenProcessPool) is the machine's limit: ``terrain: error: ...`` and exit 1, not the bug's line."""
    import types
    from concurrent.futures.process import BrokenProcessPool

    import terrain_io.store as store_mod

    store = tmp_path / "ok.zarr"
    run("-q", "synth", "-o", store, "--size", "20", "--tile", "8", "--shard", "2")
    if kind == "device_memory":  # (CuPy's class where CuPy is not installed: the same module path and name)
        oom = type("OutOfMemoryError", (Exception,), {})
        cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=oom)))
        monkeypatch.setitem(sys.modules, "cupy", sys.modules.get("cupy", cupy))
        error = sys.modules["cupy"].cuda.memory.OutOfMemoryError("Out of memory allocating 1,024 bytes")
    else:
        error = BrokenProcessPool("A process in the process pool was terminated abruptly")

    def short(*args, **kwargs):
        raise error

    monkeypatch.setattr(store_mod.TerrainStore, "open", short)
    result = run("info", str(store))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith("terrain: error: ") and "internal error" not in lines[0]
