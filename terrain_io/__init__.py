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


def __getattr__(name):
    """The in-memory raster functions, imported on first use (``import terrain_io`` stays light)."""
    if name in ("flow_direction", "flow_accumulation"):
        from .grid import flow

        return getattr(flow, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
