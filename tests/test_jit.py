"""numba compilation policy (terrain_io.jit): the cache folder, serial twins, the first-compile note; the
distribution's name and version."""
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numba
import numpy as np
from click.testing import CliRunner

import terrain_io
from cli.main import _register, cli
from terrain_io import jit

ROOT = Path(__file__).resolve().parents[1]


def test_cache_beside_the_sources_when_writable(tmp_path):
    env = {}
    assert jit.configure_cache(env, package_dir=tmp_path / "pkg") == tmp_path / "pkg" / "__pycache__"
    assert env == {}  # numba's default: nothing to set


def test_cache_in_the_users_folder_when_the_package_is_read_only(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a folder below a file can never be made (read-only even for root)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = jit.configure_cache(env, package_dir=blocker / "pkg")
    if sys.platform.startswith("linux"):
        assert folder == tmp_path / "xdg" / "terrain-io" / "numba"
    assert env["NUMBA_CACHE_DIR"] == str(folder)
    # a folder the user chose is kept
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "mine")}
    assert jit.configure_cache(env, package_dir=blocker / "pkg") == tmp_path / "mine"
    assert env == {"NUMBA_CACHE_DIR": str(tmp_path / "mine")}


def test_numba_caches_where_configure_cache_points(tmp_path):
    """In a fresh process: a read-only package folder sends numba's cache files to the user's folder."""
    (tmp_path / "probe.py").write_text(textwrap.dedent("""
        import numba

        @numba.njit(cache=True)
        def twice(x):
            return 2 * x
    """))
    code = textwrap.dedent(f"""
        from pathlib import Path
        from terrain_io import jit
        jit._writable = lambda folder: False  # as in a read-only site-packages
        jit.configure_cache()
        import probe
        assert probe.twice(21) == 42
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path, timeout=120)
    cached = list((tmp_path / "xdg" / "terrain-io" / "numba").rglob("probe.twice-*.nbi"))
    assert len(cached) == 1
    assert not (tmp_path / "__pycache__").exists() or not list((tmp_path / "__pycache__").glob("*.nbi"))


def test_first_compile_is_announced_once():
    said = []
    listener = jit.announce_compiles(said.append, "CACHE")

    def outside(x):
        return x + 1

    def ours(x):
        return x + 2

    ours.__module__ = "terrain_io._probe"
    numba.njit(outside)(1)  # not a kernel of ours: no note
    assert said == []
    numba.njit(ours)(1)
    numba.njit(ours)(1.5)  # another compilation: still one line
    numba.core.event.unregister("numba:compile", listener)
    assert len(said) == 1 and said[0].startswith("terrain: compiling kernels for first use") and "CACHE" in said[0]


def test_compiled_marker_per_version(tmp_path):
    assert not jit.compiled_before(tmp_path, "demo")
    jit.mark_compiled(tmp_path, "demo")
    assert jit.compiled_before(tmp_path, "demo")
    (marker,) = tmp_path.iterdir()
    assert terrain_io.__version__ in marker.name and numba.__version__ in marker.name
    assert not jit.compiled_before(tmp_path, "other")
    jit.mark_compiled(tmp_path / "missing" / "folder", "demo")  # best effort: no error


def test_serial_twin_has_its_own_cache_name_and_the_same_result():
    @numba.njit(parallel=True)
    def total(a):
        s = 0.0
        for i in numba.prange(a.shape[0]):
            s += a[i]
        return s

    twin = jit.serial_twin(total)
    assert twin.py_func.__qualname__ == total.py_func.__qualname__ + "_serial"
    assert "parallel" not in twin.targetoptions and total.targetoptions["parallel"]
    a = np.arange(1000, dtype=np.float64)
    assert twin(a) == a.sum()
    from terrain_io.grid.sssp import _incore_cpu as K

    assert K.plateau_levels_serial.py_func.__qualname__ == "plateau_levels_serial"


def test_distribution_name_and_version():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == terrain_io.DISTRIBUTION == "terrain-io"
    assert meta["scripts"]["terrain"] == "cli.main:main"
    assert terrain_io.__version__ == meta["version"]
    _register()
    out = CliRunner().invoke(cli, ["--version"]).output
    assert out.strip() == f"terrain-io {meta['version']}"


_FIRST_LOAD = r"""
import sys
import numpy as np
import terrain_io
from terrain_io.grid.sssp.incore import ringed, solve_block

solve_block(ringed(np.ones((8, 8), np.float32)), 1, np.ones(8), [[3, 3]])  # numba's first load
print("scipy.linalg" in sys.modules)
import numba
import numba.np.arraymath as arraymath

@numba.njit
def dot(a, b):
    return np.dot(a, b)

a, b = np.arange(5.0), np.linspace(0.5, 2.5, 5)
print(arraymath._HAVE_BLAS, dot(a, b) == float(a @ b), "scipy.linalg" in sys.modules)
"""


def test_first_load_defers_numba_blas_check_and_blas_still_works():
    """Loading our kernels does not import scipy.linalg (numba's import-time BLAS check, deferred);
    numba still knows BLAS exists, and a kernel calling np.dot compiles, imports it then, and is right.
    Fresh process: the check runs once per process."""
    out = subprocess.run([sys.executable, "-c", _FIRST_LOAD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True"]
