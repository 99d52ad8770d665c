"""A result belongs to the elevation it was computed from, and a store's metadata is part of what
verify checks and every read trusts (issue 27, "Safe under signals and concurrent writers").

- Writers do not interleave: ``convert --overwrite`` replacing a store while ``sssp`` runs on it
  (real processes) never leaves the old grid's result in the new store; a result planted by hand
  from another store is refused by ``verify`` and by every read, with one line.
- The manifests cover the metadata: an array's zarr.json deleted or its shape edited, and a chunk
  file the manifest does not list, are found by ``verify`` and refused by sssp, mst, path and export.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from cli.main import _register, cli

pytestmark = pytest.mark.reliability
_register()


def run(*args):
    r = CliRunner().invoke(cli, ["-q", *map(str, args)])
    return r.exit_code, r.output


def one_error_line(code: int, output: str) -> str:
    lines = output.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("terrain: error: "), (code, output)
    return lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two stores of one DEM converted twice (two generations), the first with mst and sssp results."""
    from terrain_io.export import export
    from terrain_io.synth import synthesize

    root = tmp_path_factory.mktemp("identity")
    synth = synthesize(root / "synth.zarr", 128, seed=5, nodata_fraction=0.05, tile=32, shard=2)
    src = export(synth.path, "elevation", root / "dem.asc", decimals=2)
    small = synthesize(root / "small.zarr", 96, seed=6, tile=32, shard=2)
    other = export(small.path, "elevation", root / "other.asc", decimals=2)
    for name in ("a.zarr", "b.zarr"):
        assert run("convert", src, "-o", root / name, "--tile", "32", "--shard", "2")[0] == 0
    assert run("mst", root / "a.zarr", "--device", "cpu")[0] == 0
    assert run("sssp", root / "a.zarr", "--cell", "--source", "60,60", "--name", "k", "--device", "cpu")[0] == 0
    return dict(root=root, src=src, other=other)


def reads(store: Path, out: Path) -> dict:
    """Each reading command on ``store``: (exit code, output)."""
    return {
        "sssp": run("sssp", store, "--cell", "--source", "10,10", "--name", "new", "--device", "cpu"),
        "mst": run("mst", store, "--device", "cpu"),
        "path": run("path", store, "--cell", "--to", "50,50", "--name", "k"),
        "export": run("export", store, "mst/edges", "-o", out / f"edges-{store.name}.tif"),
    }


def verify_lines(store: Path) -> list[str]:
    r = CliRunner().invoke(cli, ["verify", str(store)])
    assert r.exit_code == 1, r.output
    return [line for line in r.output.splitlines() if not line.startswith(f"{store}: ") or "DAMAGED" not in line]


@pytest.mark.parametrize("damage", ["shape edited", "zarr.json deleted", "unlisted chunk file"])
def test_metadata_and_unlisted_chunks_are_found_by_verify_and_refused_by_reads(world, tmp_path, damage):
    store = tmp_path / "d.zarr"
    shutil.copytree(world["root"] / "a.zarr", store)
    meta = store / "elevation" / "zarr.json"
    if damage == "shape edited":  # the grid cut to 100 x 100: a valid zarr array, another DEM
        m = json.loads(meta.read_text())
        m["shape"] = [100, 100]
        meta.write_text(json.dumps(m, indent=2))
        want = "array elevation: its zarr.json is not the one it was written with"
    elif damage == "zarr.json deleted":
        meta.unlink()
        want = "array elevation: its zarr.json is missing"
    else:
        shutil.copy(store / "elevation" / "c" / "0" / "0", store / "elevation" / "c" / "0" / "3")
        want = "array elevation shard (0, 3): file c/0/3 is not in the array's manifest"
    assert [f"{store}: {want}" in line for line in verify_lines(store)].count(True) == 1
    for cmd, (code, output) in reads(store, tmp_path).items():
        line = one_error_line(code, output)
        assert str(store) in line, (cmd, line)
    assert not (store / "sssp" / "new").exists()


