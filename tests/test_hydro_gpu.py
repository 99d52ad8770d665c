"""Hydrology on the GPU (terrain_io/grid/hydro/_gpu.py, kernels/hydro.cu): CuPy input gives the
same bytes as the numba kernels (themselves proven against the references in test_hydro and
test_hydro_tiled), including a chain of thousands of cells (many pointer-jumping rounds), and the
commands with --device gpu write the same bytes as with --device cpu."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from references import hydro_dem, reference_labels, utm_store
from terrain_io.grid.flow import flow_accumulation, flow_direction
from terrain_io.grid.flow.codes import NODATA

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")]


def _serpentine(n=64):
    """One flow path through every cell of an n x n grid (n * n - 1 jumps deep), ending at (n-1, 0)."""
    d = np.zeros((n, n), np.uint8)
    for r in range(n):
        right = r % 2 == 0
        d[r, :] = 0 if right else 4
        d[r, -1 if right else 0] = 2  # down at the row's end
    d[n - 1, 0 if (n - 1) % 2 else -1] = 8
    return d


def _cases():
    z = hydro_dem(5, shape=(91, 77))
    d = flow_direction(z, condition="fill")
    zf = np.where(np.isnan(z), 0, z)
    yield d, flow_accumulation(d), zf
    s = _serpentine()
    yield s, flow_accumulation(s), np.arange(s.size, dtype=np.float64)[::-1].reshape(s.shape)


def _same(a, b):
    import cupy

    assert isinstance(a, cupy.ndarray)
    a = a.get()
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.filterwarnings("error::terrain_io.errors.TerrainNote")  # computed on the GPU, not on the host
def test_cupy_input_gives_the_cpu_bytes():
    import cupy

    from terrain_io.grid.hydro import basins, hand, stream_links, stream_order, watershed

    for d, acc, z in _cases():
        dd, ad, zd = cupy.asarray(d), cupy.asarray(acc), cupy.asarray(z)
        valid = np.argwhere(d != NODATA)
        outlets = [tuple(int(v) for v in valid[i]) for i in np.linspace(0, len(valid) - 1, 6).astype(int)]
        _same(watershed(dd, outlets), watershed(d, outlets))
        np.testing.assert_array_equal(watershed(dd, outlets).get(), reference_labels(d, outlets))
        (lg, tg), (lc, tc) = basins(dd), basins(d)
        _same(lg, lc)
        for x, y in zip(tg, tc):
            np.testing.assert_array_equal(x, y)
        for threshold in (1, 5, 40, 10**9):  # the last: no stream at all
            for method in ("strahler", "shreve"):
                _same(stream_order(dd, ad, threshold, method=method), stream_order(d, acc, threshold, method=method))
            (lg, tg), (lc, tc) = stream_links(dd, ad, threshold), stream_links(d, acc, threshold)
            _same(lg, lc)
            for x, y in zip(tg, tc):
                np.testing.assert_array_equal(x, y)
            (hg, dg), (hc, dc) = hand(dd, zd, ad, threshold, drainage=True), hand(d, z, acc, threshold, drainage=True)
            _same(hg, hc)
            _same(dg, dc)


def test_commands_on_the_gpu_write_the_cpu_bytes(tmp_path):
    from cli.main import _register, cli
    from terrain_io.store import TerrainStore

    _register()
    path = tmp_path / "a.zarr"
    utm_store(path, hydro_dem(7, shape=(120, 150)).astype(np.float32), tile=16, shard=2)
    assert CliRunner().invoke(cli, ["flow", str(path), "--device", "cpu"]).exit_code == 0
    got = {}
    for device in ("cpu", "gpu"):
        for args in (["basins"], ["watershed", "--cell", "60,75", "--cell", "100,120"], ["streams", "--threshold", "8"],
                     ["hand", "--threshold", "8"]):
            res = CliRunner().invoke(cli, [args[0], str(path), *args[1:], "--device", device])
            assert res.exit_code == 0 and f"({device}, incore)" in res.output, res.output
        st = TerrainStore.open(path)
        got[device] = {n: np.asarray(st.group[n][...]).tobytes() for n in
                       ("basins/label", "watershed/default/label", "streams/order", "streams/magnitude", "streams/link",
                        "hand/height", "hand/drainage")}
    assert got["cpu"] == got["gpu"]
