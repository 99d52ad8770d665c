"""The order of a pyramid's work (issue 32, fifth round): the levels' nodes -- their groups, zarr.json and
coordinates, sealed -- are written before the first block of the base is read (written beside the reads they
cost the 2 cores more than their own time), and a read that fails leaves no pyramid and no staged folder."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import terrain_io.overviews as ov
from references import overview_mean, utm_store
from terrain_io.errors import DamagedStoreError
from terrain_io.integrity import verify


def _store(path):
    rng = np.random.default_rng(11)
    z = (rng.random((100, 70)) * 300 + 100).astype(np.float32)
    z[rng.random(z.shape) < 0.05] = np.nan
    return utm_store(path, z, tile=8, shard=4), z


def _staged_nodes(store_path: Path) -> set[str]:
    """The zarr.json files under the store's hidden (staged) folders, relative to the staged pyramid."""
    found = set()
    for dirpath, _, filenames in os.walk(store_path):
        parts = Path(dirpath).relative_to(store_path).parts
        hidden = [i for i, p in enumerate(parts) if p.startswith(".")]
        if hidden and "zarr.json" in filenames:
            found.add("/".join(parts[hidden[0] + 1 :]))
    return found


def test_level_nodes_are_written_before_the_first_read(tmp_path, monkeypatch):
    st, z = _store(tmp_path / "s.zarr")
    levels = ov.level_shapes(z.shape, 8)
    seen = []
    inner = ov.read_halved

    def first_read(*args, **kwargs):
        if not seen:
            seen.append(_staged_nodes(st.path))
        return inner(*args, **kwargs)

    monkeypatch.setattr(ov, "read_halved", first_read)
    assert ov.write_overviews(st.path, ["elevation"]) == {"elevation": len(levels)}
    want = {f"{k}/{name}" for k in range(1, len(levels) + 1) for name in ("elevation", "x", "y", "spatial_ref")}
    want |= {str(k) for k in range(1, len(levels) + 1)}
    assert want <= seen[0], sorted(want - seen[0])
    # and the pyramid is the one numpy makes
    level = z
    for k in range(1, len(levels) + 1):
        level = overview_mean(level)
        got = st.open(st.path, mode="r").group[f"overviews/elevation/{k}/elevation"][...]
        np.testing.assert_array_equal(got, level)
    assert verify(st.path).sound


def test_a_failed_read_leaves_no_pyramid(tmp_path):
    st, _ = _store(tmp_path / "s.zarr")
    before = sorted(p.name for p in st.path.iterdir())
    shard = st.path / "elevation" / "c" / "1" / "1"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1  # inside a chunk: fails its checksum when read
    shard.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError):
        ov.write_overviews(st.path, ["elevation"])
    assert sorted(p.name for p in st.path.iterdir()) == before
    assert not (st.path / ov.GROUP).exists()
