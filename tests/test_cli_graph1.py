"""``terrain graph listrank|cc|bfs``: results against independent references, and one-line errors."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner
from scipy.sparse.csgraph import connected_components as scipy_cc, shortest_path

from cli.main import _register, cli

_register()


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_listrank_csv_with_header(tmp_path):
    order = np.random.default_rng(1).permutation(50)
    path = tmp_path / "list.csv"
    path.write_text("source,target\n" + "".join(f"{a},{b}\n" for a, b in zip(order[:-1], order[1:])))
    out = tmp_path / "ranks.csv"
    res = run("graph", "listrank", str(path), "-o", str(out), "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "50 elements in 1 lists" in res.output
    table = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)
    expected = np.empty(50, np.int64)
    expected[order] = np.arange(50)
    np.testing.assert_array_equal(table[:, 1], expected)


def test_cc_and_bfs_npz(tmp_path):
    rng = np.random.default_rng(2)
    u, v = rng.integers(0, 300, 250), rng.integers(0, 300, 250)
    path = tmp_path / "g.npz"
    np.savez(path, u=u, v=v)
    mat = sp.coo_matrix((np.ones(250), (u, v)), shape=(300, 300))
    out = tmp_path / "labels.npy"
    res = run("graph", "cc", str(path), "-o", str(out), "--method", "sv")
    assert res.exit_code == 0, res.output
    k, lab = scipy_cc(mat, directed=False)
    assert f"-> {k} components" in res.output
    labels = np.load(out)[:, 1]
    assert len(np.unique(labels)) == k
    pairs = np.unique(np.stack([lab, labels], 1), axis=0)      # same partition as scipy's
    assert np.array_equal(pairs[:, 0], np.arange(k))
    smallest = np.full(k, 300)
    np.minimum.at(smallest, lab, np.arange(300))
    np.testing.assert_array_equal(labels, smallest[lab])
    out = tmp_path / "bfs.csv"
    res = run("graph", "bfs", str(path), "--undirected", "--from", str(int(u[0])), "-o", str(out))
    assert res.exit_code == 0, res.output
    depth = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
    ref = shortest_path(mat, unweighted=True, directed=False, indices=int(u[0]))
    np.testing.assert_array_equal(depth, np.where(np.isinf(ref), -1, ref).astype(np.int64))


@pytest.mark.parametrize("content,message", [
    ("1,2\n3,x\n", "non-numeric"),
    ("1,2\n3,4,5,6\n", "expected 'u,v'"),
    ("0,1\n-1,2\n", "negative vertex id"),
    ("source,target\n", "empty edge list"),
    ("0,1\n1,2.5\n", "integers"),
])
def test_malformed_files(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    for cmd in ("listrank", "cc", "bfs"):
        res = CliRunner().invoke(cli, ["graph", cmd, str(path)])
        assert res.exit_code == 1
        assert res.output.startswith("terrain: error:") and message in res.output
        assert "Traceback" not in res.output


def test_range_and_structure_errors(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("0,1\n1,2\n2,7\n")
    res = CliRunner().invoke(cli, ["graph", "cc", str(path), "--vertices", "5"])
    assert res.exit_code == 1 and "out of range" in res.output
    res = CliRunner().invoke(cli, ["graph", "bfs", str(path), "--from", "9"])
    assert res.exit_code == 1 and "source vertex 9 out of range" in res.output
    path.write_text("0,1\n0,2\n")
    res = CliRunner().invoke(cli, ["graph", "listrank", str(path)])
    assert res.exit_code == 1 and "more than one successor" in res.output
    path.write_text("0,1\n1,2\n2,0\n")
    res = CliRunner().invoke(cli, ["graph", "listrank", str(path)])
    assert res.exit_code == 1 and "cycle" in res.output
    empty = tmp_path / "e.npz"
    np.savez(empty, u=np.empty(0, np.int64), v=np.empty(0, np.int64))
    res = CliRunner().invoke(cli, ["graph", "cc", str(empty)])
    assert res.exit_code == 1 and "empty graph" in res.output
    res = CliRunner().invoke(cli, ["graph", "bfs", str(tmp_path / "missing.csv")])
    assert res.exit_code != 0
