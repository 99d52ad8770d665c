"""The in-core GPU pipelines' way in and out (issue 31): the DEM's zstd frames decoded on the GPU
(``pinned.read_device``) into the SSSP's ringed block and the fill's block, the results compressed
there (nvCOMP) on their way out. On a GPU machine with nvCOMP (``pytest -m gpu``), for a float32 DEM
with holes and an int16 DEM with a nodata value (converted on the GPU), both cut inside a chunk at
their edges, whether the frames are decoded on the GPU or not: the stored distances are scipy's
Dijkstra, the predecessors the tie rule from its definition, and both the CPU engine's bytes; every
fill output byte and table entry the CPU fill's, F the Priority-Flood of the definition."""
import numpy as np
import pytest

from terrain_io import nvzstd
from terrain_io.grid.sssp import sssp
from terrain_io.store import TerrainStore
from references import fill_test_dem, gpu_equals_cpu, random_dem, reference, rule_predecessors

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


@pytest.fixture(params=["1", "0"])
def nvcomp(request, monkeypatch):
    """"1": nvCOMP decodes and encodes on the GPU; "0": the host's way (``TERRAIN_NVCOMP=0``)."""
    monkeypatch.setenv("TERRAIN_NVCOMP", request.param)
    if request.param == "1" and nvzstd.decoder() is None:
        pytest.skip("nvCOMP is not installed here")
    return request.param


@pytest.mark.parametrize("kind", ["float32", "int16"])
def test_incore_gpu_read_and_write(tmp_path, nvcomp, kind):
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


@pytest.mark.parametrize("kind", ["float32", "int16"])
def test_gpu_fill_reads_through_the_gpu_decoder(tmp_path, nvcomp, kind):
    h = fill_test_dem("nodata-holed", *SHAPE, seed=7)
    nodata = None
    if kind == "int16":
        h, nodata = np.where(np.isnan(h), NODATA, h).astype(np.int16), NODATA
    stores = [TerrainStore.from_array(tmp_path / f"{d}.zarr", h, tile=16, shard=2, nodata=nodata)
              for d in ("gpu", "cpu")]
    res = gpu_equals_cpu(*stores)
    assert ("read_decode" in res.timings) == (nvcomp == "1")  # the frames decoded on the GPU, or not


def test_incore_gpu_write_two_bands_a_call(tmp_path, monkeypatch):
    """The SSSP's outputs given to nvCOMP two bands of shard rows a call (the last call one band), as
    32768^2 gives it: stored as the CPU engine's bytes."""
    if nvzstd.encoder() is None:
        pytest.skip("nvCOMP is not installed here")
    monkeypatch.setattr(nvzstd, "BATCH_CHUNKS", 40)  # (a band here: 20 chunks of an array)
    rows_a_call, start = [], nvzstd.BandEncoder.start

    def spied(self, bands, arrs, shards):
        rows_a_call.append(len({sr for sr, _ in shards}))
        return start(self, bands, arrs, shards)

    monkeypatch.setattr(nvzstd.BandEncoder, "start", spied)
    stored, _, vals = dem("float32")
    st = TerrainStore.from_array(tmp_path / "dem.zarr", stored, tile=16, shard=2)
    ok = np.argwhere(~np.isnan(vals))
    src = [tuple(int(i) for i in ok[len(ok) // 3])]
    for d in ("cpu", "gpu"):
        sssp(st, src, cell=True, progress=False, device=d, method="incore", name=d)
    assert rows_a_call == [2, 2, 2, 1]  # (7 shard rows)
    for a in ("distance", "predecessor"):
        assert st.group[f"sssp/gpu/{a}"][:].tobytes() == st.group[f"sssp/cpu/{a}"][:].tobytes()
    np.testing.assert_array_equal(st.group["sssp/gpu/distance"][:], reference(vals, src).astype(np.float32))
