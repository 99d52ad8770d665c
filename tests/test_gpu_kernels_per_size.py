"""No CuPy kernel is compiled again for a DEM of another size (issue 31): the first `terrain mst` on a
32768^2 DEM once spent 4-6 s compiling CUB reductions that a 2048^2 run had compiled for its own
lengths -- CuPy picks a CUB reduction's block size from a short array's length (32 to 512 threads), and
the GPU encoder counted its few hundred kept chunks a band on the GPU. Here each pipeline runs on DEMs
whose bands hold 16 to 640 chunks, in a fresh process with an empty CuPy kernel cache; after the first
size, no later one may add a compiled kernel to the cache (``CUPY_CACHE_DIR``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Bands of two shard rows of 4 x 32-cell chunks: 16, 48, 144 and 640 chunks a band at these widths, which
# CuPy's CUB reductions would size at 32, 32, 64 and 256 threads a block.
WIDTHS = (128, 384, 1152, 5120)

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from terrain_io import nvzstd
    from terrain_io.store import TerrainStore
    from terrain_io.grid.mst import mst

    cache = os.environ["CUPY_CACHE_DIR"]
    rng = np.random.default_rng(3)
    kernels = []
    for k, width in enumerate(json.loads(sys.argv[1])):
        h = (np.add.outer(np.arange(256), np.arange(width)) * 0.01 + rng.random((256, width))).astype("float32")
        st = TerrainStore.from_array(os.path.join(sys.argv[2], f"s{k}.zarr"), h, tile=32, shard=4)
        mst(st, device="gpu", method="incore", progress=False)
        kernels.append(sorted(f for _, _, fs in os.walk(cache) for f in fs))
    print(json.dumps({"nvcomp": nvzstd.encoder() is not None, "kernels": kernels}))
""")


@pytest.mark.gpu
def test_mst_and_its_gpu_write_compile_nothing_new_for_other_sizes(tmp_path):
    pytest.importorskip("cupy")
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(WIDTHS), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if not got["nvcomp"]:
        pytest.skip("nvCOMP (pip nvidia-libnvcomp-cu13) is not installed: the GPU write is not exercised")
    first, *later = got["kernels"]
    assert first, "no kernel was compiled: the cache directory was not used"
    for width, kernels in zip(WIDTHS[1:], later):
        assert kernels == first, f"width {width} compiled {sorted(set(kernels) - set(first))}"


# An in-core MST over 2**31 bytes of elevations (23,200^2 float32, 2.15 GB; ~12 GB of GPU memory): CuPy's own
# kernels would compile 64-bit-indexed variants there, which a small DEM never does.
BIG_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import cupy as cp
    import numpy as np
    from terrain_io import weights
    from terrain_io.grid.mst._gpu import GpuGridForest

    cache = os.environ["CUPY_CACHE_DIR"]
    side = int(sys.argv[1])
    big = cp.asarray(np.add.outer(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32)))
    kernels = []
    for vals in (big[:64, :64].copy(), big):
        bits, totals = GpuGridForest(weights.get("max"), np.float32).forest(vals)
        edges, _, cells = totals()
        kernels.append(sorted(f for _, _, fs in os.walk(cache) for f in fs))
    print(json.dumps({"nbytes": big.nbytes, "edges": edges, "cells": cells, "kernels": kernels}))
""")


@pytest.mark.gpu
def test_the_incore_mst_compiles_nothing_new_over_2_31_bytes(tmp_path):
    cp = pytest.importorskip("cupy")
    side = 23_200
    if cp.cuda.Device().mem_info[0] < 16 << 30:
        pytest.skip("needs ~12 GB of free GPU memory")
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run([sys.executable, "-c", BIG_SCRIPT, str(side)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["nbytes"] > 2**31 and got["cells"] == side * side and got["edges"] == side * side - 1
    first, big = got["kernels"]
    assert first, "no kernel was compiled: the cache directory was not used"
    assert big == first, f"the large grid compiled {sorted(set(big) - set(first))}"
