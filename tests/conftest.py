"""Shared pytest fixtures. GPU tests are marked ``gpu`` and skipped where no CUDA device is usable."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from terrain_io.backend import gpu_available

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATA = ROOT / "sample_data"


DEFAULT_MARKS = "not gpu and not slow and not browser"  # pyproject's addopts: the CI run


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole default run (plain ``pytest``: no paths, no ``-m``, no ``-n``) goes to one
    pytest-xdist worker a core, up to 4, a test module to a worker: most of its time is numba
    compiling kernels on one core.
    A chosen test, a GPU or slow run, or an explicit ``-n`` stays as asked."""
    if getattr(config.option, "numprocesses", "absent") is not None or hasattr(config, "workerinput"):
        return  # pytest-xdist missing, disabled (-p no:xdist) or -n given; or this is a worker
    chosen = config.args_source != pytest.Config.ArgsSource.TESTPATHS
    if chosen or config.option.markexpr != DEFAULT_MARKS or config.option.usepdb:
        return
    config.option.numprocesses = min(4, os.cpu_count() or 1)
    config.option.dist = "loadfile"  # a module's tests stay together, in order (the README's commands build on each other)


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


@pytest.fixture(params=["runs", "per-chunk"])
def chunk_codec(request, monkeypatch):
    """Both ways the store encodes and decodes chunks: runs of a shard's chunks in one GIL-free call
    (terrain_io.chunkcodec), and chunk by chunk in Python (where the codecs' C functions cannot be
    called so, or numba has not started in the process)."""
    from terrain_io import chunkcodec, store

    runs = request.param == "runs" and chunkcodec.functions() is not None
    monkeypatch.setattr(store, "_codec_runs", lambda nbytes, start=True: chunkcodec if runs else None)
    return request.param
