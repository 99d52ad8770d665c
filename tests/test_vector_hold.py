"""Link vectors written in one GDAL call where the memory budget holds them (issue 30's ``streams -o``
speed): :func:`terrain_io.vectors.feature_stream` holds batches up to ``hold`` bytes of geometry,
and a GeoPackage written in one call still carries its R-tree, checked with SQLite against each
line's bounds (the GeoPackage standard's ``rtree_<table>_<column>`` table)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, utm_store
from terrain_io.grid.hydro import _cpu, arrow
from terrain_io.grid.hydro import pipeline as P
from terrain_io.vectors import feature_stream

_register()
pyogrio = pytest.importorskip("pyogrio")


def lines(n: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """``n`` LineStrings of 2-4 random points as ISO WKB (built here from the format's definition)."""
    rng = np.random.default_rng(seed)
    out, boxes = [], []
    for _ in range(n):
        xy = rng.uniform(0, 1000, (int(rng.integers(2, 5)), 2))
        out.append(b"\x01" + (2).to_bytes(4, "little") + len(xy).to_bytes(4, "little") + xy.astype("<f8").tobytes())
        boxes.append([*xy.min(0), *xy.max(0)])
    return out, np.asarray(boxes)


def rtree_bounds(path) -> np.ndarray:
    """The GeoPackage's spatial index: (minx, miny, maxx, maxy) by feature id, read with SQLite."""
    with sqlite3.connect(path) as db:
        (table, column), = db.execute("SELECT table_name, column_name FROM gpkg_extensions "
                                      "WHERE extension_name = 'gpkg_rtree_index'").fetchall()
        rows = db.execute(f'SELECT id, minx, miny, maxx, maxy FROM "rtree_{table}_{column}" ORDER BY id').fetchall()
    return np.asarray(rows)


@pytest.mark.parametrize("hold", [0, 100, 10**9])
def test_batches_held_then_written_with_their_index(tmp_path, monkeypatch, hold):
    import pyogrio.raw as raw

    calls = []
    real = raw.write
    monkeypatch.setattr(raw, "write", lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1])
    batches = [lines(k, seed) for seed, k in enumerate((3, 5, 4))]
    out = tmp_path / "held.gpkg"
    with feature_stream(out, "LineString", "EPSG:32614", hold=hold) as write:
        start = 0
        for geometry, _ in batches:
            write(np.array(geometry, object), {"id": np.arange(start + 1, start + len(geometry) + 1)})
            start += len(geometry)
    expect, size, held = [], 0, 0
    for geometry, _ in batches:  # a write each time the geometry held passes `hold` bytes, the rest at the end
        size, held = size + sum(map(len, geometry)), held + len(geometry)
        if size > hold:
            expect.append(held)
            size = held = 0
    assert calls == expect + ([held] if held else [])
    _, _, geometry, (ids,) = pyogrio.raw.read(out)
    assert [bytes(g) for g in geometry] == [g for b in batches for g in b[0]] and list(ids) == list(range(1, 13))
    index = rtree_bounds(out)
    np.testing.assert_array_equal(index[:, 0], np.arange(1, 13))
    boxes = np.concatenate([b[1] for b in batches])  # the R-tree stores float32 bounds rounded outwards
    assert (index[:, 1:3] <= boxes[:, :2]).all() and (index[:, 3:] >= boxes[:, 2:]).all()
    np.testing.assert_allclose(index[:, 1:], boxes, rtol=1e-6)


def test_stream_links_written_in_one_call_where_the_budget_holds_them(tmp_path, monkeypatch):
    import pyogrio.raw as raw

    path = tmp_path / "a.zarr"
    utm_store(path, hydro_dem(7).astype(np.float32), tile=16, shard=2)
    assert CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill"]).exit_code == 0
    calls = []
    real = raw.write
    monkeypatch.setattr(raw, "write", lambda *a, **k: (calls.append(k["append"]), real(*a, **k))[1])
    monkeypatch.setattr(P, "LINK_BATCH", 7)
    monkeypatch.setattr(arrow, "usable", lambda driver: False)  # pyogrio's writer (GDAL's Arrow way: test_streams_arrow.py)
    held, each = tmp_path / "held.gpkg", tmp_path / "each.gpkg"
    P.streams(path, 6, progress=False, vectors=held, device="cpu")
    n = len(pyogrio.raw.read(held)[2])
    assert n > 14 and calls == [False]  # batches of 7 links, one GDAL write
    calls.clear()
    monkeypatch.setattr(P, "VECTOR_HOLD", 2**62)  # nothing held: a write a batch, appended
    P.streams(path, 6, progress=False, vectors=each, device="cpu")
    assert calls == [False] + [True] * (-(-n // 7) - 1)
    a, b = pyogrio.raw.read(held), pyogrio.raw.read(each)
    assert [bytes(g) for g in a[2]] == [bytes(g) for g in b[2]] and list(a[0]["fields"]) == list(b[0]["fields"])
    for x, y in zip(a[3], b[3]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(rtree_bounds(held), rtree_bounds(each))


def test_walked_batches_never_pile_up_behind_a_slow_writer(tmp_path, monkeypatch):
    """The links' batches are walked at most two a walker ahead of the GDAL write (before: every
    batch submitted at once, all of them held while a slow write ran); the features are the link
    table's links, ids 1.. in order, one a link."""
    import threading
    import time

    path = tmp_path / "a.zarr"
    utm_store(path, hydro_dem(7).astype(np.float32), tile=16, shard=2)
    assert CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill"]).exit_code == 0
    made, lock, ahead = [0], threading.Lock(), []
    real_points = _cpu.link_points

    def counted(*a, **k):  # a batch's lines made
        with lock:
            made[0] += 1
        return real_points(*a, **k)

    real_stream = P.feature_stream

    def slow_stream(*a, **k):
        cm = real_stream(*a, **k)

        class Slow:
            def __enter__(self):
                write = cm.__enter__()

                def slow(geometry, fields, masks=None):
                    time.sleep(0.02)  # the walkers meanwhile run as far ahead as they may
                    with lock:
                        ahead.append(made[0] - len(ahead) - 1)  # batches walked and not yet written
                    return write(geometry, fields, masks)
                return slow

            def __exit__(self, *exc):
                return cm.__exit__(*exc)
        return Slow()

    monkeypatch.setattr(_cpu, "link_points", counted)
    monkeypatch.setattr(P, "feature_stream", slow_stream)
    monkeypatch.setattr(arrow, "usable", lambda driver: False)
    monkeypatch.setattr(P, "LINK_BATCH", 2)
    out = tmp_path / "s.gpkg"
    res = P.streams(path, 6, progress=False, vectors=out, device="cpu")
    n = len(res.table["id"])
    assert len(ahead) == -(-n // 2) > 8 and max(ahead) <= 2 * P.LINE_THREADS, ahead
    meta, fids, geometry, fields = pyogrio.raw.read(out)
    names = list(meta["fields"])
    np.testing.assert_array_equal(fields[names.index("link")], np.arange(1, n + 1))
    np.testing.assert_array_equal(fields[names.index("downstream")], res.table["downstream"])
