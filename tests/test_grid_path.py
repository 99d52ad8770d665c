"""``terrain path`` / terrain_io.grid.sssp.path, and the SSSP commands end to end through the CLI.

The traced path is checked by a sequential walk: consecutive cells are neighbours, it starts at
the source, and the sum of its edge weights equals scipy's shortest distance to the target."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.grid.sssp.path import trace
from terrain_io.grid.sssp import sssp
from terrain_io.store import TerrainStore
from references import make_store, random_dem, reference, walk_cost


_register()


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
def test_path_cost_equals_scipy_distance(tmp_path, kind):
    vals = random_dem((40, 36), seed=11, holes=0.1)
    vals[2, 3] = vals[37, 30] = 4.0
    st = make_store(tmp_path, vals, tile=8, dx=5.0, dy=5.0)
    sssp(st, (2, 3), weight=kind, cell=True, progress=False, cluster=4, name="a", method="index")
    p = trace(st, (37, 30), cell=True)
    assert tuple(p.cells[0]) == (2, 3) and tuple(p.cells[-1]) == (37, 30)
    ref = reference(vals.astype(np.float64), [(2, 3)], kind, 5.0, 5.0)
    assert np.isclose(p.cost, ref[37, 30], rtol=1e-5)
    assert np.isclose(walk_cost(vals, p.cells.tolist(), kind, 5.0, 5.0), ref[37, 30], rtol=1e-5)
    x, y = st.cell_to_map(37, 30)
    assert np.allclose(p.xy[-1], [x, y])


def test_cli_sssp_index_path_export(tmp_path):
    vals = random_dem((48, 40), seed=2)
    st = make_store(tmp_path, vals, tile=16, dx=10.0, dy=10.0)
    path = str(st.path)
    runner = CliRunner()
    res = runner.invoke(cli, ["-q", "index", path, "--weight", "surface", "--cluster", "8"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["sssp", path, "--source", "155,425", "--source", "305,105", "--weight", "surface",
                              "--name", "two"])
    assert res.exit_code == 0, res.output
    assert "index reused" in res.output and "2 source(s)" in res.output
    # (155, 425) and (305, 105) are the centres of cells (7, 5) and (39, 20)
    ref = reference(vals.astype(np.float64), [(7, 5), (39, 20)], "surface", 10.0, 10.0)
    np.testing.assert_allclose(TerrainStore.open(path).group["sssp/two/distance"][:], ref, rtol=1e-5)
    out = tmp_path / "p.geojson"
    res = runner.invoke(cli, ["path", path, "--to", "495,25", "-o", str(out)])
    assert res.exit_code == 0, res.output
    feat = json.loads(out.read_text())["features"][0]
    assert feat["geometry"]["type"] == "LineString"
    assert np.isclose(feat["properties"]["cost"], ref[48 - 1, 39], rtol=1e-5)
    assert feat["geometry"]["coordinates"][-1] == [495.0, 25.0]
    for suffix in ("tif", "png"):
        res = runner.invoke(cli, ["export", path, "sssp/two/distance", "-o", str(tmp_path / f"d.{suffix}")])
        assert res.exit_code == 0, res.output
    import rasterio

    with rasterio.open(tmp_path / "d.tif") as ds:
        np.testing.assert_allclose(ds.read(1), ref, rtol=1e-5)
    res = runner.invoke(cli, ["sssp", path, "--source", "0,0"])
    assert res.exit_code == 1 and "outside the DEM" in res.output
    res = runner.invoke(cli, ["path", path, "--to", "1e9,1e9"])
    assert res.exit_code == 1 and "outside the DEM" in res.output
