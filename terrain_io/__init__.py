"""terrain: out-of-core terrain processing (z-order tiled Zarr DEM stores, grid MST and SSSP) and
general graph algorithms, on the CPU (numba) and the GPU (CuPy)."""

__version__ = "0.1.0"

from .errors import DeviceError, InputError, StoreError, TerrainError  # noqa: E402,F401
