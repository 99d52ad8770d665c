"""Shared pytest fixtures. GPU tests are marked ``gpu`` and skipped where no CUDA device is usable."""
from __future__ import annotations

from pathlib import Path

import pytest

from terrain_io.backend import gpu_available

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATA = ROOT / "sample_data"


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no usable CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sample_data() -> Path:
    """The folder of real DEMs shipped with the project (see sample_data/SOURCES.md)."""
    return SAMPLE_DATA
