"""Outputs on demand (issue 31): ``terrain fill --outputs`` writes only the named arrays, each the
same bytes as a full run's -- which is held to the Priority-Flood and lake references of
tests/references.py -- on every route (floods held, re-flooded by whole shards and by parts of a
shard, the GPU); a bad name is one usage line, nothing written. (``sssp --no-predecessor``:
tests/test_sssp_outputs.py.)"""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from terrain_io import integrity
from terrain_io.errors import InputError
from terrain_io.grid.fill import fill
from terrain_io.store import TerrainStore
from references import check_against_references, fill_test_dem

SUBSETS = (("elevation",), ("depth",), ("depression",), ("elevation", "depression"), ("depth", "depression"))
ROUTES = {"held": {"held": True}, "shards": {"held": False}, "parts": {"held": False, "batch_tiles": 1}}


def _arrays(store: TerrainStore) -> set[str]:
    return {n for n in store.group["fill"].array_keys() if n not in ("x", "y", "spatial_ref")}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_only_the_named_arrays_the_full_runs_bytes(tmp_path, route):
    h = fill_test_dem("nodata-holed", 45, 38, seed=7)
    full = TerrainStore.from_array(tmp_path / "full.zarr", h, tile=8, shard=2)
    _, want = check_against_references(full, **ROUTES[route])  # the full run, against the references
    for outputs in SUBSETS:
        path = tmp_path / f"{route}-{'-'.join(outputs)}.zarr"
        st = TerrainStore.from_array(path, h, tile=8, shard=2)
        res = fill(st, device="cpu", progress=False, outputs=",".join(reversed(outputs)), **ROUTES[route])
        st = TerrainStore.open(path)
        assert _arrays(st) == set(outputs)
        assert sorted(p.name for p in (path / "fill").iterdir() if not p.name.startswith(".")) == sorted(
            {*outputs, "x", "y", "spatial_ref", "zarr.json"})
        for name in outputs:
            assert st.group[f"fill/{name}"][...].tobytes() == want[name].tobytes(), (outputs, name)
        assert st.group["fill"].attrs["outputs"] == list(outputs)
        assert res.depressions == len(res.table) and res.depressions > 0
        report = integrity.verify(path)
        assert not report.problems, report.problems


def test_bad_outputs_refused(tmp_path):
    st = TerrainStore.from_array(tmp_path / "a.zarr", fill_test_dem("random", 20, 20, seed=1), tile=8, shard=2)
    for bad in ("elevation,lakes", "", ",", ["depth", "Depth"]):
        with pytest.raises(InputError, match="fill outputs are elevation, depth, depression"):
            fill(st, device="cpu", progress=False, outputs=bad)
    assert "fill" not in TerrainStore.open(st.path).group


def test_cli_outputs(tmp_path):
    from cli.main import _register, cli

    _register()
    st = TerrainStore.from_array(tmp_path / "a.zarr", fill_test_dem("terraced", 30, 26, seed=2), tile=8, shard=2)
    store = str(st.path)
    listing = sorted(p.name for p in st.path.iterdir())
    for bad in ("elevation,lakes", "depth;depression", ""):
        res = CliRunner().invoke(cli, ["fill", store, "--device", "cpu", "--outputs", bad])
        assert res.exit_code == 2, res.output
        lines = [x for x in res.output.splitlines() if x.strip()]
        assert lines[0].startswith("terrain: error:") and "elevation, depth, depression" in lines[0], res.output
        assert len(lines) <= 2 and all("Traceback" not in x for x in lines), res.output  # (+ the -h hint)
        assert sorted(p.name for p in st.path.iterdir()) == listing  # nothing written
    res = CliRunner().invoke(cli, ["fill", store, "--device", "cpu", "--outputs", "depth"])
    assert res.exit_code == 0, res.output
    assert _arrays(TerrainStore.open(store)) == {"depth"}
    res = CliRunner().invoke(cli, ["fill", store, "--device", "cpu"])  # default: all three, as before
    assert res.exit_code == 0, res.output
    assert _arrays(TerrainStore.open(store)) == {"elevation", "depth", "depression"}


@pytest.mark.gpu
def test_gpu_only_the_named_arrays_the_cpu_bytes(tmp_path):
    pytest.importorskip("cupy")
    h = fill_test_dem("nodata-holed", 70, 90, seed=3)
    _, want = check_against_references(TerrainStore.from_array(tmp_path / "cpu.zarr", h, tile=16, shard=2))
    for outputs in SUBSETS:
        path = tmp_path / f"gpu-{'-'.join(outputs)}.zarr"
        st = TerrainStore.from_array(path, h, tile=16, shard=2)
        assert fill(st, device="gpu", progress=False, outputs=outputs).device == "gpu"
        st = TerrainStore.open(path)
        assert _arrays(st) == set(outputs)
        for name in outputs:
            assert st.group[f"fill/{name}"][...].tobytes() == want[name].tobytes(), (outputs, name)
        assert not integrity.verify(path).problems
