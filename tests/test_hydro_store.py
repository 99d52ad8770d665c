"""``terrain watershed | basins | streams | hand`` on stores: the stored results equal the references
of test_hydro (a reverse-graph traversal, a recursion, a flow-path walk) on the stored directions;
bad input is one line, exit 1, nothing written."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, reference_hand, reference_labels, reference_network, utm_store
from terrain_io.grid.flow.codes import NODATA

_register()
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    path = tmp_path_factory.mktemp("hydro") / "a.zarr"
    utm_store(path, hydro_dem(7).astype(np.float32), tile=16, shard=2)
    res = run("flow", path, "--condition", "fill")
    assert res.exit_code == 0, res.output
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(path)
    arrays = {n: np.asarray(st.group[n][...]) for n in ("flow/direction", "flow/accumulation", "fill/elevation")}
    return path, arrays


def read(path, name):
    from terrain_io.store import TerrainStore

    return np.asarray(TerrainStore.open(path).group[name][...])


def test_watershed_and_basins(routed, tmp_path):
    path, a = routed
    d = a["flow/direction"]
    cells = [tuple(int(v) for v in c) for c in np.argwhere(a["flow/accumulation"] >= 60)[::5][:4]]
    x, y = 500000.0 + 30 * (cells[0][1] + 0.5), 4100000.0 - 30 * (cells[0][0] + 0.5)
    args = ["watershed", path, "--at", f"{x},{y}", "--name", "g"]
    for r, c in cells[1:]:
        args += ["--cell", f"{r},{c}"]
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("watershed g: 4 outlets")
    np.testing.assert_array_equal(read(path, "watershed/g/label"), reference_labels(d, cells))
    res = run("basins", path, "--table", tmp_path / "b.csv")
    assert res.exit_code == 0, res.output
    terminals = sorted((r, c) for r, c in np.argwhere(d != NODATA) if d[r, c] >= 8)
    ref = reference_labels(d, [tuple(int(v) for v in t) for t in terminals])
    np.testing.assert_array_equal(read(path, "basins/label"), ref)
    rows = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert [int(r["cells"]) for r in rows] == np.bincount(ref.ravel())[1:].tolist()
    assert [float(r["area_m2"]) for r in rows] == [900.0 * int(r["cells"]) for r in rows]


def test_streams_and_hand(routed, tmp_path):
    path, a = routed
    d, acc, z = a["flow/direction"], a["flow/accumulation"], a["fill/elevation"]
    res = run("streams", path, "--threshold", 9000, "--units", "m2", "--table", tmp_path / "s.csv")  # 10 cells
    assert res.exit_code == 0, res.output
    stream, strahler, shreve, link, heads, ds = reference_network(d, acc, 10)
    ref_s = np.zeros(d.shape, np.int64)
    for cell in stream:
        ref_s[cell] = strahler[cell]
    np.testing.assert_array_equal(read(path, "streams/order"), ref_s)
    np.testing.assert_array_equal(read(path, "streams/link"), link)
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert len(rows) == len(heads)
    for row in rows:  # the downstream link is the link of the cell below the tail
        nxt = ds[(int(row["tail_row"]), int(row["tail_col"]))]
        assert int(row["downstream"]) == (link[nxt] if nxt is not None else 0)
    res = run("hand", path, "--threshold", 10)
    assert res.exit_code == 0, res.output
    zf = np.where(np.isnan(z), 0, z)
    ref, first = reference_hand(zf, d, stream)
    got = read(path, "hand/height")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[~np.isnan(ref)], ref[~np.isnan(ref)].astype(np.float32))
    drain = read(path, "hand/drainage")
    assert all(drain[cell] == link[c] for cell, c in first.items())


def test_bad_input(routed, tmp_path):
    path, _ = routed
    bare = tmp_path / "bare.zarr"
    utm_store(bare, hydro_dem(8, shape=(20, 20)).astype(np.float32))
    for args, words in [
        (["streams", bare, "--threshold", 5], "run terrain flow"),
        (["basins", bare], "run terrain flow"),
        (["streams", path, "--threshold", 0], "threshold must be a number > 0"),
        (["hand", path, "--threshold", -3], "threshold must be a number > 0"),
        (["watershed", path, "--cell", "500,3", "--name", "bad"], "outside the DEM"),
        (["watershed", path, "--at", "0,0", "--name", "bad"], "outside the DEM"),
        (["streams", path, "--threshold", 5, "--memory", "1KB"], "memory budget"),
    ]:
        res = run(*args)
        assert res.exit_code == 1 and res.output.startswith("terrain: error:"), (args, res.output)
        assert words in res.output, (args, res.output)
        assert res.output.count("\n") == 1
    from terrain_io.store import TerrainStore

    assert "watershed/bad/label" not in TerrainStore.open(path).results()
    assert not any(k.startswith("streams") for k in TerrainStore.open(bare).results())


@pytest.mark.parametrize("suffix", [".gpkg", ".geojson"])
def test_stream_vectors_follow_the_flow(routed, tmp_path, suffix):
    pyogrio = pytest.importorskip("pyogrio")
    path, a = routed
    d, acc, z = a["flow/direction"], a["flow/accumulation"], a["fill/elevation"]
    out = tmp_path / f"links{suffix}"
    res = run("streams", path, "--threshold", 10, "-o", out)
    assert res.exit_code == 0, res.output
    stream, strahler, shreve, link, heads, ds = reference_network(d, acc, 10)
    meta, _, geometry, values = pyogrio.raw.read(out)
    from rasterio.crs import CRS
    from terrain_io.store import TerrainStore

    assert CRS.from_user_input(meta["crs"]) == CRS.from_user_input(TerrainStore.open(path).crs)
    f = dict(zip(meta["fields"], values))
    assert len(geometry) == len(heads) and list(f["link"]) == list(range(1, len(heads) + 1))
    for i, wkb in enumerate(geometry):
        n = int(np.frombuffer(wkb[5:9], "<u4")[0])
        xy = np.frombuffer(wkb[9:], "<f8").reshape(n, 2)
        cells = [(int((4100000.0 - y) // 30), int((x - 500000.0) // 30)) for x, y in xy]
        assert cells[0] == heads[i]
        # each vertex is the flow's next cell from the one before; the last is the downstream link's head
        k = int((link == i + 1).sum())
        assert k == f["cells"][i] and len(cells) == k + (1 if f["downstream"][i] or k == 1 else 0)
        for a_, b_ in zip(cells, cells[1:]):
            assert a_ == b_ or ds[a_] == b_
        assert all(link[c] == i + 1 for c in cells[: int(f["cells"][i])])
        nxt = ds[cells[int(f["cells"][i]) - 1]]
        assert f["downstream"][i] == (link[nxt] if nxt is not None else 0)
        assert f["strahler"][i] == strahler[cells[0]] and f["shreve"][i] == shreve[cells[0]]
        assert f["drop"][i] == pytest.approx(float(z[cells[0]]) - float(z[cells[-1]]))
        assert f["upstream_m2"][i] == 900.0 * acc[cells[int(f["cells"][i]) - 1]]


def test_snap_and_outlets_file(routed, tmp_path):
    path, a = routed
    d, acc = a["flow/direction"], a["flow/accumulation"]
    rng = np.random.default_rng(3)
    valid = np.argwhere(d != NODATA)
    given = [tuple(int(v) for v in valid[i]) for i in rng.choice(len(valid), 3, replace=False)]
    dist = 75.0  # map units (30 m cells): 2.5 cells
    snapped = []
    for r, c in given:  # brute force over every cell: the largest accumulation within dist, nearest, row-major
        best = None
        for rr in range(d.shape[0]):
            for cc in range(d.shape[1]):
                d2 = ((rr - r) * 30.0) ** 2 + ((cc - c) * 30.0) ** 2
                if d[rr, cc] != NODATA and d2 <= dist * dist:
                    key = (-int(acc[rr, cc]), d2, rr, cc)
                    best = key if best is None or key < best else best
        snapped.append((best[2], best[3]))
    assert len(set(snapped)) == len(snapped) and snapped != given
    csv_path = tmp_path / "outlets.csv"
    csv_path.write_text("x,y\n" + "".join(f"{500000 + 30 * (c + 0.5)},{4100000 - 30 * (r + 0.5)}\n" for r, c in given))
    res = run("watershed", path, "--outlets", csv_path, "--snap", dist, "--name", "snapped")
    assert res.exit_code == 0, res.output
    from terrain_io.store import TerrainStore

    attrs = TerrainStore.open(path).group["watershed/snapped"].attrs
    assert [tuple(p) for p in attrs["snapped"]] == snapped and [tuple(p) for p in attrs["outlets"]] == given
    np.testing.assert_array_equal(read(path, "watershed/snapped/label"), reference_labels(d, snapped))


def test_basin_polygons_cover_their_cells(routed, tmp_path):
    pyogrio = pytest.importorskip("pyogrio")
    from rasterio import features
    from rasterio.crs import CRS
    from affine import Affine
    from terrain_io.store import TerrainStore

    path, a = routed
    out = tmp_path / "basins.gpkg"
    res = run("basins", path, "-o", out)
    assert res.exit_code == 0, res.output
    label = read(path, "basins/label")
    meta, _, geometry, values = pyogrio.raw.read(out)
    st = TerrainStore.open(path)
    assert CRS.from_user_input(meta["crs"]) == CRS.from_user_input(st.crs)
    f = dict(zip(meta["fields"], values))
    assert sorted(set(f["id"].tolist())) == list(range(1, label.max() + 1))
    # the polygons burnt back onto the grid (GDAL's rasterize, cell centres) give the labels again
    import json

    shapes = []
    for wkb, i in zip(geometry, f["id"]):
        nrings = int(np.frombuffer(wkb[5:9], "<u4")[0])
        off, rings = 9, []
        for _ in range(nrings):
            n = int(np.frombuffer(wkb[off : off + 4], "<u4")[0])
            rings.append(np.frombuffer(wkb[off + 4 : off + 4 + 16 * n], "<f8").reshape(n, 2).tolist())
            off += 4 + 16 * n
        shapes.append((json.loads(json.dumps({"type": "Polygon", "coordinates": rings})), int(i)))
    burnt = features.rasterize(shapes, out_shape=label.shape, transform=Affine.from_gdal(*st.transform), dtype="int32")
    np.testing.assert_array_equal(burnt, label)
    cells = np.bincount(label.ravel())[1:]
    for i, n, area in zip(f["id"], f["cells"], f["area_m2"]):
        assert n == cells[i - 1] and area == 900.0 * n


def test_pictures(routed, tmp_path):
    import rasterio

    path, a = routed
    assert run("basins", path).exit_code == 0 and run("streams", path, "--threshold", 10).exit_code == 0
    for name in ("basins/label", "streams/order", "streams/link"):
        out = tmp_path / (name.replace("/", "_") + ".png")
        res = run("export", path, name, "-o", out)
        assert res.exit_code == 0, res.output
        values = read(path, name)
        with rasterio.open(out) as f:
            img = f.read()[:, : values.shape[0], : values.shape[1]]
        np.testing.assert_array_equal(img[3] == 0, values == 0)  # clear off the basins / the network
        for v in np.unique(values)[1:6]:  # one colour a value
            colours = img[:3, values == v].T
            assert (colours == colours[0]).all()


def test_same_bytes_for_every_tile_size(routed, tmp_path):
    path, a = routed
    z = hydro_dem(7).astype(np.float32)
    other = tmp_path / "b.zarr"
    utm_store(other, z, tile=8, shard=4)
    assert run("flow", other, "--condition", "fill").exit_code == 0
    for p in (path, other):
        for args in (["basins"], ["streams", "--threshold", 7], ["hand", "--threshold", 7]):
            res = run(args[0], p, *args[1:])
            assert res.exit_code == 0, res.output
    for name in ("basins/label", "streams/order", "streams/magnitude", "streams/link", "hand/height", "hand/drainage"):
        assert read(path, name).tobytes() == read(other, name).tobytes(), name
