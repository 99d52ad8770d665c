"""The in-core GPU SSSP's way in and out (issue 31): the DEM's zstd frames decoded on the GPU
(``pinned.read_device``) into the ringed block, the results compressed there (nvCOMP) on their way
out. On a GPU machine with nvCOMP (``pytest -m gpu``): the stored distances are scipy's Dijkstra,
the predecessors the tie rule from its definition, and both the CPU engine's bytes -- for a float32
DEM with holes and an int16 DEM with a nodata value (converted to the block's float32 on the GPU),
both cut inside a chunk at their edges -- whether the frames are decoded on the GPU or not."""
import numpy as np
import pytest

from terrain_io import nvzstd
from terrain_io.grid.sssp import sssp
from terrain_io.store import TerrainStore
from references import random_dem, reference, rule_predecessors

pytestmark = pytest.mark.gpu

SHAPE = (203, 150)  # tile 16, shard 2: the last shard row and column cut inside a chunk
NODATA = -9999


def dem(kind: str):
    """(values as stored, nodata, the values as the reference reads them: float64, NaN off the graph)."""
    v = random_dem(SHAPE, 3, holes=0.05)
    if kind == "float32":
        return v, None, v.astype(np.float64)
    ints = np.where(np.isnan(v), NODATA, np.round(v * 20)).astype(np.int16)
    return ints, NODATA, np.where(ints == NODATA, np.nan, ints.astype(np.float64))


@pytest.mark.parametrize("kind", ["float32", "int16"])
@pytest.mark.parametrize("nvcomp", ["1", "0"])
def test_incore_gpu_read_and_write(tmp_path, monkeypatch, kind, nvcomp):
    monkeypatch.setenv("TERRAIN_NVCOMP", nvcomp)
    if nvcomp == "1" and nvzstd.decoder() is None:
        pytest.skip("nvCOMP is not installed here")
    stored, nodata, vals = dem(kind)
    attrs = {"transform": [100.0, 1.0, 0.0, 500.0, 0.0, -1.0], "cell_size": [1.0, 1.0]}
    st = TerrainStore.from_array(tmp_path / "dem.zarr", stored, tile=16, shard=2, nodata=nodata, attrs=attrs)
    ok = np.argwhere(~np.isnan(vals))
    src = [tuple(int(i) for i in ok[7]), tuple(int(i) for i in ok[len(ok) // 2])]
    runs = {d: sssp(st, src, cell=True, progress=False, device=d, method="incore", name=d) for d in ("cpu", "gpu")}
    assert ("read_decode" in runs["gpu"].timings) == (nvcomp == "1")  # the frames decoded on the GPU, or not
    ref = reference(vals, src)
    got = {d: {a: st.group[f"sssp/{d}/{a}"][:] for a in ("distance", "predecessor")} for d in runs}
    np.testing.assert_array_equal(got["gpu"]["distance"], ref.astype(np.float32))
    np.testing.assert_array_equal(got["gpu"]["predecessor"], rule_predecessors(vals, ref, src, "absdiff"))
    for a in ("distance", "predecessor"):
        assert got["gpu"][a].tobytes() == got["cpu"][a].tobytes()
