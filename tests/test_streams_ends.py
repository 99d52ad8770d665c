"""The links' end elevations of ``terrain streams -o`` (issue 30's speed): :meth:`CellReader.values`
with threads gathers a shard's cells in one read of the chunks that hold them (the box around them,
or each chunk alone where they are sparse), checked against the DEM itself, chunks never written
(all nodata) included."""
from __future__ import annotations

import numpy as np

from references import make_store
from terrain_io import store as S
from terrain_io.grid.hydro import pipeline as P


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
