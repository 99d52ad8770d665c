"""``terrain flow --scheduler``: the out-of-core windows as Dask tasks (whole shards) write the bytes
of the in-process pipeline -- directions equal to the D8 + Barnes 2014 reference written in the tests
(tests/references.py), counts equal to a topological-order sum, weighted sums the same bits as the
local run of the same windows; the compact flat solve and the window sweeps both."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import jacksboro, priority_flood, reference_directions, topological_sum, utm_store
from terrain_io.errors import InputError
from terrain_io.grid.flow.pipeline import flow, read_flow

_register()
pytest.importorskip("dask")


def _filled(tmp_path, name="a.zarr"):
    z = jacksboro()[:120, :150].astype(np.float32)
    z[40:46, 60:70] = np.nan
    valid = ~np.isnan(z)
    filled = np.where(valid, priority_flood(np.nan_to_num(z), valid), np.nan).astype(np.float32)
    return utm_store(tmp_path / name, filled, tile=16, shard=2), filled, valid


@pytest.mark.parametrize("sweeps", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_threads_scheduler_same_bytes_as_local(tmp_path, sweeps):
    st, filled, valid = _filled(tmp_path)
    expected, _, _ = reference_directions(filled, valid, 30.0, 30.0, "edge+nodata")
    w = np.random.default_rng(3).random(filled.shape) * 4
    out = {}
    for scheduler in ("local", "threads"):
        res = flow(st, condition="none", window_tiles=2, flat_sweeps=sweeps, scheduler=scheduler, progress=False)
        assert res.method == "tiled" and res.flat_cells > 256
        counts = read_flow(st)
        flow(st, condition="none", window_tiles=2, flat_sweeps=sweeps, scheduler=scheduler, weights=w,
             progress=False)
        out[scheduler] = counts["direction"], counts["accumulation"], read_flow(st)["accumulation"]
    assert np.array_equal(out["threads"][0], expected)
    assert np.array_equal(out["threads"][1], topological_sum(expected).astype(np.uint64))
    for a, b in zip(out["threads"], out["local"]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.slow
def test_processes_scheduler_cli(tmp_path):
    """Dask's process pool from the CLI: the in-process result's bytes (auto plans whole shards)."""
    st, filled, valid = _filled(tmp_path)
    assert CliRunner().invoke(cli, ["-q", "flow", str(st.path), "--condition", "none"]).exit_code == 0
    want = read_flow(st)
    r = CliRunner().invoke(cli, ["-q", "flow", str(st.path), "--condition", "none", "--scheduler", "processes",
                                 "--memory", "64MB"])
    assert r.exit_code == 0, r.output
    got = read_flow(st)
    for name in ("direction", "accumulation"):
        assert got[name].tobytes() == want[name].tobytes()


def test_scheduler_refusals(tmp_path):
    st, _, _ = _filled(tmp_path)
    with pytest.raises(InputError, match="whole shard"):
        flow(st, condition="none", window_tiles=1, scheduler="threads", progress=False)


@pytest.mark.slow
def test_distributed_cluster_same_bytes(tmp_path):
    """A ``dask.distributed`` cluster of worker processes (tasks by address): the local bytes."""
    distributed = pytest.importorskip("distributed")
    st, _, _ = _filled(tmp_path)
    flow(st, condition="none", window_tiles=2, progress=False)
    want = read_flow(st)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        res = flow(st, condition="none", scheduler=c.scheduler_address, memory="64MB", progress=False)
    assert res.method == "tiled" and res.window_tiles == 2
    got = read_flow(st)
    for name in ("direction", "accumulation"):
        assert got[name].tobytes() == want[name].tobytes()
