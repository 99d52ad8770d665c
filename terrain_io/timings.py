"""Phase timer of the pipelines: seconds by phase name, measured with :func:`time.perf_counter`.

::

    timings = Timings()
    with timings.phase("solve"):
        ...
    timings.seconds()  # since the timer was made: the run's total

A phase entered again adds to its time (a phase spread over a loop's rounds: ``read``, ``write``),
also from several threads at once (the sum of their times).
A :class:`Timings` is a plain ``dict`` of floats too, so results keep it, zarr writes it as JSON
attributes and the commands print it as they did.
"""
from __future__ import annotations

import contextlib
import threading
import time


class Timings(dict):
    """Seconds by phase name (a dict), and the time since it was made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._start = time.perf_counter()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Times the ``with`` block as phase ``name`` (added to its earlier time, if any)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Adds ``seconds`` to phase ``name``."""
        with self._lock:
            self[name] = self.get(name, 0.0) + seconds

    def seconds(self) -> float:
        """Seconds since this timer was made."""
        return time.perf_counter() - self._start

    def rounded(self, digits: int = 3) -> dict:
        """A plain dict of the phases' seconds rounded to ``digits`` (what results keep)."""
        return {k: round(v, digits) for k, v in self.items()}

    def __reduce__(self):  # pickles as a plain dict of its phases (a Dask task's result)
        return dict, (dict(self),)
