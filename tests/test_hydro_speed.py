"""Issue 30's fast routes: the GPU route -- arrays read straight into the GPU, counted there, written
from it shard by shard -- within a ``--memory`` far below the DEM's in-core need, writing the CPU's
bytes and vectors. The GPU tests need no rasterio (the device's vector wheels lack it)."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import ndimage


def _dem(shape=(150, 170), seed=5) -> np.ndarray:
    """Smoothed noise on a gentle slope, with a hole of nodata (many basins, pits, flats)."""
    rng = np.random.default_rng(seed)
    z = ndimage.gaussian_filter(rng.normal(size=shape), 4) * 50 + np.add.outer(np.arange(shape[0]),
                                                                                np.arange(shape[1])) * 0.05
    z[40:45, 60:70] = np.nan
    return z.astype(np.float32)


def _serpentine(n=64) -> np.ndarray:
    """One flow path through every cell of an n x n grid (n * n - 1 pointer jumps deep)."""
    d = np.zeros((n, n), np.uint8)
    for r in range(n):
        right = r % 2 == 0
        d[r, :] = 0 if right else 4
        d[r, -1 if right else 0] = 2
    d[n - 1, 0 if (n - 1) % 2 else -1] = 8
    return d


@pytest.mark.gpu
def test_cupy_rasters_give_the_numpy_bytes():
    import cupy

    from terrain_io.grid.flow import flow_accumulation, flow_direction
    from terrain_io.grid.flow.codes import NODATA
    from terrain_io.grid.hydro import basins, hand, stream_links, stream_order, watershed

    z = _dem((91, 77), 7)
    s = _serpentine()
    for d, zf in ((flow_direction(z, condition="fill"), np.nan_to_num(z)),
                  (s, np.arange(s.size, dtype=np.float64)[::-1].reshape(s.shape))):
        acc = flow_accumulation(d)
        dd, ad, zd = cupy.asarray(d), cupy.asarray(acc), cupy.asarray(zf)
        valid = np.argwhere(d != NODATA)
        outlets = [tuple(int(v) for v in valid[i]) for i in np.linspace(0, len(valid) - 1, 6).astype(int)]
        pairs = [(watershed(dd, outlets), watershed(d, outlets)), (basins(dd)[0], basins(d)[0])]
        for threshold in (1, 5, 40, 10**9):
            pairs += [(stream_order(dd, ad, threshold), stream_order(d, acc, threshold)),
                      (stream_links(dd, ad, threshold)[0], stream_links(d, acc, threshold)[0])]
            pairs += list(zip(hand(dd, zd, ad, threshold, drainage=True), hand(d, zf, acc, threshold, drainage=True)))
        for g, c in pairs:
            assert isinstance(g, cupy.ndarray)
            assert g.dtype == c.dtype and g.get().tobytes() == c.tobytes()


@pytest.mark.gpu
def test_the_gpu_route_keeps_to_a_budget_below_the_dem_and_writes_the_cpu_bytes(tmp_path):
    try:  # the vectors compared where pyogrio is installed (the device's wheels carry it or rasterio)
        import pyogrio
    except ImportError:
        pyogrio = None
    from cli.main import _register, cli
    from terrain_io.store import TerrainStore

    _register()
    path = tmp_path / "a.zarr"
    TerrainStore.from_array(path, _dem(), tile=8, shard=4,
                            attrs={"transform": [0.0, 30.0, 0.0, 0.0, 0.0, -30.0], "cell_size": [30.0, 30.0]})
    assert CliRunner().invoke(cli, ["flow", str(path), "--device", "gpu"]).exit_code == 0
    got = {}
    # 1MB: below the CPU's in-core need (66 bytes a cell for HAND: 1.7 MB), above the GPU route's host shards
    for device, memory in (("cpu", []), ("gpu", ["--memory", "1MB"])):
        out, table = tmp_path / f"{device}.gpkg", tmp_path / f"{device}.csv"
        vectors = ["-o", str(out)] if pyogrio else []
        for args in (["basins"], ["watershed", "--cell", "75,85", "--cell", "120,150"],
                     ["streams", "--threshold", "8", *vectors, "--table", str(table)], ["hand", "--threshold", "8"]):
            res = CliRunner().invoke(cli, [args[0], str(path), *args[1:], "--device", device, *memory])
            assert res.exit_code == 0 and f"({device}, incore)" in res.output, res.output
        st = TerrainStore.open(path)
        got[device] = {n: np.asarray(st.group[n][...]).tobytes() for n in
                       ("basins/label", "watershed/default/label", "streams/order", "streams/magnitude", "streams/link",
                        "hand/height", "hand/drainage")}
        got[device]["table"] = table.read_text()
        if pyogrio:
            meta, _, geometry, values = pyogrio.raw.read(out)
            got[device]["vectors"] = (list(geometry), [list(v) for v in values])
    assert got["cpu"] == got["gpu"]
