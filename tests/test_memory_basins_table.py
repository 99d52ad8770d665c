"""``terrain basins`` keeps ``--memory`` however many basins there are (issues 34 and 30): the basin
table holds each basin's terminal cell and cell count (16 bytes a basin), its other columns derived a
block of rows at a time where they are used, and is counted against the budget once the basins are
known. On a DEM routed with its pits kept (``--condition none`` on noise: a basin every ~9 cells) the
table built whole (8 columns of 8 bytes) alone exceeded the budget below; the run now stays within it,
and the CSV is the one built here from the flow directions' definition."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from references import utm_store
from terrain_io.errors import InputError
from terrain_io.grid.flow.pipeline import flow
from terrain_io.grid.hydro.pipeline import basins
from terrain_io.store import TerrainStore

from test_memory_budget import NEEDS_PROC, _grown

# the codes' definition (terrain_io/grid/flow/codes.py): 0..7 E, SE, S, SW, W, NW, N, NE (rows grow
# southward); 8 and up drain nowhere in the DEM; 255 nodata
STEP_R = np.array([0, 1, 1, 1, 0, -1, -1, -1, 0])
STEP_C = np.array([1, 1, 0, -1, -1, -1, 0, 1, 0])
X0, Y0, CELL = 500000.0, 4100000.0, 30.0  # utm_store's grid


def _routed(path, rows: int, cols: int, seed: int) -> TerrainStore:
    """Noise routed with its pits kept, a few nodata holes (cells draining into them end there)."""
    rng = np.random.default_rng(seed)
    z = rng.random((rows, cols), np.float32)
    z[rows // 3: rows // 3 + 5, cols // 4: cols // 4 + 40] = np.nan
    st = utm_store(path, z, tile=128, shard=2)
    flow(st, condition="none", device="cpu", progress=False)
    return st


def reference_basins(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, terminal cells, counts): every valid cell's pointer to its downstream cell (itself where
    the flow leaves the DEM, meets nodata or stops), jumped to the roots; the roots numbered 1.. in
    row-major order; the counts by np.bincount of the labels."""
    h, w = d.shape
    flat = d.reshape(-1).astype(np.int64)
    cell = np.arange(flat.size)
    valid = flat != 255
    k = np.where(valid, np.minimum(flat, 8), 8)
    r, c = cell // w + STEP_R[k], cell % w + STEP_C[k]
    inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    to = np.where(inside, r * w + c, cell)
    to = np.where(valid[to], to, cell)
    while True:
        nxt = to[to]
        if np.array_equal(nxt, to):
            break
        to = nxt
    terminal = np.flatnonzero(valid & (to == cell))
    rank = np.zeros(flat.size, np.int64)
    rank[terminal] = np.arange(1, len(terminal) + 1)
    label = np.where(valid, rank[to], 0)
    return label.reshape(h, w), terminal, np.bincount(label, minlength=len(terminal) + 1)[1:]


def reference_csv(path, terminal: np.ndarray, counts: np.ndarray, cols: int) -> None:
    """The table (README: id, outlet cell and its centre, cells, area) by Python's csv module."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "outlet_row", "outlet_col", "outlet_x", "outlet_y", "cells", "area_m2"])
        for i, (t, n) in enumerate(zip(terminal.tolist(), counts.tolist()), 1):
            r, c = divmod(t, cols)
            out.writerow([i, r, c, X0 + (c + 0.5) * CELL, Y0 - (r + 0.5) * CELL, n, n * CELL * CELL])


def _written(st) -> bool:
    """Whether the store holds a basins result (or a leftover of one in its folder)."""
    return any(k.split("/")[0] == "basins" for k in TerrainStore.open(st.path).results()) or any(
        "basins" in p.name for p in st.path.iterdir())


@NEEDS_PROC
def test_basin_table_within_budget(tmp_path):
    """1536^2 of noise: 261 k basins, whose table built whole took 64 bytes a basin (16.0 MiB, beyond
    the budget of 16 MB on its own); basins out of core and its CSV written, peak RSS growth within the
    budget, the labels and the CSV those of the reference."""
    budget = 16 << 20
    big, warm = _routed(tmp_path / "big.zarr", 1536, 1536, 1), _routed(tmp_path / "warm.zarr", 300, 300, 2)
    label, terminal, counts = reference_basins(np.asarray(big.group["flow/direction"][...]))
    assert len(terminal) * 64 > budget
    res = _grown("basins", "cpu", big, warm, budget, [{"window_tiles": 1, "table": str(tmp_path / "w.csv")}],
                 table=str(tmp_path / "t.csv"))
    assert "error" not in res and "tiled" in res["line"] and f"{len(terminal):,} basins" in res["line"], res
    assert res["grown"] <= budget, f"peak RSS grew by {res['grown'] / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB"
    assert np.array_equal(np.asarray(TerrainStore.open(big.path).group["basins/label"][...]), label)
    reference_csv(tmp_path / "ref.csv", terminal, counts, big.shape[1])
    assert (tmp_path / "t.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()


def test_a_table_beyond_the_budget_is_refused(tmp_path):
    """Windows that fit the budget but not beside the table: one line naming the least budget, the
    basins not written."""
    st = _routed(tmp_path / "a.zarr", 512, 512, 3)
    n = len(reference_basins(np.asarray(st.group["flow/direction"][...]))[1])
    from terrain_io.grid.hydro import tiled
    from terrain_io.grid.hydro.pipeline import OUT_BYTES

    need = tiled.window_need(st, 1, OUT_BYTES["basins"])
    with pytest.raises(InputError, match=rf"too small for this store's basins: their table \({n:,} basins") as exc:
        basins(st, memory=need + n * 16 - 1, window_tiles=1, progress=False)
    assert "\n" not in str(exc.value) and not _written(st)
    basins(st, memory=need + n * 16, window_tiles=1, progress=False)
    assert _written(st) and "basins/label" in TerrainStore.open(st.path).results()


@pytest.mark.gpu
def test_gpu_counts_the_table_before_the_host_holds_it(tmp_path):
    """On the GPU the basins are counted before their table comes back to the host: a budget that
    holds the route's host buffers but not the table beside them is refused in one line, nothing
    written; with the table's bytes it runs in core on the GPU, the labels and CSV the reference's."""
    pytest.importorskip("cupy")
    from terrain_io.grid.hydro.pipeline import _gpu_host_bytes, write_table

    st = _routed(tmp_path / "g.zarr", 512, 512, 4)
    label, terminal, counts = reference_basins(np.asarray(st.group["flow/direction"][...]))
    least = _gpu_host_bytes(st, "basins") + len(terminal) * 16
    with pytest.raises(InputError, match=rf"too small for this store's basins: their table \({len(terminal):,} basins"):
        basins(st, memory=least - 1, device="gpu", progress=False)
    assert not _written(st)
    res = basins(st, memory=least, device="gpu", progress=False)
    assert "(gpu, incore)" in res.line, res.line
    assert np.array_equal(np.asarray(TerrainStore.open(st.path).group["basins/label"][...]), label)
    write_table(res, tmp_path / "t.csv")
    reference_csv(tmp_path / "ref.csv", terminal, counts, st.shape[1])
    assert (tmp_path / "t.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()
