"""``terrain graph apsp`` and ``terrain graph mst``: results against scipy, ground-truth checks, errors."""
import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner
from scipy.sparse.csgraph import floyd_warshall, minimum_spanning_tree

from cli.main import _register, cli
from terrain_io.graph.io import read_edge_list, write_edge_list

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def graph_csv(tmp_path):
    """A report-style edge list (source,target,weight; distinct weights) and its scipy MST as XYZ_gt.csv."""
    rng = np.random.default_rng(4)
    n = 60
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, n, (300, 2)) if a < b}
    u, v = np.array(sorted(pairs)).T
    w = rng.permutation(len(u)) + 1
    path = tmp_path / "G.csv"
    write_edge_list(path, u, v, w)
    T = minimum_spanning_tree(sp.csr_matrix((w.astype(float), (u, v)), shape=(n, n))).tocoo()
    write_edge_list(tmp_path / "G_gt.csv", T.row, T.col, T.data.astype(np.int64))
    return path, u, v, w, n


def test_mst_check_and_output(graph_csv, tmp_path):
    path, u, v, w, n = graph_csv
    r = run("graph", "mst", path, "--check", "-o", tmp_path / "out.csv", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "agrees with G_gt.csv (same edge set)" in r.output
    out = read_edge_list(tmp_path / "out.csv")
    truth = read_edge_list(tmp_path / "G_gt.csv")
    assert out.w.sum() == truth.w.sum() and out.m == truth.m


def test_mst_check_detects_wrong_ground_truth(graph_csv, tmp_path):
    path, u, v, w, n = graph_csv
    truth = read_edge_list(tmp_path / "G_gt.csv")
    write_edge_list(tmp_path / "G_gt.csv", truth.u[1:], truth.v[1:], truth.w[1:])
    r = run("graph", "mst", path, "--check", "--device", "cpu")
    assert r.exit_code == 1 and "check against G_gt.csv failed" in r.output


@pytest.mark.parametrize("method", ["minplus", "floyd_warshall", "blocked"])
def test_apsp_edge_list_and_matrix(graph_csv, tmp_path, method):
    path, u, v, w, n = graph_csv
    ref = floyd_warshall(sp.csr_matrix((w.astype(float), (u, v)), shape=(n, n)), directed=False)
    r = run("graph", "apsp", path, "--undirected", "--method", method, "-o", tmp_path / "D.npy", "--device", "cpu")
    assert r.exit_code == 0, r.output
    D = np.load(tmp_path / "D.npy")
    np.testing.assert_array_equal(D, ref)  # float64, inf = unreachable, for integer weights too
    W = np.full((n, n), np.inf)
    W[u, v] = w
    np.save(tmp_path / "W.npy", W)
    r = run("graph", "apsp", tmp_path / "W.npy", "-o", tmp_path / "D2.npy", "--device", "cpu")
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "D2.npy"), floyd_warshall(sp.csr_matrix((w.astype(float), (u, v)), shape=(n, n))))


@pytest.mark.parametrize("command,content,message", [
    ("mst", None, "no such file"),
    ("mst", "0,1,2\n1,2,nan\n", "NaN weight"),
    ("mst", "0,1,2\n1,2\n", "2 fields where earlier lines have 3"),
    ("mst", "0,1,2\n-1,2,3\n", "negative vertex id"),
    ("mst", "source,target,weight\n0,x,2\n", "non-numeric field"),
    ("apsp", "matrix23", "must be square"),
    ("apsp", "matrixnan", "NaN weight"),
    ("apsp", "garbage.npy", "not a readable .npy file"),
    ("apsp", "negcycle", "negative cycle"),
    ("apsp", "0,1,1\n1,4000000000,2\n", "a dense APSP needs about"),
])
def test_clear_errors(tmp_path, command, content, message):
    path = tmp_path / "in.csv"
    if content == "matrix23":
        path = tmp_path / "m.npy"
        np.save(path, np.zeros((2, 3)))
    elif content == "matrixnan":
        path = tmp_path / "m.npy"
        np.save(path, np.array([[0, np.nan], [1, 0]]))
    elif content == "garbage.npy":
        path = tmp_path / "m.npy"
        path.write_text("not numpy")
    elif content == "negcycle":
        path.write_text("0,1,1\n1,2,-3\n2,0,1\n")
    elif content is not None:
        path.write_text(content)
    r = run("graph", command, path, "--device", "cpu")
    assert r.exit_code == 1
    assert r.output.startswith("terrain: error:") and message in r.output and "Traceback" not in r.output


def test_ground_truth_with_out_of_range_id(graph_csv, tmp_path):
    path, u, v, w, n = graph_csv
    (tmp_path / "G_gt.csv").write_text(f"source,target,weight\n0,{n + 5},1\n")
    r = run("graph", "mst", path, "--check", "--device", "cpu")
    assert r.exit_code == 1 and f"vertex id {n + 5} out of range for {n} vertices" in r.output
