"""Outputs on demand (issue 31): ``terrain sssp --no-predecessor`` writes the distances only, the
same bytes as a default run (which writes the predecessors too, as before), on every method."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from terrain_io import integrity
from terrain_io.errors import StoreError
from terrain_io.grid.sssp import sssp
from terrain_io.grid.sssp.path import trace_all
from references import make_store, random_dem, reference


@pytest.mark.parametrize("method,kw", [("incore", {}), ("shards", {"unit": 16}), ("index", {"cluster": 4})])
def test_no_predecessor_writes_the_same_distances_and_no_predecessor(tmp_path, method, kw):
    v = random_dem((40, 37), seed=5, holes=0.05)
    st = make_store(tmp_path, v, tile=8, shard=2)
    sources = [(3, 4), (30, 20)]
    args = dict(weight="absdiff", cell=True, progress=False, method=method, allocation=True, **kw)
    sssp(st, sources, name="full", **args)
    sssp(st, sources, name="dist", predecessor=False, **args)
    full, dist = st.group["sssp/full"], st.group["sssp/dist"]
    assert "predecessor" in full and "predecessor" not in dist
    assert not (tmp_path / "dem.zarr" / "sssp" / "dist" / "predecessor").exists()
    assert dist["distance"][:].tobytes() == full["distance"][:].tobytes()
    assert dist["source"][:].tobytes() == full["source"][:].tobytes()
    if method != "index":  # (the index method may differ in the last bit on ties: test_grid_sssp_shards)
        np.testing.assert_array_equal(dist["distance"][:], reference(v.astype(np.float64), sources, "absdiff")
                                      .astype(np.float32))
    report = integrity.verify(tmp_path / "dem.zarr")
    assert not report.problems, report.problems
    with pytest.raises(StoreError, match="distances only"):
        trace_all(st, [(10, 10)], name="dist", cell=True)


def test_cli_no_predecessor(tmp_path):
    from cli.main import _register, cli

    _register()
    make_store(tmp_path, random_dem((24, 24), seed=2), tile=8, shard=2)
    store = str(tmp_path / "dem.zarr")
    for name, extra in (("a", []), ("b", ["--no-predecessor"])):
        res = CliRunner().invoke(cli, ["sssp", store, "--cell", "--source", "5,5", "--name", name, "--device", "cpu",
                                       *extra])
        assert res.exit_code == 0, res.output
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(store)
    assert "predecessor" in st.group["sssp/a"] and "predecessor" not in st.group["sssp/b"]
    assert st.group["sssp/a/distance"][:].tobytes() == st.group["sssp/b/distance"][:].tobytes()
