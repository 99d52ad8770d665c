"""The walk model (Tobler's hiking time, a directed graph) on every SSSP method against scipy's
Dijkstra on the directed graph built here from the hiking function's definition."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.grid.sssp import sssp
from terrain_io.grid.sssp.array import cost_distance
from references import check_predecessors, make_store, random_dem, reference

METHODS = {"incore": {}, "shards": {"unit": 16}, "index": {"cluster": 4}}


def hills(shape, seed):
    """Hills with slopes up to ~60 % and rough ground, so that uphill and downhill times differ."""
    r, c = np.mgrid[: shape[0], : shape[1]]
    v = 40 * np.sin(r / 5.0) * np.cos(c / 7.0) + random_dem(shape, seed, holes=0.05) / 10
    return v.astype(np.float32)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_walk_equals_scipy_on_the_directed_graph(tmp_path, method):
    v = hills((37, 45), 5)
    st = make_store(tmp_path, v, tile=8, shard=2, dx=10.0, dy=12.0)
    ok = np.argwhere(~np.isnan(v))
    src = [tuple(ok[3]), tuple(ok[-40])]
    sssp(st, src, weight="walk", cell=True, progress=False, method=method, name="w", **METHODS[method])
    d = st.group["sssp/w/distance"][:]
    p = st.group["sssp/w/predecessor"][:]
    ref = reference(v.astype(np.float64), src, "walk", 10.0, 12.0)
    # NumPy's exp and the kernels' portable exp may differ in the last place (then a float32 may
    # round the other way); the index method keeps its boundary distances in float32
    np.testing.assert_allclose(d, ref.astype(np.float32), rtol=2.5e-7 if method != "index" else 1e-6)
    assert np.array_equal(np.isnan(d), np.isnan(v))
    check_predecessors(d, p, v.astype(np.float64), src, "walk", 10.0, 12.0)


def test_walk_there_and_back_differ(tmp_path):
    """Downhill is faster: the time up the slope exceeds the time down it (zigzags soften the
    climb), and each equals scipy's result on the directed graph."""
    rows, cols = 31, 40
    v = np.tile((np.arange(cols) * 6.0).astype(np.float32), (rows, 1))  # a 60 % slope rising eastward
    v += (random_dem((rows, cols), 9) * 0.3).astype(np.float32)
    st = make_store(tmp_path, v, tile=8, shard=2, dx=10.0, dy=10.0)
    a, b = (15, 2), (15, 37)
    sssp(st, [a], weight="walk", cell=True, progress=False, name="from_a")
    sssp(st, [b], weight="walk", cell=True, progress=False, name="from_b")
    up = float(st.group["sssp/from_a/distance"][b])
    down = float(st.group["sssp/from_b/distance"][a])
    assert up > 1.3 * down
    vals = v.astype(np.float64)
    assert up == pytest.approx(reference(vals, [a], "walk", 10.0, 10.0)[b], rel=1e-7)
    assert down == pytest.approx(reference(vals, [b], "walk", 10.0, 10.0)[a], rel=1e-7)


def test_walk_in_the_array_api_equals_the_store():
    v = hills((30, 26), 7)
    d, p = cost_distance(v, [(4, 5)], weight="walk", cell_size=(10.0, 10.0))
    ref = reference(v.astype(np.float64), [(4, 5)], "walk", 10.0, 10.0)
    np.testing.assert_allclose(d, ref.astype(np.float32), rtol=2.5e-7)
    check_predecessors(d, p, v.astype(np.float64), [(4, 5)], "walk", 10.0, 10.0)


