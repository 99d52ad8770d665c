"""The command line's contract with itself: usage errors, -q/--debug anywhere, --cell ROW,COL,
bfs --source, and APSP's one convention for unreachable pairs (inf, as scipy.sparse.csgraph)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from click.testing import CliRunner
from scipy.sparse.csgraph import floyd_warshall, shortest_path

from cli.main import _register, cli

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="terrain")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("contract") / "s.zarr"
    r = run("-q", "synth", "-o", path, "--size", "24", "--tile", "8", "--shard", "2", "--nodata-fraction", "0")
    assert r.exit_code == 0, r.output
    return path


@pytest.mark.parametrize("args,command", [
    (["--bogus"], "terrain"),
    (["nosuch"], "terrain"),
    (["mst"], "terrain mst"),
    (["mst", "{store}", "--bogus"], "terrain mst"),
    (["mst", "{store}", "--weight", "heavy"], "terrain mst"),
    (["sssp", "{store}"], "terrain sssp"),                             # raised in the command's body
    (["sssp", "{store}", "--source", "abc"], "terrain sssp"),          # a value checked in the body
    (["graph", "bfs", "g.csv", "--from", "zero"], "terrain graph bfs"),
])
def test_usage_errors_are_one_line_a_hint_and_exit_2(store, args, command):
    r = run(*[a.format(store=store) for a in args])
    lines = r.output.splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 2 and lines[0].startswith("terrain: error: "), r.output
    assert lines[1] == f"Try '{command} -h' for help.", r.output
    assert "Usage:" not in r.output and "Traceback" not in r.output


def test_entry_point_usage_error_on_stderr_exit_2():
    p = subprocess.run([sys.executable, "-m", "cli", "mst", "--bogus"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == ["terrain: error: No such option '--bogus'.", "Try 'terrain mst -h' for help."]


def test_quiet_and_debug_after_the_subcommand(store, tmp_path):
    loud = run("mst", store)
    assert loud.exit_code == 0 and loud.output.strip(), loud.output
    for args in (["-q", "mst", store], ["mst", store, "-q"], ["mst", "-q", store, "--quiet"]):
        r = run(*args)
        assert r.exit_code == 0 and r.output == "", (args, r.output)
    missing = tmp_path / "missing.zarr"
    plain = run("info", missing)
    assert plain.exit_code == 1 and plain.output.startswith("terrain: error:")
    for args in (["--debug", "info", missing], ["info", missing, "--debug"]):
        r = run(*args)  # --debug: the exception itself propagates (a traceback for the user)
        assert r.exit_code == 1 and r.exception is not None and not isinstance(r.exception, SystemExit), args


def test_cell_row_col_as_the_readme_writes_it(store):
    """``--cell ROW,COL`` is a source at that cell, the same as ``--cell --source ROW,COL``; by the
    format's definition the source's distance is 0 and its predecessor code 255."""
    assert run("-q", "sssp", store, "--cell", "5,7", "--name", "a").exit_code == 0
    assert run("-q", "sssp", store, "--cell", "--source", "5,7", "--name", "b").exit_code == 0
    g = zarr.open_group(str(store), mode="r")
    da, db = g["sssp/a/distance"][...], g["sssp/b/distance"][...]
    np.testing.assert_array_equal(da, db)
    assert da[5, 7] == 0 and (da > 0).sum() == da.size - 1 and g["sssp/a/predecessor"][5, 7] == 255
    r = run("sssp", store, "--cell", "1,2", "--cell", "9,9", "--name", "two", "-q")
    assert r.exit_code == 0, r.output
    d = g["sssp/two/distance"][...]
    assert d[1, 2] == 0 and d[9, 9] == 0 and (d == 0).sum() == 2


def test_bfs_takes_source_as_well_as_from(tmp_path):
    rng = np.random.default_rng(3)
    n = 30
    u, v = rng.integers(0, n, (2, 60))
    (tmp_path / "g.csv").write_text("".join(f"{a},{b}\n" for a, b in zip(u, v)))
    ref = shortest_path(sp.csr_matrix((np.ones(len(u)), (u, v)), shape=(n, n)), directed=False, unweighted=True,
                        indices=4)
    for opt in ("--from", "--source"):
        out = tmp_path / f"d{opt}.csv"
        r = run("graph", "bfs", tmp_path / "g.csv", "--undirected", opt, "4", "-o", out)
        assert r.exit_code == 0, r.output
        depth = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
        np.testing.assert_array_equal(np.where(depth < 0, np.inf, depth), ref)


@pytest.mark.parametrize("weights", ["int", "float", "int32-matrix", "float-matrix"])
def test_apsp_unreachable_is_inf_whatever_the_input_type(tmp_path, weights):
    """Two components: the written distances are float64 with inf between them, equal to scipy's."""
    rng = np.random.default_rng(5)
    n = 12
    u = np.concatenate([rng.integers(0, 6, 20), rng.integers(6, 12, 20)])
    v = np.concatenate([rng.integers(0, 6, 20), rng.integers(6, 12, 20)])
    w = rng.integers(1, 50, len(u))
    keep = u != v
    u, v, w = u[keep], v[keep], w[keep]
    W = np.full((n, n), np.inf)
    np.minimum.at(W, (u, v), w)
    ref = floyd_warshall(np.where(np.isfinite(W), W, 0), directed=True)  # (csgraph: 0 = no edge, dense input)
    if weights == "int":
        rows = "".join(f"{a},{b},{c}\n" for a, b, c in zip(u, v, w))
        (tmp_path / "g.csv").write_text("source,target,weight\n" + rows)
        src = tmp_path / "g.csv"
    elif weights == "float":
        (tmp_path / "g.csv").write_text(
            "source,target,weight\n" + "".join(f"{a},{b},{c + 0.5}\n" for a, b, c in zip(u, v, w)))
        src = tmp_path / "g.csv"
        W2 = np.full((n, n), np.inf)
        np.minimum.at(W2, (u, v), w + 0.5)
        ref = floyd_warshall(np.where(np.isfinite(W2), W2, 0), directed=True)
    elif weights == "int32-matrix":
        M = np.where(np.isfinite(W), W, np.iinfo(np.int32).max).astype(np.int32)  # the dtype's max: no edge
        np.save(tmp_path / "W.npy", M)
        src = tmp_path / "W.npy"
    else:
        np.save(tmp_path / "W.npy", W)
        src = tmp_path / "W.npy"
    r = run("graph", "apsp", src, "-o", tmp_path / "D.npy", "--device", "cpu")
    assert r.exit_code == 0, r.output
    D = np.load(tmp_path / "D.npy")
    assert D.dtype == np.float64
    assert np.isinf(ref).sum() > 0
    np.testing.assert_array_equal(D, ref)
    assert f"{n * n - int(np.isinf(ref).sum())} reachable pairs" in r.output
