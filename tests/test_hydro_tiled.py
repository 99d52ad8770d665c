"""Watersheds, basins, streams and HAND out of core (terrain_io.grid.hydro.tiled): for every window
size the same bytes as in core, and equal to the references of test_hydro (a reverse-graph
traversal, a recursion, a flow-path walk); streamed vectors equal to the in-core ones."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, reference_hand, reference_labels, reference_network, utm_store
from terrain_io.grid.flow.codes import NODATA
from terrain_io.grid.hydro import arrow
from terrain_io.grid.hydro import pipeline as P
from terrain_io.store import TerrainStore

_register()
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")
RESULTS = {"basins": ("label",), "watershed/w": ("label",), "streams": ("order", "magnitude", "link"),
           "hand": ("height", "drainage")}


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    path = tmp_path_factory.mktemp("hydro_tiled") / "a.zarr"
    utm_store(path, hydro_dem(11, shape=(45, 61)).astype(np.float32), tile=8, shard=4)
    res = CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill"])
    assert res.exit_code == 0, res.output
    st = TerrainStore.open(path)
    return path, {n: np.asarray(st.group[n][...]) for n in ("flow/direction", "flow/accumulation", "fill/elevation")}


def _all(path, window_tiles, outlets):
    out = {}
    out["basins"] = P.basins(path, window_tiles=window_tiles, progress=False).table
    P.watershed(path, outlets, name="w", window_tiles=window_tiles, progress=False)
    out["streams"] = P.streams(path, 6, window_tiles=window_tiles, progress=False).table
    P.hand(path, 6, window_tiles=window_tiles, progress=False)
    st = TerrainStore.open(path)
    for group, names in RESULTS.items():
        for n in names:
            a = st.group[f"{group}/{n}"]
            out[f"{group}/{n}"] = (np.asarray(a[...]), a.dtype)
    return out


def test_every_window_size_gives_the_incore_bytes(routed):
    path, a = routed
    d, acc, z = a["flow/direction"], a["flow/accumulation"], a["fill/elevation"]
    outlets = [tuple(int(v) for v in c) for c in np.argwhere(acc >= 40)[::7][:5]]
    held = _all(path, None, outlets)
    # the references (test_hydro's), so that equal results are right results
    terminals = sorted((int(r), int(c)) for r, c in np.argwhere(d != NODATA) if d[r, c] >= 8)
    np.testing.assert_array_equal(held["basins/label"][0], reference_labels(d, terminals))
    np.testing.assert_array_equal(held["watershed/w/label"][0], reference_labels(d, outlets))
    stream, strahler, shreve, link, heads, ds = reference_network(d, acc, 6)
    np.testing.assert_array_equal(held["streams/link"][0], link)
    for cell in stream:
        assert held["streams/order"][0][cell] == strahler[cell] and held["streams/magnitude"][0][cell] == shreve[cell]
    ref, _ = reference_hand(np.where(np.isnan(z), 0, z), d, stream)
    np.testing.assert_array_equal(held["hand/height"][0], ref.astype(np.float32))
    for k in (1, 2):  # windows of 8 and 16 cells: flow paths cross many windows
        tiled = _all(path, k, outlets)
        for name in (n for n in held if "/" in n):
            (values, dtype), (got, got_dtype) = held[name], tiled[name]
            assert got_dtype == dtype, (k, name)
            assert got.tobytes() == values.tobytes(), (k, name)
        for t in ("basins", "streams"):
            assert held[t].keys() == tiled[t].keys()
            for col in held[t]:
                np.testing.assert_array_equal(np.asarray(tiled[t][col]), np.asarray(held[t][col]),
                                              err_msg=f"{k} {t} {col}")


@pytest.mark.slow  # long: the default run keeps CI under its 15 minutes (the slow run covers it)
def test_a_tiny_budget_runs_out_of_core_with_the_same_results(tmp_path):
    pyogrio = pytest.importorskip("pyogrio")
    path = tmp_path / "b.zarr"
    utm_store(path, hydro_dem(12, shape=(160, 160)).astype(np.float32), tile=8, shard=4)
    assert CliRunner().invoke(cli, ["flow", str(path)]).exit_code == 0
    runs = {}
    for memory in (None, "1MB"):
        out = tmp_path / f"s{memory}.gpkg"
        args = ["streams", str(path), "--threshold", "6", "-o", str(out), "--table", str(tmp_path / f"t{memory}.csv")]
        res = CliRunner().invoke(cli, args + (["--memory", memory] if memory else []))
        assert res.exit_code == 0, res.output
        assert ("tiled" in res.output) == (memory is not None), res.output
        link = np.asarray(TerrainStore.open(path).group["streams/link"][...])
        meta, _, geometry, values = pyogrio.raw.read(out)
        rows = list(csv.reader(open(tmp_path / f"t{memory}.csv")))
        runs[memory] = (link, list(geometry), [list(v) for v in values], rows)
        budget = ["--memory", memory] if memory else []
        res = CliRunner().invoke(cli, ["hand", str(path), "--threshold", "6"] + budget)
        assert res.exit_code == 0 and ("tiled" in res.output) == (memory is not None), res.output
        runs[memory] += (np.asarray(TerrainStore.open(path).group["hand/height"][...]).tobytes(),)
    assert runs[None][0].tobytes() == runs["1MB"][0].tobytes()
    assert runs[None][1:] == runs["1MB"][1:]


def test_vectors_stream_in_batches(routed, tmp_path, monkeypatch):
    pyogrio = pytest.importorskip("pyogrio")
    path, _ = routed
    whole, batched = tmp_path / "whole.gpkg", tmp_path / "batched.gpkg"
    P.streams(path, 6, progress=False, vectors=whole)
    calls = []
    import pyogrio.raw as raw

    real = raw.write
    monkeypatch.setattr(raw, "write", lambda *a, **k: (calls.append(k["append"]), real(*a, **k))[1])
    monkeypatch.setattr(P, "LINK_BATCH", 7)
    monkeypatch.setattr(P, "VECTOR_HOLD", 2**62)  # no features held: each batch written as it comes
    monkeypatch.setattr(arrow, "usable", lambda driver: False)  # by pyogrio's writer
    monkeypatch.setattr(P.os, "cpu_count", lambda: 1)  # the windows one at a time (the others ran in threads)
    P.streams(path, 6, progress=False, vectors=batched, window_tiles=1)
    n = len(pyogrio.raw.read(whole)[2])
    assert calls == [False] + [True] * (-(-n // 7) - 1)  # one write a batch, appended
    a, b = pyogrio.raw.read(whole), pyogrio.raw.read(batched)
    assert list(a[2]) == list(b[2])
    for x, y in zip(a[3], b[3]):
        np.testing.assert_array_equal(x, y)


def test_flatgeobuf_batches_are_written_once_at_the_end(routed, tmp_path, monkeypatch):
    pyogrio = pytest.importorskip("pyogrio")
    path, _ = routed
    whole = tmp_path / "whole.gpkg"
    P.streams(path, 6, progress=False, vectors=whole)
    monkeypatch.setattr(P, "LINK_BATCH", 5)
    out = tmp_path / "batched.fgb"
    P.streams(path, 6, progress=False, vectors=out)
    a, b = pyogrio.raw.read(whole), pyogrio.raw.read(out)
    o = np.argsort(b[3][list(b[0]["fields"]).index("link")])  # FlatGeobuf orders features by its spatial index
    assert list(a[2]) == list(b[2][o]) and len(b[2]) > 5
    for x, y in zip(a[3], b[3]):
        np.testing.assert_array_equal(x, y[o])
