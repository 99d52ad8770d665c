"""The order of a pyramid's work (issue 32, fifth round): the levels' nodes -- their groups, zarr.json and
coordinates, sealed -- are written before the first block of the base is read (written beside the reads they
cost the 2 cores more than their own time) and sealed from their metadata as written (a plain seal's
manifests, byte for byte), and a read that fails leaves no pyramid and no staged folder."""
from __future__ import annotations

import math
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


def test_manifests_sealed_from_the_written_nodes_are_a_plain_seals(tmp_path):
    """A pyramid of 11 levels (its groups 1, 10, 11, 2, ... in the walk's order): the manifests sealed from
    the nodes as they were written, not read back, are byte for byte those a seal of the finished tree
    writes; and verify finds the store sound."""
    import shutil

    from terrain_io import integrity

    rng = np.random.default_rng(2)
    st = utm_store(tmp_path / "s.zarr", (rng.random((3, 8200)) * 50).astype(np.float32), tile=8, shard=4)
    assert ov.write_overviews(st.path, ["elevation"]) == {"elevation": 11}
    pyramid = st.path / ov.GROUP / "elevation"
    plain = tmp_path / "plain"
    shutil.copytree(pyramid, plain)
    for m in plain.rglob(integrity.MANIFEST):
        m.unlink()
    integrity.seal(plain)
    manifests = sorted(m.relative_to(plain) for m in plain.rglob(integrity.MANIFEST))
    assert len(manifests) == 44  # 11 levels x (the level, x, y, spatial_ref)
    for m in manifests:
        assert (pyramid / m).read_bytes() == (plain / m).read_bytes(), m
    assert verify(st.path).sound


@pytest.mark.parametrize("with_root", [True, False])
def test_seal_ahead_from_written_nodes_is_the_walks(tmp_path, with_root):
    """seal_ahead given the nodes as written: the digests, arrays and manifests of the walk that reads them
    back, with or without a root node."""
    from terrain_io import integrity
    from terrain_io.store import group_metadata, tiled_array_metadata, write_coordinate_files, write_node

    trees = []
    for name in ("walked", "known"):
        root = tmp_path / name
        root.mkdir()
        if with_root:
            write_node(root, group_metadata({"source": "elevation"}))
        written = {}
        for k in ("1", "10", "2"):
            written[k] = group_metadata()
            write_node(root / k, written[k])
            written[f"{k}/v"] = tiled_array_metadata((40, 30), np.dtype("float32"), 8, 2, math.nan, {"level": int(k)})
            write_node(root / k / "v", written[f"{k}/v"])
            for coord, meta in write_coordinate_files(root / k, (40, 30), None, None).items():
                written[f"{k}/{coord}"] = meta
        known = written if name == "known" else None
        trees.append(integrity.seal_ahead(root, lambda rel: not rel.endswith("/v"), known))
    walked, known = trees
    assert known.tree == walked.tree and known.done == walked.done and len(known.done) == 9
    for m in (tmp_path / "walked").rglob(integrity.MANIFEST):
        assert (tmp_path / "known" / m.relative_to(tmp_path / "walked")).read_bytes() == m.read_bytes(), m
