"""The CSV tables (``fill``, ``depressions``, ``basins`` and ``streams --table``, the graph commands'
``-o``): one writer, :func:`terrain_io.tables.write_csv`, whose bytes are those of Python's csv module
writing each value's Python scalar (floats by ``repr``); each command's table parsed back and checked
against the result's own arrays in the store (or, for the graphs, a brute force / scipy)."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import UTM33
from terrain_io.store import TerrainStore
from terrain_io.tables import TABLE_ROWS, Table, write_csv

_register()
X0, Y0, DX = 412345.678, 5012345.321, 0.3  # a fractional transform: coordinates with many digits


def csv_module(columns: dict, newline: str = "\r\n") -> bytes:
    """The reference: Python's csv module writing the header, then each row's Python scalars."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator=newline)
    out.writerow(list(columns))
    out.writerows(zip(*(np.asarray(c).tolist() for c in columns.values())))
    return buf.getvalue().encode()


def floats(rng, n: int) -> np.ndarray:
    """Float64s of every kind: random bits (subnormals, huge, NaNs of any sign and payload), integral
    values about repr's switch to exponents (1e16), small ones about 1e-4, +-0, +-inf."""
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e16, 9999999999999998.0, 1e15 + 0.5, 1e-4,
               9.999999999999999e-05, 5e-324, -1.7976931348623157e308, 0.1, 1 / 3, 123456789.0, 2.0 ** 63]
    k = max(n, 3 * len(special))
    bits = rng.integers(0, 2 ** 64, k // 3, dtype=np.uint64, endpoint=False).view(np.float64)
    return rng.permutation(np.concatenate([special, bits, rng.uniform(-1e6, 1e6, k)]))[:n]


def _columns(rng, n: int) -> dict:
    return {"id": np.arange(1, n + 1), "x": floats(rng, n), "f32": rng.normal(0, 1e3, n).astype(np.float32),
            "i64": rng.integers(-2 ** 63, 2 ** 63 - 1, n, dtype=np.int64, endpoint=True),
            "u64": rng.integers(2 ** 63, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True),
            "u32": rng.integers(0, 2 ** 32, n).astype(np.uint32), "i8": rng.integers(-128, 128, n).astype(np.int8),
            "flag": rng.random(n) < 0.5, "kind": np.where(rng.random(n) < 0.5, "leaf", "merge")}


@pytest.mark.parametrize("n", [40, 1, TABLE_ROWS, TABLE_ROWS + 1, 2 * TABLE_ROWS + 3])
def test_write_csv_is_the_csv_module(tmp_path, n):
    """Every kind of value, one row, a block exactly, a block and one row, two blocks and more."""
    columns = _columns(np.random.default_rng(n), n)
    path = write_csv(columns, tmp_path / "t.csv")
    assert path.read_bytes() == csv_module(columns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no temporary left


def test_write_csv_empty_and_lf(tmp_path):
    """A table of no rows is its header; ``newline`` is the line terminator (the graph commands' LF)."""
    empty = {"id": np.zeros(0, np.int64), "area": np.zeros(0)}
    assert write_csv(empty, tmp_path / "e.csv").read_bytes() == csv_module(empty) == b"id,area\r\n"
    columns = _columns(np.random.default_rng(1), 300)
    assert write_csv(columns, tmp_path / "lf.csv", newline=b"\n").read_bytes() == csv_module(columns, "\n")


def test_write_csv_derived_columns_a_block_at_a_time(tmp_path):
    """A Table's derived columns are asked for a block of at most TABLE_ROWS rows, each row once."""
    n, asked = 2 * TABLE_ROWS + 5, []
    held = np.random.default_rng(2).uniform(0, 1, n)

    def double(s):
        asked.append((s.start, s.stop))
        return held[s] * 2

    path = write_csv(Table(n, {"id": lambda s: np.arange(s.start + 1, s.stop + 1), "v": held, "w": double}),
                     tmp_path / "d.csv")
    assert path.read_bytes() == csv_module({"id": np.arange(1, n + 1), "v": held, "w": held * 2})
    assert asked == [(0, TABLE_ROWS), (TABLE_ROWS, 2 * TABLE_ROWS), (2 * TABLE_ROWS, n)]


# --- each command's table against the result's own arrays ---------------------------------------

def _run(*args):
    res = CliRunner().invoke(cli, ["-q", *[str(a) for a in args]])
    assert res.exit_code == 0, res.output
    return res


def _read(path, newline=b"\r\n") -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(newline) and raw.count(b"\n") == raw.count(newline)
    return list(csv.DictReader(io.StringIO(raw.decode(), newline="")))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Rough noise on a tilted plane (many pits), a nodata hole, a fractional UTM transform."""
    rng = np.random.default_rng(7)
    z = (rng.random((48, 56)) * 20 + np.linspace(0, 5, 56)[None, :]).astype(np.float32)
    z[20:26, 10:18] = np.nan
    attrs = {"transform": [X0, DX, 0.0, Y0, 0.0, -DX], "cell_size": [DX, DX], "crs": UTM33.to_wkt()}
    return TerrainStore.from_array(tmp_path_factory.mktemp("t") / "s.zarr", z, tile=16, shard=2, attrs=attrs)


def _centre(r, c):
    """A cell's centre by the affine transform's definition."""
    return X0 + (c + 0.5) * DX + (r + 0.5) * 0.0, Y0 + (c + 0.5) * 0.0 + (r + 0.5) * -DX


def _array(store, name):
    return np.asarray(TerrainStore.open(store.path).group[name][...])


def _check_cell_and_centre(row, prefix):
    r, c = int(row[f"{prefix}_row"]), int(row[f"{prefix}_col"])
    assert (float(row[f"{prefix}_x"]), float(row[f"{prefix}_y"])) == _centre(r, c)
    return r, c


def test_fill_table(store, tmp_path):
    _run("fill", store.path, "--table", tmp_path / "f.csv", "--device", "cpu")
    rows = _read(tmp_path / "f.csv")
    z, lake = _array(store, "elevation"), _array(store, "fill/depression")
    filled, depth = _array(store, "fill/elevation"), _array(store, "fill/depth")
    assert [int(r["id"]) for r in rows] == list(range(1, lake.max() + 1)) and len(rows) > 20
    for row in rows:
        mask = lake == int(row["id"])
        assert int(row["cells"]) == mask.sum()
        pr, pc = _check_cell_and_centre(row, "pit")
        assert mask[pr, pc] and float(row["pit_elevation"]) == z[pr, pc] == z[mask].min()
        sr, sc = _check_cell_and_centre(row, "spill")
        assert not mask[sr, sc] and mask[max(sr - 1, 0):sr + 2, max(sc - 1, 0):sc + 2].any()
        assert np.float32(row["spill_elevation"]) == filled[mask].max() == filled[mask].min()
        assert np.float32(row["max_depth"]) == depth[mask].max()
        assert float(row["area"]) == pytest.approx(mask.sum() * DX * DX, rel=1e-12)
        assert float(row["volume"]) == pytest.approx(depth[mask].astype(np.float64).sum() * DX * DX, rel=1e-5)


def test_depressions_table(store, tmp_path):
    _run("depressions", store.path, "--table", tmp_path / "d.csv", "--device", "cpu")
    rows = _read(tmp_path / "d.csv")
    z, basin = _array(store, "elevation"), _array(store, "depressions/basin")
    leaves = basin.max()
    assert [int(r["id"]) for r in rows] == list(range(1, len(rows) + 1))
    assert [r["kind"] for r in rows] == ["leaf"] * leaves + ["merge"] * (len(rows) - leaves) and leaves > 20
    for row in rows:
        pr, pc = _check_cell_and_centre(row, "pit")
        assert float(row["pit_elevation"]) == z[pr, pc]
        if row["kind"] == "leaf":
            assert basin[pr, pc] == int(row["id"]) and z[pr, pc] == z[basin == int(row["id"])].min()
            assert row["merge_elevation"] == "nan"
        if int(row["spill_row"]) < 0:
            assert row["spill_col"] == "-1" and row["spill_x"] == row["spill_y"] == "nan"
        else:
            _check_cell_and_centre(row, "spill")
        assert float(row["area"]) == pytest.approx(int(row["cells"]) * DX * DX, rel=1e-12)
        parent = int(row["parent"])
        assert parent == 0 or (rows[parent - 1]["kind"] == "merge" and parent > int(row["id"]))


@pytest.fixture(scope="module")
def flowed(store):
    _run("flow", store.path, "--device", "cpu")
    return store


def test_basins_table(flowed, tmp_path):
    store = flowed
    _run("basins", store.path, "--table", tmp_path / "b.csv", "--device", "cpu")
    rows = _read(tmp_path / "b.csv")
    label = _array(store, "basins/label")
    counts = np.bincount(label.reshape(-1))
    assert [int(r["id"]) for r in rows] == list(range(1, len(counts)))
    for row in rows:
        r, c = _check_cell_and_centre(row, "outlet")
        assert label[r, c] == int(row["id"]) and int(row["cells"]) == counts[int(row["id"])]
        assert float(row["area_m2"]) == pytest.approx(int(row["cells"]) * DX * DX, rel=1e-12)


def test_streams_table(flowed, tmp_path):
    store = flowed
    _run("streams", store.path, "--threshold", 8, "--table", tmp_path / "s.csv", "--device", "cpu")
    rows = _read(tmp_path / "s.csv")
    link, order, magnitude = (_array(store, f"streams/{n}") for n in ("link", "order", "magnitude"))
    counts = np.bincount(link.reshape(-1))
    assert [int(r["id"]) for r in rows] == list(range(1, len(counts))) and len(rows) > 5
    for row in rows:
        k = int(row["id"])
        head, tail = (int(row["head_row"]), int(row["head_col"])), (int(row["tail_row"]), int(row["tail_col"]))
        assert link[head] == link[tail] == k and int(row["cells"]) == counts[k]
        assert int(row["strahler"]) == order[head] and int(row["shreve"]) == magnitude[head]
        assert int(row["downstream"]) == 0 or int(row["downstream"]) in range(1, len(counts))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A random graph with large vertex ids (a CSV edge list) and its scipy matrix."""
    from scipy.sparse import coo_matrix

    rng = np.random.default_rng(3)
    n, m = 40000, 30000
    u, v = rng.integers(0, n, m), rng.integers(0, n, m)
    path = tmp_path_factory.mktemp("g") / "g.csv"
    path.write_text("".join(f"{a},{b}\n" for a, b in zip(u.tolist(), v.tolist())))
    n = int(max(u.max(), v.max())) + 1
    return path, n, coo_matrix((np.ones(m), (u, v)), shape=(n, n)).tocsr()


def _graph_columns(path, names):
    rows = _read(path, b"\n")
    assert list(rows[0]) == names
    return [np.array([int(r[k]) for r in rows]) for k in names]


def test_graph_cc_and_bfs_tables(graph, tmp_path):
    from scipy.sparse.csgraph import connected_components, shortest_path

    source, n, a = graph
    _run("graph", "cc", source, "-o", tmp_path / "cc.csv", "--device", "cpu")
    vertex, label = _graph_columns(tmp_path / "cc.csv", ["vertex", "label"])
    _, comp = connected_components(a, directed=False)
    smallest = np.full(comp.max() + 1, n)
    np.minimum.at(smallest, comp, np.arange(n))
    assert np.array_equal(vertex, np.arange(n)) and np.array_equal(label, smallest[comp])
    _run("graph", "bfs", source, "--from", 5, "--undirected", "-o", tmp_path / "bfs.csv", "--device", "cpu")
    vertex, depth, parent = _graph_columns(tmp_path / "bfs.csv", ["vertex", "depth", "parent"])
    hops = shortest_path(a, directed=False, unweighted=True, indices=5)
    assert np.array_equal(vertex, np.arange(n)) and np.array_equal(depth, np.where(np.isinf(hops), -1, hops))
    reached = np.flatnonzero(depth > 0)
    assert len(reached) > 1000
    assert np.array_equal(depth[parent[reached]], depth[reached] - 1)
    sym = a + a.T
    assert all(sym[p, v] for p, v in zip(parent[reached[:500]], reached[:500]))


def test_graph_listrank_table(tmp_path):
    """Lists of a permutation (large ids): each element's rank by walking its list in the test."""
    rng = np.random.default_rng(4)
    n = 3 * TABLE_ROWS // 2
    order = rng.permutation(n)
    cut = set(rng.choice(n - 1, 20, replace=False).tolist())
    edges = [(order[i], order[i + 1]) for i in range(n - 1) if i not in cut]
    (tmp_path / "l.csv").write_text("".join(f"{a},{b}\n" for a, b in edges))
    _run("graph", "listrank", tmp_path / "l.csv", "-o", tmp_path / "r.csv", "--device", "cpu")
    vertex, rank = _graph_columns(tmp_path / "r.csv", ["vertex", "rank"])
    expect, at = np.zeros(n, np.int64), 0
    for i in range(n):
        at = 0 if i == 0 or i - 1 in cut else at + 1
        expect[order[i]] = at
    assert np.array_equal(vertex, np.arange(n)) and np.array_equal(rank, expect)
