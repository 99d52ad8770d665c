"""Crash-safe writing: temporary names renamed when complete, stale leftovers, store locks.

Every output (a store, a result group, an exported file, scratch space) is made under a hidden
temporary name that carries the writer's process id: ``.NAME.partial-PID-RANDOM``, where NAME is
the final path relative to the temporary's folder, %-encoded (so a result ``dem.zarr/mst`` made
beside the store is ``.dem.zarr%2Fmst.partial-...``). It is renamed
to ``NAME`` only when complete, so a killed run never leaves anything that looks whole. What a
killed run leaves behind is removed by the next writer of the same name once that PID is gone;
if a run died between moving an old result aside and moving the new one in, the old one is put
back.

An error of the file system on a temporary (a read-only folder, a full disk) reaches the user as
one line naming the output they asked for (:class:`~terrain_io.errors.OutputError`), never the
temporary's internal name.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from urllib.parse import quote, unquote

from .errors import OutputError
from .interrupts import deferred

_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?:partial|scratch)-(?P<pid>\d+)-[0-9a-f]+(?P<old>\.old)?$")


# Temporaries of this process not yet renamed into place. A zarr call interrupted by Ctrl-C can
# finish writing in zarr's own I/O thread after the temporary was removed; the command line sweeps
# these once more (sweep_temporaries) just before it exits.
_OWN: set[Path] = set()

# What must run when a temporary is complete, just before it is renamed into place (a store's
# manifests: terrain_io.integrity.seal), by temporary.
_BEFORE_COMMIT: dict[Path, list] = {}


def before_commit(path, fn) -> bool:
    """Run ``fn()`` when the atomic directory ``path`` (a temporary of this process, not yet renamed)
    is complete, just before the rename. False (and nothing registered) if ``path`` is not one."""
    path = Path(path)
    if path not in _OWN:
        return False
    _BEFORE_COMMIT.setdefault(path, []).append(fn)
    return True


def sweep_temporaries() -> None:
    """Remove every temporary this process made and did not complete (last act before exiting)."""
    if _OWN:
        time.sleep(0.05)  # let an I/O thread of an interrupted zarr call finish its write first
    for path in list(_OWN):
        _remove(path)
        _OWN.discard(path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    """Remove a file or folder that another thread may still be creating (a few tries)."""
    for _ in range(5):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        except OSError:
            continue  # it changed under us (a folder appeared, a file was added): try again
        if not os.path.lexists(path):
            return


def clean_stale(parent, name: str | None = None) -> list[Path]:
    """Remove leftovers of dead writers in ``parent`` (only those for final path ``name`` if given,
    relative to ``parent``).

    An ``.old`` copy whose final name is missing is restored instead of removed. Returns what was
    removed or restored.
    """
    parent = Path(parent)
    done = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return done
    for entry in entries:
        m = _PARTIAL.match(entry.name)
        if not m or (name is not None and unquote(m.group("name")) != name) or _alive(int(m.group("pid"))):
            continue
        final = parent / unquote(m.group("name"))
        if m.group("old") and not final.exists():
            os.rename(entry, final)  # the run died mid-swap: the old result is still the valid one
        else:
            _remove(entry)
        done.append(entry)
    return done


def temporary_name(final: Path, kind: str = "partial", parent=None) -> Path:
    """``.NAME.KIND-PID-RANDOM`` in ``parent`` (default: beside ``final``) for the output ``final``."""
    final = Path(final)
    parent = Path(parent) if parent is not None else final.parent
    rel = os.path.relpath(final, parent)
    return parent / f".{quote(rel, safe='')}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _relative(final: Path, tmp: Path) -> str:
    return os.path.relpath(final, tmp.parent)


def _about(exc: OSError, tmp: Path) -> bool:
    """Whether the OS error ``exc`` concerns the temporary ``tmp`` or a file inside it."""
    for name in (exc.filename, exc.filename2):
        if name is not None and (os.fspath(name) == os.fspath(tmp) or os.fspath(name).startswith(f"{tmp}{os.sep}")):
            return True
    return False


def _as_output_error(exc: OSError, final: Path) -> OutputError:
    """``exc`` (about a temporary of ``final``) said of ``final``, the path the user named."""
    return OutputError(f"{final}: cannot write it: {exc.strerror or exc}")


@contextlib.contextmanager
def atomic_directory(final, tmp_parent=None):
    """Yield a fresh temporary path; rename it to ``final`` when the block completes.

    The temporary lies in ``tmp_parent`` (default: beside ``final``; same file system, so the
    rename is atomic). An existing ``final`` is replaced only after the new one is complete; on an
    exception (Ctrl-C included) the temporary is removed and ``final`` is untouched.
    """
    final = Path(final)
    tmp = temporary_name(final, parent=tmp_parent)
    clean_stale(tmp.parent, _relative(final, tmp))
    _OWN.add(tmp)
    try:
        yield tmp
        for fn in _BEFORE_COMMIT.pop(tmp, []):
            fn()
        with deferred():  # a signal now ends the run after the swap: whole, and no temporary left
            replace(tmp, final)
            _OWN.discard(tmp)
    except BaseException as exc:
        _BEFORE_COMMIT.pop(tmp, None)
        _remove(tmp)
        if isinstance(exc, OSError) and _about(exc, tmp):
            raise _as_output_error(exc, final) from None
        raise


def replace(tmp: Path, final: Path) -> None:
    """Move the complete ``tmp`` to ``final``, replacing what is there (directories too).

    A directory cannot be renamed over a non-empty one, so the old one is moved aside first; the
    two renames happen under a lock on the parent folder, so concurrent writers of the same name
    take turns (the last one wins, and each swap is whole); a signal waits for both renames.
    """
    with deferred(), folder_lock(final.parent):
        if final.is_dir() and not final.is_symlink():
            old = tmp.with_name(tmp.name + ".old")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)


@contextlib.contextmanager
def folder_lock(folder):
    """Hold an exclusive advisory lock on the folder itself for the block: what moves entries in or
    out of it (:func:`replace`) takes turns."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def atomic_file(final):
    """Yield a temporary file path beside ``final``; it becomes ``final`` when the block completes."""
    final = Path(final)
    tmp = temporary_name(final)
    clean_stale(tmp.parent, _relative(final, tmp))
    _OWN.add(tmp)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))  # a read-only folder fails here, before
        os.unlink(tmp)  # the work (GDAL's drivers would name the temporary): writers make the file anew
        yield tmp
        with deferred():
            os.replace(tmp, final)
            _OWN.discard(tmp)
    except BaseException as exc:
        _remove(tmp)
        Path(str(tmp) + ".aux.xml").unlink(missing_ok=True)  # GDAL side files
        if isinstance(exc, OSError) and _about(exc, tmp):
            raise _as_output_error(exc, final) from None
        raise


