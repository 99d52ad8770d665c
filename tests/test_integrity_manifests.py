"""The manifests ``integrity.seal`` writes (one per array: its chunk files, the tree it was sealed in,
the digests of the tree's nodes) are compact JSON in the key order chunks, tree, nodes, checked here
against the files on disk listed with os.walk, and ``terrain verify`` finds the store sound."""
from __future__ import annotations

import json
import os

import numpy as np
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.store import TerrainStore, fill_value_for

_register()

MANIFEST = "terrain-manifest.json"


def _chunk_files(array_dir: str) -> dict[str, int]:
    """Every file of the array's chunk folder ``c``, by its path below the array, and its size."""
    found = {}
    for dirpath, _, names in os.walk(os.path.join(array_dir, "c")):
        for name in names:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, array_dir).replace(os.sep, "/")] = os.path.getsize(path)
    return found


def test_manifests_are_compact_json_of_the_files_on_disk_and_verify_passes(tmp_path):
    values = np.random.default_rng(5).normal(size=(70, 90)).astype(np.float32)
    values[:32, :32] = np.nan  # a shard of fill value: no file
    path = tmp_path / "s.zarr"
    store = TerrainStore.from_array(path, values, tile=16, shard=2)
    with store.write_result("deep/r") as writer:  # an array two levels below the store's root
        arr = writer.create_array("a", "uint32", fill_value_for(np.dtype("uint32"), None))
        arr[...] = np.arange(70 * 90, dtype=np.uint32).reshape(70, 90)
    manifests = sorted(os.path.join(d, MANIFEST) for d, _, names in os.walk(path) if MANIFEST in names)
    arrays = {os.path.relpath(os.path.dirname(m), path).replace(os.sep, "/") for m in manifests}
    assert {"elevation", "deep/r/a"} <= arrays
    for manifest in manifests:
        with open(manifest, "rb") as f:
            text = f.read()
        got = json.loads(text)
        assert list(got) == ["chunks", "tree", "nodes"]
        assert text == json.dumps(got, separators=(",", ":")).encode()  # compact, keys in that order
        array_dir = os.path.dirname(manifest)
        assert got["chunks"] == _chunk_files(array_dir) and list(got["chunks"]) == sorted(got["chunks"])
        root = os.path.normpath(os.path.join(array_dir, got["tree"]))
        assert root in (str(path), str(path / "deep" / "r"))
        assert all(os.path.isfile(os.path.join(root, node, "zarr.json")) for node in got["nodes"])
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 0, result.output
