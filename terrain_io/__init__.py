"""terrain: out-of-core terrain processing (z-order tiled Zarr DEM stores, grid MST and SSSP) and
general graph algorithms, on the CPU (numba) and the GPU (CuPy)."""

DISTRIBUTION = "terrain-io"  # the name on PyPI (``pip install terrain-io``); the command is ``terrain``


def _version() -> str:
    """The installed distribution's version; the source tree's when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0.1.0"


__version__ = _version()

from .jit import defer_blas_check  # noqa: E402

defer_blas_check()

from .errors import DeviceError, InputError, StoreError, TerrainError  # noqa: E402,F401

# The public entry points (README "API"), imported on first use: ``import terrain_io`` (the command's
# startup) stays free of numba, zarr and the pipelines.
_ENTRY_POINTS = {"mst": "grid.mst.pipeline", "sssp": "grid.sssp.engine", "fill": "grid.fill.pipeline", "depressions": "grid.depressions.pipeline",
                 "cost_distance": "grid.sssp.array", "flow_direction": "grid.flow.array",
                 "flow_accumulation": "grid.flow.array", "TerrainStore": "store"}
__all__ = ["DeviceError", "InputError", "StoreError", "TerrainError", *_ENTRY_POINTS]


def __getattr__(name: str):
    if name not in _ENTRY_POINTS:
        raise AttributeError(f"module 'terrain_io' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_ENTRY_POINTS[name]}", __name__), name)
    globals()[name] = value
    return value
