"""The CPU shard SSSP's whole run within ``--memory`` (README "Memory budgets"): every unit solved
until no ring changes (~5 solves a unit, re-solves warm from disk), then each result shard put
together from its staged units. Peak RSS growth above the warm process, in a fresh process
(the harness of tests/test_memory_budget.py)."""
from __future__ import annotations

import pytest

from test_memory_budget import NEEDS_PROC, _grown


@NEEDS_PROC
@pytest.mark.slow
def test_shards_cpu_whole_run_within_budget(tmp_path):
    """4096^2 float32 (64 MiB) under 10 MiB, 128^2 tiles in 512^2 shards: units of 256^2, four to a
    shard, absdiff (winding paths on flats: re-solves). Before: +10.9-13.7 MiB -- the units' blocks
    (256-512 KiB) crept in glibc's heaps below its 1 MiB mmap threshold, and the assembly took two
    lanes as if the solves had given their heap back."""
    from terrain_io.synth import synthesize

    budget = 10 << 20
    big = synthesize(tmp_path / "big.zarr", 4096, seed=1, cell_size=10.0, tile=128, shard=4, progress=False)
    warm = synthesize(tmp_path / "warm.zarr", 256, seed=2, tile=128, shard=1, progress=False)
    res = _grown("sssp", "cpu", big, warm, budget, [{"method": "shards", "unit": 128}], method="shards")
    stats = res["stats"]
    assert res["method"] == "shards" and stats["unit"] == 256 and stats["solves_per_unit"] > 2, res
    assert stats["unreached_units"] == 0 and res["new_kernels"] == [], res
    assert res["grown"] <= budget, f"peak RSS grew by {res['grown'] / 2**20:.1f} MiB ({res})"
