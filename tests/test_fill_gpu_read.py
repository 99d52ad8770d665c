"""The GPU fill's way in (issue 31): the DEM's zstd frames decoded on the GPU (``pinned.read_device``)
straight into the fill's block, band by band. On a GPU machine with nvCOMP (``pytest -m gpu``): every
output byte and table entry equal to the CPU fill's and F the Priority-Flood of the definition
(``references.gpu_equals_cpu``), for a float32 DEM with holes and an int16 DEM with a nodata value,
both cut inside a chunk at their edges -- whether the frames are decoded on the GPU or not."""
import numpy as np
import pytest

from references import fill_test_dem, gpu_equals_cpu
from terrain_io import nvzstd
from terrain_io.store import TerrainStore

pytestmark = pytest.mark.gpu

SHAPE = (203, 150)  # tile 16, shard 2: the last shard row and column cut inside a chunk
NODATA = -9999


@pytest.mark.parametrize("kind", ["float32", "int16"])
@pytest.mark.parametrize("nvcomp", ["1", "0"])
def test_gpu_fill_reads_through_the_gpu_decoder(tmp_path, monkeypatch, kind, nvcomp):
    monkeypatch.setenv("TERRAIN_NVCOMP", nvcomp)
    if nvcomp == "1" and nvzstd.decoder() is None:
        pytest.skip("nvCOMP is not installed here")
    h = fill_test_dem("nodata-holed", *SHAPE, seed=7)
    nodata = None
    if kind == "int16":
        h, nodata = np.where(np.isnan(h), NODATA, h).astype(np.int16), NODATA
    stores = [TerrainStore.from_array(tmp_path / f"{d}.zarr", h, tile=16, shard=2, nodata=nodata)
              for d in ("gpu", "cpu")]
    res = gpu_equals_cpu(*stores)
    assert ("read_decode" in res.timings) == (nvcomp == "1")  # the frames decoded on the GPU, or not
