"""Exceptions that reach the user as one clear line (the CLI prints them without a traceback)."""


class TerrainError(Exception):
    """Base class for every error the user caused or can fix: bad input, bad options, missing device."""


class InputError(TerrainError, ValueError):
    """Malformed or unusable input data (DEM files, edge lists, coordinates)."""


class DeviceError(TerrainError, RuntimeError):
    """The requested compute device is not usable."""


class StoreError(TerrainError):
    """A store is missing, incomplete, or does not hold the requested array."""


class DamagedStoreError(StoreError):
    """A chunk of a store fails its checksum, or a shard file the array's manifest lists is missing or
    has the wrong size: the data cannot be trusted, so nothing is computed from it.

    ``str()`` is one line: ``STORE: array ARRAY chunk (r, c): PROBLEM``.
    """

    def __init__(self, store, array: str, chunk, problem: str, unit: str = "chunk"):
        self.store, self.array, self.problem, self.unit = str(store), array, problem, unit
        self.chunk = tuple(int(i) for i in chunk) if chunk is not None else None
        where = f" {unit} {self.chunk}" if self.chunk is not None else ""
        noun = "result" if unit == "result" else "array"  # a result computed from another elevation
        super().__init__(f"{self.store}: {noun} {array}{where}: {problem}")

    def __reduce__(self):  # raised in Dask workers and thread pools: it must survive pickling
        return type(self), (self.store, self.array, self.chunk, self.problem, self.unit)


class TerrainNote(UserWarning):
    """Something the user should know that is no error (the CLI prints it as ``terrain: note: ...``)."""


class UnverifiedStoreWarning(TerrainNote):
    """A store of format_version 1: its chunks carry no checksums, so damage inside one goes unseen."""


class SkippedPointsNote(TerrainNote):
    """Points of an input left out because they lie outside the DEM or on nodata (``skip_invalid``)."""


class OutputError(TerrainError):
    """An output cannot be written (a read-only folder, a full disk), or would replace something the
    tool did not write; the message names the path the user gave."""
