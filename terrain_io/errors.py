"""Exceptions that reach the user as one clear line (the CLI prints them without a traceback)."""


class TerrainError(Exception):
    """Base class for every error the user caused or can fix: bad input, bad options, missing device."""


class InputError(TerrainError, ValueError):
    """Malformed or unusable input data (DEM files, edge lists, coordinates)."""


class DeviceError(TerrainError, RuntimeError):
    """The requested compute device is not usable."""


class StoreError(TerrainError):
    """A store is missing, incomplete, or does not hold the requested array."""
