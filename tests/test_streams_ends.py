"""The links of ``terrain streams -o`` made faster (issue 30): :meth:`CellReader.values` with threads
gathers a shard's cells in one read of the chunks that hold them (the box around them, or each chunk
alone where they are sparse), checked against the DEM itself, chunks never written (all nodata)
included; the lines' vertices (:func:`._cpu.link_points`) at their cells' centres by the store's
geotransform, ``length_m`` the sum of their steps, ``drop`` the DEM's first minus last vertex."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, make_store, utm_store
from terrain_io import store as S
from terrain_io.grid.hydro import pipeline as P

_register()


def test_cells_gathered_a_shard_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    rows, cols = 150, 170  # tiles of 16, shards of 64: edge shards and chunks cut by the DEM's edge
    dem = rng.normal(100, 20, (rows, cols)).astype(np.float32)
    dem[64:128, 64:128] = np.nan  # one shard all nodata: its chunks never written
    st = make_store(tmp_path, dem, tile=16, shard=4)
    assert not (tmp_path / "dem.zarr" / "elevation" / "c" / "1" / "1").exists()
    dense = rng.integers(0, [64, 42], (600, 2)) + [0, 128]  # shard (0, 2): every chunk
    sparse = np.array([[130, 5], [149, 60], [70, 70], [127, 127]])  # two far corners of shard (2, 0); nodata
    scattered = rng.integers(0, [rows, cols], (50, 2))
    scattered = scattered[scattered[:, 0] < 128]  # (none in shard (2, 0))
    cells = np.concatenate([dense, sparse, scattered])
    gids = cells[:, 0] * cols + cells[:, 1]

    reads = []
    real = S.read_shard
    monkeypatch.setattr(P, "read_shard", lambda arr, sr, sc, part=None, **k: (reads.append((sr, sc, part)),
                                                                               real(arr, sr, sc, part, **k))[1])
    got = P.CellReader(st, st.tile_size, threads=3).values(S.ELEVATION, gids)
    np.testing.assert_array_equal(got, dem.reshape(-1)[gids])
    assert got.dtype == np.float32
    by_shard = {}
    for sr, sc, part in reads:
        by_shard.setdefault((sr, sc), []).append(part)
    assert by_shard[0, 2] == [None]  # a shard whose chunks all hold a cell: one read of the whole
    # shard (2, 0) holds cells of chunks (8, 0) and (9, 3) only: each alone, not the box of eight
    assert sorted(by_shard[2, 0], key=lambda w: w.r0) == [S.Window(128, 144, 0, 16), S.Window(144, 150, 48, 64)]
    needed = {(int(r) // 16, int(c) // 16) for r, c in cells}

    def chunks(sr, sc, w):  # chunks a read decodes (None: the whole shard)
        w = w or S.Window(64 * sr, min(64 * sr + 64, rows), 64 * sc, min(64 * sc + 64, cols))
        return -(-(w.r1 - w.r0) // 16) * -(-(w.c1 - w.c0) // 16)

    decoded = sum(chunks(sr, sc, w) for (sr, sc), parts in by_shard.items() for w in parts)
    assert len(needed) <= decoded <= 2 * len(needed)


def test_link_lines_at_cell_centres_with_their_lengths_and_drops(tmp_path):
    pyogrio = pytest.importorskip("pyogrio")
    path = tmp_path / "a.zarr"
    z = hydro_dem(7, shape=(45, 61)).astype(np.float32)
    utm_store(path, z, tile=8, shard=2)  # 30 m cells from (500000, 4100000); 12 shards: ends gathered in threads
    assert CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill", "--device", "cpu"]).exit_code == 0
    out = tmp_path / "links.gpkg"
    P.streams(path, 4, progress=False, vectors=out, device="cpu")
    filled = S.TerrainStore.open(path).read(S.Window(0, 45, 0, 61), "fill/elevation").astype(np.float64)
    meta, _, geometry, values = pyogrio.raw.read(out)
    f = dict(zip(meta["fields"], values))
    assert len(geometry) > 20
    for i, wkb in enumerate(geometry):
        n = int(np.frombuffer(wkb[5:9], "<u4")[0])
        xy = np.frombuffer(wkb[9:], "<f8").reshape(n, 2)
        col, row = (xy[:, 0] - 500000.0) // 30, (4100000.0 - xy[:, 1]) // 30
        np.testing.assert_array_equal(xy[:, 0], 500000.0 + (col + 0.5) * 30.0)  # centres, exactly
        np.testing.assert_array_equal(xy[:, 1], 4100000.0 - (row + 0.5) * 30.0)
        assert f["length_m"][i] == pytest.approx(np.hypot(*np.diff(xy, axis=0).T).sum(), rel=1e-12, abs=1e-9)
        first, last = (int(row[0]), int(col[0])), (int(row[-1]), int(col[-1]))
        assert f["drop"][i] == filled[first] - filled[last]
