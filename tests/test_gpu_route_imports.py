"""The GPU's in-core routes of ``terrain sssp`` and ``terrain mst`` run no CPU kernel, so a fresh
process importing them (and doing their host work before the GPU's: the sources, the field, the
method) imports no numba: its import held the GIL for ~0.3-0.6 s of each command's start on the H100,
beside CuPy's and zarr's (issue 31; the hydrology's commands: tests/test_hydro_startup.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_routes_of_sssp_and_mst_import_no_numba(tmp_path):
    code = f"""
        import sys
        import numpy as np
        from cli.main import _register
        _register()  # every command's module, as the terrain command loads them
        import terrain_io.grid.sssp.incore, terrain_io.grid.sssp._incore_gpu, terrain_io.grid.sssp.result
        import terrain_io.grid.mst.pipeline, terrain_io.grid.mst._gpu, terrain_io.grid.flow.upload
        import terrain_io.pinned, terrain_io.nvzstd
        from terrain_io import weights
        from terrain_io.grid.mst.pipeline import choose_method
        from terrain_io.grid.sssp.engine import parse_sources
        from terrain_io.grid.sssp.index import Field
        from terrain_io.store import TerrainStore

        dem = np.arange(48 * 64, dtype=np.float32).reshape(48, 64) % 7
        store = TerrainStore.from_array({str(tmp_path / "dem.zarr")!r}, dem, tile=16, shard=2)
        cells = parse_sources(store, [(3, 4), (40, 60)], cell=True)
        steps = Field(store, weights.sssp_model("surface")).steps()
        method = choose_method(store, weights.get("max"), "auto", "gpu", 1 << 30, "local", None,
                               gpu_free=lambda: 1 << 30)
        print(cells.labels, len(steps), method)
        print(sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    first, numba_modules = done.stdout.strip().splitlines()[-2:]
    assert first == "[1, 2] 8 incore"
    assert numba_modules == "[]"
