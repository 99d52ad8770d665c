"""Ctrl-C and SIGTERM for the ``terrain`` command: one line, exit 130 / 143, nothing left behind,
from the first instruction of the command to its last.

Python's default turns SIGINT into a KeyboardInterrupt raised wherever the main thread happens to
be -- inside an import of numba or llvmlite (which may then crash the process), in a finalizer or a
callback, where it is printed as "Exception ignored" and the run goes on (exit 0 after SIGTERM) --
and kills the process outright on SIGTERM. Here the handler never raises. It ends the run itself:
it removes this process's unfinished temporaries (:func:`terrain_io.atomic.sweep_temporaries`),
prints one line and leaves with ``os._exit`` (no interpreter shutdown, whose finalizers can crash
while worker threads are still inside numba or zarr).

Two kinds of moments must not be cut, so a signal that arrives in one is held and acted on when it
ends:

- a section of this package marked :func:`deferred` (a commit's renames, :func:`terrain_io.atomic.replace`);
- numba writing a compiled kernel into its cache (an exit mid-write leaves a ``.tmp`` file there);
  every thread's stack is inspected, and the handler looks again every few milliseconds.

This module imports nothing heavy: the command line installs it before anything else.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

EXITS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
_RETRY_S = 0.005  # how soon a held signal is looked at again while numba writes its cache

_held: list[int] = []  # the first signal that arrived during a deferred moment
_depth = 0  # deferred sections open, in any thread
_depth_lock = threading.Lock()  # never taken by the handler (it may run while the main thread holds it)
_at_leave: list = []  # what a signal ends first (the demo's helper processes: :func:`at_leave`)


def install() -> None:
    """Handle SIGINT and SIGTERM as described above, then unblock them (the command line blocks
    them before its first import, so that a signal during the imports waits for this handler)."""
    for signum in EXITS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored by the parent (a background job): stays so
            signal.signal(signum, _on_signal)
    signal.signal(signal.SIGALRM, _on_retry)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, tuple(EXITS))


@contextlib.contextmanager
def deferred():
    """A section a signal must not cut: one that arrives meanwhile ends the run when it is over.
    Nests; a no-op where :func:`install` was not called (library use)."""
    global _depth
    with _depth_lock:
        _depth += 1
    try:
        yield
    finally:
        with _depth_lock:
            _depth -= 1
            now = _depth == 0 and _held
        if now:
            leave(_held[0])


def at_leave(fn) -> None:
    """Run ``fn()`` first when a signal ends the run (before this process's temporaries are removed);
    :func:`not_at_leave` takes it back."""
    _at_leave.append(fn)


def not_at_leave(fn) -> None:
    with contextlib.suppress(ValueError):
        _at_leave.remove(fn)


def _on_signal(signum, frame):
    if not _held:
        _held.append(signum)
    if _depth:
        return  # deferred() acts when its section ends
    if _in_numba_cache_write(frame):
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    leave(_held[0])


def _on_retry(signum, frame):
    if _held:
        _on_signal(_held[0], frame)


def _in_numba_cache_write(frame) -> bool:
    caching = sys.modules.get("numba.core.caching")
    cache_file = getattr(caching, "IndexDataCacheFile", None)
    if cache_file is None:
        return False
    codes = {cache_file.save.__code__, cache_file._save_index.__code__, cache_file._save_data.__code__}
    for top in (frame, *sys._current_frames().values()):  # a worker thread may be the one compiling
        while top is not None:
            if top.f_code in codes:
                return True
            top = top.f_back
    return False


def leave(signum: int) -> None:
    """Remove this process's temporaries, say one line, and end the process at once."""
    if threading.current_thread() is threading.main_thread():  # (a deferred section may end in a worker)
        for s in (*EXITS, signal.SIGALRM):
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C does not cut the clean-up short
    code, word = EXITS[signum]
    atomic = sys.modules.get("terrain_io.atomic")  # not imported yet: nothing to remove
    try:
        for fn in list(_at_leave):
            with contextlib.suppress(Exception):
                fn()
        if atomic is not None:
            atomic.sweep_temporaries()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the main thread may have been inside a write to it
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(2, f"terrain: {word}\n".encode())
        os._exit(code)
