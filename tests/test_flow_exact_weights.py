"""Issue 29: weighted flow accumulation is exact -- the float64 nearest the exact sum of the upstream
weights (a topological-order sum in exact rational arithmetic, written here), the same bytes for
every tile size, in core and out of core, through the array API and the store, CPU and GPU; weights
whose range is too wide for 128-bit fixed point are rounded with one note."""
from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from references import topological_sum, utm_store
from terrain_io.errors import TerrainNote
from terrain_io.grid.flow import flow_accumulation, flow_direction
from terrain_io.grid.flow.codes import NODATA
from terrain_io.grid.flow.pipeline import flow, read_flow

pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")


def exact_sums(code, weights, include_self=True) -> np.ndarray:
    """Each cell's exact rational total (its weight and its donors' totals, in Kahn's topological
    order: references.topological_sum over Fractions), as the float64 nearest it (Fraction -> float)."""
    exact = np.array([Fraction(float(w)) for w in weights.ravel()], object).reshape(weights.shape)
    total = topological_sum(code, exact)
    if not include_self:
        total = total - np.where(code != NODATA, exact, 0)
    return np.array([float(t) for t in total.ravel()], np.float64).reshape(code.shape)


def dem(shape=(72, 90), seed=3):
    """Rough terrain with a flat-bottomed lake wider than a tile and nodata holes."""
    rng = np.random.default_rng(seed)
    z = np.cumsum(rng.normal(size=shape), axis=0) + np.cumsum(rng.normal(size=shape), axis=1)
    z[20:40, 25:60] = z[20:40, 25:60].min()
    z[50:54, 10:14] = np.nan
    return z.astype(np.float32)


def weights_of(kind: str, shape, seed=5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "dyadic":  # k / 64: float64 sums of these are exact in any order (the reference is exact too)
        return rng.integers(0, 4096, shape) / 64.0
    if kind == "random":  # 53-bit mantissas over 20 octaves: float sums in different orders differ
        return rng.random(shape) * 2.0 ** rng.integers(-10, 10, shape)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["dyadic", "random"])
@pytest.mark.parametrize("include_self", [True, False])
def test_array_api_gives_the_exact_sum_correctly_rounded(kind, include_self):
    z = dem()
    code = flow_direction(z, condition="fill")
    w = weights_of(kind, z.shape)
    got = flow_accumulation(code, w, include_self=include_self)
    want = exact_sums(code, w, include_self)
    assert got.dtype == np.float64 and got.tobytes() == want.tobytes()


def test_the_same_bytes_for_every_tiling_in_and_out_of_core(tmp_path):
    z = dem()
    w = weights_of("random", z.shape)
    st = utm_store(tmp_path / "a.zarr", z, tile=8, shard=4)
    got = {}
    for window_tiles in (None, 1, 2, 4):  # in core; windows of 8^2, 16^2 and whole 32^2 shards
        res = flow(st, weights=w, window_tiles=window_tiles, progress=False)
        assert res.method == ("incore" if window_tiles is None else "tiled")
        got[window_tiles] = read_flow(st)
    code = got[None]["direction"]
    want = exact_sums(code, w)
    for window_tiles, out in got.items():
        assert out["accumulation"].tobytes() == want.tobytes(), window_tiles
    assert flow_accumulation(code, w).tobytes() == want.tobytes()


def test_weights_too_wide_for_exact_sums_are_rounded_with_one_note(tmp_path):
    z = dem()
    rng = np.random.default_rng(9)
    w = np.where(rng.random(z.shape) < 0.5, 1e300, 1e-300) * rng.random(z.shape)
    code = flow_direction(z, condition="fill")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = flow_accumulation(code, w)
    notes = [str(c.message) for c in caught if issubclass(c.category, TerrainNote)]
    assert len(notes) == 1 and "rounded" in notes[0], notes
    np.testing.assert_allclose(got, exact_sums(code, w), rtol=1e-15, atol=1e-250)
    st = utm_store(tmp_path / "a.zarr", z, tile=8, shard=4)
    with pytest.warns(TerrainNote, match="rounded"):
        flow(st, weights=w, window_tiles=1, progress=False)
    assert read_flow(st)["accumulation"].tobytes() == got.tobytes()  # rounded, still the same bytes


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dyadic", "random"])
def test_gpu_gives_the_cpu_bytes(kind, tmp_path):
    import cupy as cp

    z = dem((300, 260))
    code = flow_direction(z, condition="fill")
    w = weights_of(kind, z.shape)
    for include_self in (True, False):
        want = exact_sums(code, w, include_self)
        got = flow_accumulation(cp.asarray(code), cp.asarray(w), include_self=include_self)
        assert got.get().tobytes() == want.tobytes()
    st = utm_store(tmp_path / "a.zarr", z, tile=16, shard=2)
    flow(st, weights=w, device="gpu", progress=False)
    assert read_flow(st)["accumulation"].tobytes() == exact_sums(read_flow(st)["direction"], w).tobytes()