@pytest.mark.gpu
@pytest.mark.parametrize("method", sorted(METHODS))
def test_walk_gpu_equals_cpu(tmp_path, method):
    """The kernels' portable exp: the GPU gives the CPU's bytes (index: its own rule, same distances)."""
    v = hills((70, 90), 3)
    st = make_store(tmp_path, v, tile=16, shard=2, dx=10.0, dy=10.0)
    src = [(5, 5), (60, 80)]
    for device in ("cpu", "gpu"):
        sssp(st, src, weight="walk", cell=True, progress=False, method=method, name=device, device=device,
             **METHODS[method])
    d = [st.group[f"sssp/{x}/distance"][:] for x in ("cpu", "gpu")]
    np.testing.assert_array_equal(d[0].view(np.uint32), d[1].view(np.uint32))
    if method != "index":
        np.testing.assert_array_equal(st.group["sssp/cpu/predecessor"][:], st.group["sssp/gpu/predecessor"][:])


def friction_of(v, seed):
    """A friction raster: 1 on open ground, 3-6 in 'forest' patches, NaN (a barrier) here and there."""
    rng = np.random.default_rng(seed)
    f = np.where(rng.random(v.shape) < 0.3, rng.uniform(3.0, 6.0, v.shape), 1.0)
    f[rng.random(v.shape) < 0.03] = np.nan
    return f.astype(np.float32)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_walk_with_friction_equals_scipy(tmp_path, method):
    """--weight walk --cost F: the time times the mean friction (f_i + f_j) / 2 of the two cells."""
    v = hills((36, 41), 8)
    f = friction_of(v, 8)
    st = make_store(tmp_path, v, tile=8, shard=2, dx=10.0, dy=10.0)
    with st.write_result("friction") as w:
        w.create_array("f", "float32", float("nan"))[...] = f
    ok = np.argwhere(~np.isnan(v) & ~np.isnan(f))
    src = [tuple(ok[5]), tuple(ok[-7])]
    r = sssp(st, src, weight="walk", cost="friction/f", cell=True, progress=False, method=method, name="wf",
             **METHODS[method])
    assert r.weight == "walk_friction"
    d = st.group["sssp/wf/distance"][:]
    both = np.where(np.isnan(f), np.nan, v.astype(np.float64) + 1j * f.astype(np.float64))
    ref = reference(both, src, "walk_friction", 10.0, 10.0)
    np.testing.assert_allclose(d, ref.astype(np.float32), rtol=2.5e-7 if method != "index" else 1e-6)
    check_predecessors(d, st.group["sssp/wf/predecessor"][:], both, src, "walk_friction", 10.0, 10.0)
    if method == "incore":  # the array API gives the same bytes
        da, pa = cost_distance(v, src, weight="walk", cost=f, cell_size=(10.0, 10.0))
        np.testing.assert_array_equal(da, d)
        np.testing.assert_array_equal(pa, st.group["sssp/wf/predecessor"][:])


@pytest.mark.gpu
@pytest.mark.parametrize("method", sorted(METHODS))
def test_walk_with_friction_gpu_equals_cpu(tmp_path, method):
    v = hills((60, 75), 4)
    st = make_store(tmp_path, v, tile=16, shard=2, dx=10.0, dy=10.0)
    with st.write_result("friction") as w:
        w.create_array("f", "float32", float("nan"))[...] = friction_of(v, 4)
    for device in ("cpu", "gpu"):
        sssp(st, [(5, 5), (50, 60)], weight="walk", cost="friction/f", cell=True, progress=False, method=method,
             name=device, device=device, **METHODS[method])
    d = [st.group[f"sssp/{x}/distance"][:] for x in ("cpu", "gpu")]
    np.testing.assert_array_equal(d[0].view(np.uint32), d[1].view(np.uint32))
    if method != "index":
        np.testing.assert_array_equal(st.group["sssp/cpu/predecessor"][:], st.group["sssp/gpu/predecessor"][:])


def test_a_dem_in_degrees_without_a_crs_gets_a_note(tmp_path):
    """Cells of 0.0008 map units and no CRS: the walk model would read them as metres (every slope
    near vertical); one note says so, and the run goes on."""
    from terrain_io.errors import TerrainNote

    st = make_store(tmp_path, hills((20, 20), 1), tile=8, shard=2, dx=0.0008, dy=0.0008)
    with pytest.warns(TerrainNote, match="no CRS"):
        sssp(st, [(3, 3)], weight="walk", cell=True, progress=False, name="deg")
