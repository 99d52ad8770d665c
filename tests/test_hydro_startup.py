"""Issue 30's start-up of the hydrology commands: on the GPU they run no CPU kernel, so a fresh
process imports neither numba nor the other pipelines (about 0.3-0.6 s of each command on the H100);
the package names that became lazy stay what they were, and the first compile is still announced."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter on this checkout; its stdout."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_gpu_route_of_the_hydrology_imports_no_numba():
    out = _python("""
        import sys
        from cli.main import _register
        _register()  # every command's module, as the terrain command loads them
        import terrain_io.grid.hydro.pipeline, terrain_io.grid.hydro._gpu, terrain_io.grid.flow.upload
        import terrain_io.grid.fill._tiled, terrain_io.store, terrain_io.vectors
        from terrain_io import jit
        jit.announce_compiles(print, "CACHE")
        print(sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")
                     or m.endswith(("._cpu", ".mst", ".sssp", ".tiled"))))
    """)
    assert [m for m in ast.literal_eval(out.strip().splitlines()[-1]) if not m.startswith("cli.")] == []


def test_lazy_package_names_are_the_functions_they_were():
    out = _python("""
        import terrain_io.grid.mst.pipeline, terrain_io.grid.sssp.engine  # the subpackages first
        from terrain_io.grid import MSTResult, SSSPResult, cost_distance, flow_direction, mst, sssp
        from terrain_io.grid.fill import fill, TABLE_COLUMNS
        from terrain_io.grid.hydro import basins, hand
        import terrain_io.grid as grid
        print(mst.__module__, sssp.__module__, cost_distance.__module__, flow_direction.__module__,
              fill.__module__, basins.__module__, hand.__module__, MSTResult.__name__, SSSPResult.__name__,
              grid.mst is mst, type(TABLE_COLUMNS).__name__)
        try:
            grid.nothing
        except AttributeError as e:
            print("AttributeError", e)
    """)
    lines = out.strip().splitlines()
    assert lines[0].split() == ["terrain_io.grid.mst.pipeline", "terrain_io.grid.sssp.engine",
                                "terrain_io.grid.sssp.array", "terrain_io.grid.flow.array",
                                "terrain_io.grid.fill.pipeline", "terrain_io.grid.hydro.array",
                                "terrain_io.grid.hydro.array", "MSTResult", "SSSPResult", "True",
                                lines[0].split()[-1]]
    assert lines[1].startswith("AttributeError") and "nothing" in lines[1]


def test_first_compile_is_announced_when_numba_comes_later(tmp_path):
    out = _python("""
        import sys
        from terrain_io import jit
        said = []
        print(jit.announce_compiles(said.append, "CACHE"), "numba" in sys.modules)
        import numba

        def ours(x):
            return x + 2

        ours.__module__ = "terrain_io._probe"
        numba.njit(ours)(1)
        numba.njit(ours)(1.5)
        print(len(said), said[0].startswith("terrain: compiling kernels for first use"))
    """, NUMBA_CACHE_DIR=str(tmp_path))
    assert out.split() == ["None", "False", "1", "True"]


@pytest.mark.gpu
def test_gpu_commands_start_without_numba(tmp_path):
    """basins, watershed and HAND on the GPU in a fresh process: numba never imported (streams
    needs it for the links' orders and walks)."""
    st = tmp_path / "s.zarr"
    for args in (["synth", "-o", str(st), "--size", "300"], ["flow", str(st), "--device", "gpu"]):
        subprocess.run([sys.executable, "-m", "cli", "-q", *args], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    for args in (["basins"], ["watershed", "--cell", "150,150"], ["hand", "--threshold", "50"]):
        out = _python(f"""
            import sys
            from cli.main import main
            try:
                main(["-q", "{args[0]}", {str(st)!r}, "--device", "gpu", *{args[1:]!r}])
            except SystemExit as e:
                assert not e.code, e.code
            print("numba" in sys.modules)
        """, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        assert out.split()[-1] == "False", args
