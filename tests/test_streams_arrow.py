"""``streams -o`` (issue 30, the 16384^2 <= 5 s target): the links' WKB made in one buffer a batch
(checked against the format's definition), the GeoPackage written through GDAL's Arrow interface
(:mod:`terrain_io.grid.hydro.arrow`: read back by pyogrio as pyogrio's own writer writes them, its
R-tree as SQLite reads it), and the command's start-up (pyogrio imported without pandas; the link
kernels loaded once a process)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.grid.hydro import _cpu
from terrain_io.grid.hydro import pipeline as P
from terrain_io.vectors import feature_stream

_register()
pyogrio = pytest.importorskip("pyogrio")
ROOT = Path(__file__).resolve().parents[1]


def test_link_points_writes_iso_wkb_of_the_cell_centres():
    rng = np.random.default_rng(4)
    cols, counts = 37, np.array([2, 1, 5, 2, 17, 3, 2])
    starts = np.concatenate([[0], np.cumsum(counts)])
    verts = rng.integers(0, 29 * cols, starts[-1])
    t = np.array([500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0])
    hyp = np.array([[0.0, 30.0], [30.0, 30.0 * 2**0.5]])
    offsets = 9 * np.arange(len(starts)) + 16 * starts
    wkb, step = np.full(offsets[-1], 0xAB, np.uint8), np.empty(len(verts))
    _cpu.link_points(verts, starts, cols, t, hyp, wkb, step)
    for i, c in enumerate(counts):
        r, col = np.divmod(verts[starts[i]:starts[i + 1]], cols)
        xy = np.column_stack([500000.0 + (col + 0.5) * 30.0, 4100000.0 - (r + 0.5) * 30.0])
        # OGC Simple Features WKB: byte order 1 (NDR), uint32 type 2 (LineString), uint32 points, x y doubles
        want = struct.pack("<BII", 1, 2, c) + struct.pack(f"<{2 * c}d", *xy.ravel())
        assert wkb[offsets[i]:offsets[i + 1]].tobytes() == want
    # steps: to the next vertex of the same link, by |dr|, |dc| (these random vertices are not neighbours:
    # the table is indexed by the differences clipped to the 2 x 2 of a neighbour's)
    assert (step[starts[1:] - 1] == 0).all()


def _batches(seed: int, sizes) -> list:
    """Batches of random lines: (WKB buffer, offsets, fields) with every field type of the links."""
    rng = np.random.default_rng(seed)
    out, first = [], 1
    for n in sizes:
        counts = rng.integers(2, 6, n)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        xy = rng.uniform(0, 1e4, (int(starts[-1]), 2))
        lines = [struct.pack("<BII", 1, 2, c) + xy[starts[i]:starts[i + 1]].astype("<f8").tobytes()
                 for i, c in enumerate(counts)]
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in lines])]).astype(np.int64)
        up = rng.uniform(0, 1e6, n)
        up_m2 = np.where(rng.random(n) < 0.3, np.nan, up * 900.0)  # NaN: NULL, as pyogrio writes it
        fields = {"link": np.arange(first, first + n, dtype=np.int64), "downstream": rng.integers(0, 99, n),
                  "strahler": rng.integers(1, 9, n).astype(np.int32), "shreve": rng.integers(1, 500, n),
                  "cells": counts.astype(np.int64), "length_m": rng.uniform(0, 1e3, n), "upstream": up,
                  "upstream_m2": up_m2, "drop": rng.normal(size=n)}
        out.append((np.frombuffer(b"".join(lines), np.uint8), offsets, fields))
        first += n
    return out


@pytest.mark.parametrize("crs", ["EPSG:32633", None])
def test_arrow_links_read_back_as_pyogrios_writer_writes_them(tmp_path, crs):
    from test_vector_hold import rtree_bounds

    from terrain_io.grid.hydro import arrow

    assert arrow.usable("GPKG") and not arrow.usable("GeoJSON")
    batches = _batches(3, [40, 0, 1, 300])
    ours, theirs = tmp_path / "links.gpkg", tmp_path / "ref" / "links.gpkg"
    theirs.parent.mkdir()
    with arrow.link_stream(ours, crs, P.LINK_FIELDS) as write:
        for wkb, offsets, fields in batches:
            write(wkb, offsets, fields)
    with feature_stream(theirs, "LineString", crs, hold=10**9) as write:  # pyogrio's raw.write, one call
        for wkb, offsets, fields in batches:
            write([wkb[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])], fields)
    a = pyogrio.raw.read(ours, return_fids=True)
    b = pyogrio.raw.read(theirs, return_fids=True)
    for key in ("crs", "fields", "dtypes", "geometry_type", "ogr_types", "ogr_subtypes"):
        assert np.array_equal(np.asarray(a[0][key]), np.asarray(b[0][key])), key
    assert len(a[2]) == 341 and np.array_equal(a[1], b[1])
    assert [bytes(g) for g in a[2]] == [bytes(g) for g in b[2]]
    for x, y in zip(a[3], b[3]):
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
    assert pyogrio.list_layers(ours).tolist() == [["links", "LineString"]]
    assert np.array_equal(rtree_bounds(ours), rtree_bounds(theirs))


def test_arrow_writer_failure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from terrain_io.errors import OutputError
    from terrain_io.grid.hydro import arrow

    out = tmp_path / "links.gpkg"
    (wkb, offsets, fields), = _batches(5, [3])
    with pytest.raises(OutputError, match=r"links\.gpkg: cannot write it as GPKG: GDAL write"):
        with arrow.link_stream(out, None, P.LINK_FIELDS) as write:
            write(wkb, offsets, fields)
            monkeypatch.setattr(arrow.pyogrio_gdal(), "OGR_L_WriteArrowBatch", lambda *a: False)
            write(wkb, offsets, fields)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _routed(tmp_path) -> Path:
    from references import hydro_dem, utm_store  # (rasterio: not on the GPU machine's vector wheels)

    path = tmp_path / "a.zarr"
    utm_store(path, hydro_dem(7).astype(np.float32), tile=16, shard=2)
    assert CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill"]).exit_code == 0
    return path


def test_streams_links_through_arrow_equal_pyogrios(tmp_path, monkeypatch):
    """The command's GeoPackage, written by GDAL's Arrow interface a batch at a time, holds the features
    that pyogrio's writer writes (read back by pyogrio: WKB, every field, the CRS, the R-tree)."""
    from test_vector_hold import rtree_bounds

    from terrain_io.grid.hydro import arrow

    path = _routed(tmp_path)
    monkeypatch.setattr(P, "LINK_BATCH", 7)
    calls = []
    real = arrow.link_stream
    monkeypatch.setattr(arrow, "link_stream", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    ours = tmp_path / "ours.gpkg"
    res = P.streams(path, 6, progress=False, vectors=ours, device="cpu")
    assert calls == [ours]
    monkeypatch.setattr(arrow, "usable", lambda driver: False)
    theirs = tmp_path / "theirs" / "ours.gpkg"
    theirs.parent.mkdir()
    P.streams(path, 6, progress=False, vectors=theirs, device="cpu")
    a, b = pyogrio.raw.read(ours, return_fids=True), pyogrio.raw.read(theirs, return_fids=True)
    assert len(a[2]) == len(res.table["id"]) > 14 and a[0]["crs"] == b[0]["crs"] == "EPSG:32633"
    assert [bytes(g) for g in a[2]] == [bytes(g) for g in b[2]] and np.array_equal(a[1], b[1])
    for x, y in zip(a[3], b[3]):
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
    assert np.array_equal(rtree_bounds(ours), rtree_bounds(theirs))


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_terrain_command_writes_vectors_without_importing_pandas(tmp_path):
    """pyogrio's package imports pandas and pyarrow where installed (0.2-0.5 s of start-up); the terrain
    program imports pyogrio without them (``python -X importtime`` lists what it imported), and a
    library caller's process keeps them: ``import pandas`` works after, in both."""
    pytest.importorskip("pandas")
    path = _routed(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli", "-q", "streams", str(path), "--threshold",
                           "6", "-o", str(tmp_path / "s.gpkg"), "--device", "cpu"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "pyogrio.raw" in imported  # (pandas tried and refused: listed, but none of its modules)
    assert not [m for m in imported if m.startswith(("pandas.", "pyarrow.", "geopandas."))]
    assert len(pyogrio.raw.read(tmp_path / "s.gpkg")[2]) > 14
    out = _python("""
import sys
from terrain_io import vectors
vectors.lean_imports = True
vectors.pyogrio()
print("pandas" in sys.modules)
import pandas
print(pandas.__name__)
""")
    assert out.split() == ["False", "pandas"]
    assert _python("import sys\nfrom terrain_io import vectors\nvectors.pyogrio()\nprint('pandas' in sys.modules)"
                   ).split() == ["True"]  # a library caller: pyogrio imported as it imports itself


def test_link_kernels_load_once_a_process():
    out = _python("""
from terrain_io.grid.hydro import start_link_kernels
a = start_link_kernels()
assert start_link_kernels() is a
a.join()
from terrain_io.grid.hydro import _cpu
print(len(_cpu.link_orders.signatures), len(_cpu.walk_links.signatures), len(_cpu.link_points.signatures))
""")
    assert out.split() == ["1", "1", "1"]


@pytest.mark.gpu
def test_the_gpu_warm_up_runs_and_leaves_the_network_as_it_was():
    """``start_gpu``'s ``then`` swallows errors (the command's own calls report them): here the warm-up
    must run clean, and the network made after it equal the CPU's on a grid with junctions."""
    cp = pytest.importorskip("cupy")
    from terrain_io.grid.hydro import _gpu, warm_gpu

    warm_gpu()
    # a 4 x 4 grid: columns 0 and 2 flow down (code 2: south) into row 3, which flows east (code 0) out
    code = np.array([[2, 8, 2, 8], [2, 8, 2, 8], [2, 8, 2, 8], [0, 0, 0, 8]], np.uint8)
    acc = np.ones((4, 4), np.uint32)
    got = _gpu.stream_network(cp.asarray(code), cp.asarray(acc), 0.5)
    want = _cpu.stream_network(code, acc, 0.5)
    assert np.array_equal(got.link.get(), want.link) and np.array_equal(got.links.downstream, want.links.downstream)
    assert np.array_equal(got.links.strahler, want.links.strahler)
