"""Crash-safe writing: leftovers of killed writers are cleaned, a result lost mid-swap is restored."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terrain_io.atomic import atomic_directory, atomic_file, clean_stale, locked, scratch_directory, temporary_name


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def fake_leftover(final, pid, suffix="", parent=None):
    """A temporary as a writer with ``pid`` would have named it."""
    tmp = temporary_name(final, parent=parent)
    name = tmp.name.replace(f"-{os.getpid()}-", f"-{pid}-") + suffix
    return tmp.with_name(name)


def test_leftovers_of_dead_writers_are_removed_by_the_next_writer(tmp_path):
    final = tmp_path / "out.zarr"
    stale = fake_leftover(final, dead_pid())
    (stale / "sub").mkdir(parents=True)
    alive = fake_leftover(final, os.getppid())  # a live process: must be left alone
    alive.mkdir()
    other = fake_leftover(tmp_path / "other.zarr", dead_pid())
    other.mkdir()
    with atomic_directory(final) as tmp:
        tmp.mkdir()
        (tmp / "zarr.json").write_text("{}")
    assert final.is_dir() and not stale.exists() and alive.exists() and other.exists()


def test_result_lost_between_the_two_renames_is_restored(tmp_path):
    store = tmp_path / "dem.zarr"
    store.mkdir()
    # a killed replace of dem.zarr/mst: the old result was moved aside, the new one never moved in
    old = fake_leftover(store / "mst", dead_pid(), ".old", parent=tmp_path)  # result temporaries lie beside the store
    old.mkdir()
    (old / "zarr.json").write_text('{"old": true}')
    restored = clean_stale(tmp_path)
    assert restored == [old]
    assert (store / "mst" / "zarr.json").read_text() == '{"old": true}'


def test_failed_block_leaves_no_temporary_and_keeps_the_old_file(tmp_path):
    final = tmp_path / "x.tif"
    final.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(final) as tmp:
            tmp.write_text("half")
            raise RuntimeError
    assert final.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.tif"]


def test_scratch_directory_is_private_and_removed(tmp_path):
    (tmp_path / "dem.zarr").mkdir()
    with scratch_directory(tmp_path / "dem.zarr", "sssp") as scratch:
        assert scratch.is_dir() and scratch.parent == tmp_path / "dem.zarr"  # inside the store
    assert not scratch.exists()


def test_lock_excludes_a_second_holder(tmp_path):
    lock = tmp_path / ".x.lock"
    code = f"from terrain_io.atomic import locked\nwith locked({str(lock)!r}, wait=False): print('got')"
    with locked(lock):
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode != 0 and "locked by another process" in other.stderr
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert other.returncode == 0 and other.stdout.strip() == "got"


def test_scratch_folder_interrupted_right_after_it_is_made_is_removed(tmp_path, monkeypatch):
    """A Ctrl-C that lands just after the scratch folder's mkdir (the reliability test signals as soon
    as a temporary appears) leaves nothing behind."""
    from terrain_io.atomic import scratch_directory, sweep_temporaries

    real_mkdir = Path.mkdir

    def mkdir_then_interrupt(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        raise KeyboardInterrupt

    (tmp_path / "dem.zarr").mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        with scratch_directory(tmp_path / "dem.zarr", "sssp"):
            pass
    monkeypatch.undo()
    sweep_temporaries()
    assert list((tmp_path / "dem.zarr").iterdir()) == []