@contextlib.contextmanager
def scratch_file(final):
    """Yield a temporary file path beside ``final`` for intermediate bytes (the GeoTIFF that GDAL's COG
    driver copies from); removed when the block ends, by the interrupt handler's sweep, or as a dead
    writer's leftover."""
    tmp = temporary_name(Path(final), "scratch")
    _OWN.add(tmp)
    try:
        yield tmp
    finally:
        _remove(tmp)
        Path(str(tmp) + ".aux.xml").unlink(missing_ok=True)  # GDAL side files
        _OWN.discard(tmp)


def refuse_existing(final, overwrite: bool) -> None:
    """The rule of every output file: one that exists is replaced only with ``overwrite``."""
    if os.path.lexists(final) and not overwrite:
        raise OutputError(f"{final}: already exists (use --overwrite to replace it)")


@contextlib.contextmanager
def atomic_files(final, overwrite: bool = False, side: tuple[str, ...] = ()):
    """Yield a temporary folder beside ``final`` in which a writer makes ``final.name`` and its side
    files (a Shapefile's .shx, .dbf, .prj, .cpg); when complete each is renamed into place, ``final``
    last. A file of the set already there is refused (nothing moved) unless ``overwrite``; then the
    side files of the replaced ``final`` with a suffix in ``side`` that the new set lacks go too."""
    final = Path(final)
    tmp = temporary_name(final)
    clean_stale(tmp.parent, _relative(final, tmp))
    _OWN.add(tmp)
    try:
        tmp.mkdir()
        yield tmp
        made = sorted((p.name for p in tmp.iterdir()), key=lambda n: n == final.name)  # final last
        for name in made:
            refuse_existing(final.parent / name, overwrite)
        replaced = os.path.lexists(final)
        with deferred():  # a signal ends the run after the whole set is in place
            for name in made:
                os.replace(tmp / name, final.parent / name)
            if replaced:
                for suffix in side:
                    old = final.with_suffix(suffix)
                    if old.name not in made:
                        old.unlink(missing_ok=True)
        _remove(tmp)
        _OWN.discard(tmp)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError) and _about(exc, tmp):
            raise _as_output_error(exc, final) from None
        raise


@contextlib.contextmanager
def scratch_directory(store, label: str):
    """A private scratch folder inside the store folder ``store`` (same disk as the data; a
    writable store in a read-only folder works), removed afterwards.

    Named like the partial outputs (hidden: neither zarr's listing through a TerrainStore nor the
    manifests see it), so a killed run's scratch is cleaned by the next run.
    """
    path = temporary_name(Path(store) / label, kind="scratch")
    clean_stale(path.parent, label)
    _OWN.add(path)  # before it exists: a signal right after the mkdir still finds it swept at exit
    try:
        path.mkdir()
        yield path
    except OSError as exc:
        if _about(exc, path):  # a read-only store, a full disk: said of the store, not of the scratch
            raise OutputError(f"{store}: cannot write scratch space in it: {exc.strerror or exc}") from None
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _OWN.discard(path)


@contextlib.contextmanager
def locked(path, shared: bool = False, wait: bool = True):
    """Hold an advisory lock on ``path`` (a lock file, created if missing) for the block.

    Exclusive by default; ``wait=False`` raises BlockingIOError when another process holds it.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only store: said of the folder the user named, not of the lock file
        raise OutputError(f"{path.parent}: cannot lock it for writing: {exc.strerror or exc}") from None
    try:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise BlockingIOError(f"{path} is locked by another process") from None
            raise
        yield
    finally:
        os.close(fd)  # closing releases the lock
