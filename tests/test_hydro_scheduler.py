"""Issue 30's ``--scheduler`` for watershed, basins, streams and HAND: on a Dask scheduler the whole
command runs as one task on a worker (with ``local-cuda`` on its own GPU: tests/test_multigpu.py),
writing the store's arrays, the vectors and the table there. Reference: the same command in this
process (itself tested against pyflwdir, pysheds and traversals written in tests/test_hydro*.py); every
array, table and vector file byte for byte, in core and out of core."""
from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.grid.flow.pipeline import flow
from terrain_io.grid.hydro.pipeline import basins, hand, streams, watershed
from terrain_io.store import TerrainStore
from terrain_io.synth import synthesize

_register()
pytest.importorskip("dask")


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    st = synthesize(tmp_path_factory.mktemp("sched") / "dem.zarr", 160, cols=200, seed=4, nodata_fraction=0.05,
                    tile=32, shard=2)
    flow(st, device="cpu", progress=False)
    return TerrainStore.open(st.path)


def _bytes(st: TerrainStore, group: str) -> dict:
    g = TerrainStore.open(st.path).group[group]
    return {k: hashlib.sha256(np.ascontiguousarray(a[...]).view(np.uint8)).hexdigest() for k, a in g.arrays()}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(st: TerrainStore, path) -> TerrainStore:
    shutil.copytree(st.path, path)
    return TerrainStore.open(path)


@pytest.mark.parametrize("window_tiles", [None, 1], ids=["in-core", "windows"])
@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_each_command_on_a_scheduler_writes_the_bytes_of_this_process(routed, tmp_path, scheduler, window_tiles):
    """Each store is a fresh copy of the routed one: what a command writes on the scheduler is its own."""
    here_st, there_st = _copy(routed, tmp_path / "here.zarr"), _copy(routed, tmp_path / "there.zarr")
    runs = {
        "basins": lambda st, **k: basins(st, device="cpu", window_tiles=window_tiles, **k),
        "streams": lambda st, **k: streams(st, 40, device="cpu", window_tiles=window_tiles, **k),
        "hand": lambda st, **k: hand(st, 40, device="cpu", window_tiles=window_tiles, **k),
        "watershed/default": lambda st, **k: watershed(st, [(60, 70), (120, 150)], device="cpu",
                                                       window_tiles=window_tiles, **k),
    }
    for group, run in runs.items():
        tables = {s: tmp_path / f"{group.replace('/', '_')}-{s}.csv" for s in ("here", "there")}
        has_table = group in ("basins", "streams")
        here = run(here_st, progress=False, **({"table": tables["here"]} if has_table else {}))
        there = run(there_st, progress=False, scheduler=scheduler, **({"table": tables["there"]} if has_table else {}))
        assert _bytes(there_st, group) == _bytes(here_st, group), group
        assert there.attrs == here.attrs and there.line.split(",")[0] == here.line.split(",")[0], group
        assert there.table is None  # written on the worker
        if has_table:
            assert here.table is not None
            assert _digest(tables["there"]) == _digest(tables["here"])


def test_cli_scheduler_writes_the_table_and_vectors_of_a_local_run(routed, tmp_path):
    pyogrio = pytest.importorskip("pyogrio")
    pytest.importorskip("pyogrio.raw")
    runner = CliRunner()
    for sched in ("local", "processes"):
        r = runner.invoke(cli, ["streams", str(routed.path), "--threshold", "40", "--device", "cpu", "-q",
                                "--scheduler", sched, "--table", str(tmp_path / f"{sched}.csv"),
                                "-o", str(tmp_path / f"{sched}.geojson")])
        assert r.exit_code == 0, r.output
    assert _digest(tmp_path / "local.csv") == _digest(tmp_path / "processes.csv")
    (meta, _, geometry, fields), (meta2, _, geometry2, fields2) = (
        pyogrio.raw.read(tmp_path / f"{s}.geojson") for s in ("local", "processes"))
    assert list(meta["fields"]) == list(meta2["fields"]) and len(geometry) == len(geometry2) > 0
    assert [bytes(g) for g in geometry] == [bytes(g) for g in geometry2]
    for a, b in zip(fields, fields2):
        np.testing.assert_array_equal(a, b)


def test_a_table_asked_of_a_command_without_one_is_refused_before_any_work(routed, tmp_path):
    from terrain_io.errors import InputError

    st = _copy(routed, tmp_path / "s.zarr")
    for run in (lambda **k: hand(st, 40, device="cpu", **k), lambda **k: watershed(st, [(60, 70)], device="cpu", **k)):
        for scheduler in ("local", "threads"):
            with pytest.raises(InputError, match="makes no table"):
                run(progress=False, table=tmp_path / "t.csv", scheduler=scheduler)
    assert not {"hand", "watershed/default"} & set(TerrainStore.open(st.path).results())
    assert not (tmp_path / "t.csv").exists()


def test_cli_scheduler_bad_input_is_one_line_before_any_worker(routed, tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["basins", str(routed.path), "--device", "cpu", "--scheduler", "nowhere"])
    assert r.exit_code != 0 and "unknown scheduler 'nowhere'" in r.output and "Traceback" not in r.output
    taken = tmp_path / "taken.geojson"
    taken.write_text("{}")
    r = runner.invoke(cli, ["basins", str(routed.path), "--device", "cpu", "--scheduler", "processes",
                            "-o", str(taken)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert taken.read_text() == "{}"  # nothing already written is lost