def test_a_result_of_another_elevation_planted_by_hand_is_refused(world, tmp_path):
    store = tmp_path / "b.zarr"
    shutil.copytree(world["root"] / "b.zarr", store)  # the same DEM, converted again: another generation
    for result in ("mst", "sssp"):
        shutil.copytree(world["root"] / "a.zarr" / result, store / result)
    lines = verify_lines(store)
    assert sum("result mst: was computed from another elevation" in line for line in lines) == 1
    assert sum("result sssp/k: was computed from another elevation" in line for line in lines) == 1
    for cmd, args in {"path": ["--cell", "--to", "50,50", "--name", "k"],
                      "export": ["mst/edges", "-o", tmp_path / "edges.tif"]}.items():
        line = one_error_line(*run(cmd, store, *args))
        assert "was computed from another elevation" in line, (cmd, line)
    assert not (tmp_path / "edges.tif").exists()
    # in the store it came from, the same result reads
    assert run("export", world["root"] / "a.zarr", "mst/edges", "-o", tmp_path / "ok.tif")[0] == 0


def _terrain(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "-q", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# ``terrain`` with the result's commit held open: the process touches HERE once its result is staged
# (it has read the old elevation) and waits for GO before the store's generation check and rename. A
# pause at a known point, not a race against the clock (SIGSTOP after polling for the staging folder
# lost that race under load: the run could commit before the signal arrived).
_PAUSED_AT_COMMIT = """
import sys, time
from pathlib import Path
from terrain_io.store import TerrainStore
here, go = Path(sys.argv[1]), Path(sys.argv[2])
commit = TerrainStore._unchanged
def paused(self, name):
    here.touch()
    while not go.exists():
        time.sleep(0.01)
    return commit(self, name)
TerrainStore._unchanged = paused
sys.argv = ["terrain", *sys.argv[3:]]
from cli.main import main
main()
"""


def test_convert_overwrite_while_sssp_runs_never_grafts_the_old_result(world, tmp_path):
    """Real processes: sssp runs on live.zarr (128^2) and is held at its commit (its result staged,
    the old elevation read), convert --overwrite replaces live.zarr with a 96^2 DEM, and sssp goes
    on. Its result must not land in the new store: sssp fails with one line; the new store verifies
    sound, holds no sssp result, and its elevation is the new DEM."""
    live = tmp_path / "live.zarr"
    shutil.copytree(world["root"] / "b.zarr", live)
    here, go = tmp_path / "at-commit", tmp_path / "go"
    sssp = subprocess.Popen([sys.executable, "-c", _PAUSED_AT_COMMIT, here, go, "-q", "sssp", live, "--cell",
                             "--source", "60,60", "--name", "k", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not here.exists():
        assert sssp.poll() is None and time.monotonic() < deadline, sssp.communicate()
        time.sleep(0.01)
    assert list(live.glob(".sssp%2Fk.partial-*"))  # results are staged inside their store
    try:
        convert = _terrain("convert", world["other"], "-o", live, "--tile", "32", "--shard", "2", "--overwrite")
        _, err_c = convert.communicate(timeout=120)
        assert convert.returncode == 0, err_c
    finally:
        go.touch()
    _, err = sssp.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert sssp.returncode == 1 and len(lines) == 1 and lines[0].startswith("terrain: error: "), err
    assert "replaced" in lines[0]
    assert CliRunner().invoke(cli, ["verify", str(live)]).exit_code == 0
    assert not (live / "sssp" / "k").exists()
    assert zarr.open_array(str(live / "elevation"), mode="r").shape == (96, 96)
    assert not [p for p in [*tmp_path.iterdir(), *live.iterdir()] if ".partial-" in p.name]


def test_a_result_records_the_generation_of_its_elevation(world):
    a = zarr.open_group(str(world["root"] / "a.zarr"), mode="r")
    b = zarr.open_group(str(world["root"] / "b.zarr"), mode="r")
    assert a.attrs["generation"] != b.attrs["generation"]
    assert a["mst"].attrs["generation"] == a["sssp/k"].attrs["generation"] == a.attrs["generation"]
    assert np.asarray(a["elevation"][:]).shape == (128, 128)
