"""Folder locks (issue 28.2): one writer per run, demo or sweep folder, tested with real processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import write_recipe

from minimind_trl import demo
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.fsio import (
    FolderInUseError,
    FolderLockError,
    folder_lock,
    lock_folder,
    lock_path,
    unlock_folder,
    write_jsonl_atomic,
)
from minimind_trl.trainer import cli

HOLD = textwrap.dedent("""
    import sys, time
    from minimind_trl.fsio import lock_folder
    lock_folder(sys.argv[1], "holder under test")
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def holder(tmp_path):
    """A second process holding the lock of ``tmp_path / "run"``; killed (-9) at the end."""
    folder = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield folder, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_live_holder_is_named_and_a_dead_ones_lock_is_taken_over(holder, capsys):
    folder, proc = holder
    with pytest.raises(FolderInUseError, match=rf"in use by pid {proc.pid} \(holder under test"):
        lock_folder(folder, "second writer")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    lock_folder(folder, "second writer")  # the kernel dropped the dead holder's flock
    try:
        assert f"took over the lock of pid {proc.pid}" in capsys.readouterr().err
        assert json.loads(lock_path(folder).read_text())["pid"] == os.getpid()
    finally:
        unlock_folder(folder)
    assert not lock_path(folder).exists()  # released cleanly: the next taker has nothing to report
    lock_folder(folder, "third")
    unlock_folder(folder)
    assert "took over" not in capsys.readouterr().err


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    lock_folder(tmp_path / "x", "a")
    lock_folder(tmp_path / "x", "a")
    unlock_folder(tmp_path / "x")
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from minimind_trl.fsio import FolderInUseError, lock_folder
        try:
            lock_folder(sys.argv[1], "probe")
        except FolderInUseError:
            sys.exit(7)
    """), str(tmp_path / "x")])
    assert probe.returncode == 7  # still held once
    unlock_folder(tmp_path / "x")
    released = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", ""), str(tmp_path / "x")])
    assert released.returncode == 0


def test_train_on_a_folder_another_process_holds_exits_2_naming_it(holder, tmp_path, capsys):
    folder, proc = holder
    write_jsonl_atomic(tmp_path / "tasks.jsonl", generate_tasks(8, seed=3))
    prepare_splits([tmp_path / "tasks.jsonl"], tmp_path / "splits", seed=3, sizes=[4, 2, 2])
    recipe = write_recipe(tmp_path, tmp_path / "splits")
    assert cli.main([str(recipe), "--output-dir", str(folder), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"pid {proc.pid}" in err and len(err.strip().splitlines()) == 1
    assert not folder.exists()  # nothing was written: the lock comes before the model is built


def test_a_second_demo_on_a_demo_in_progress_exits_2_and_leaves_it_alone(holder, capsys):
    folder, proc = holder
    folder.mkdir()
    (folder / "runs").mkdir()
    staging = folder / "runs" / ".staging-checkpoint-4"
    staging.mkdir()
    assert demo.main(["--output-dir", str(folder), "--quick", "--resume"]) == 2
    assert f"pid {proc.pid}" in capsys.readouterr().err
    assert staging.is_dir()  # the first demo's staging folder was not removed as a leftover


# ---------------------------------------------------------------- issue 40.4: hostile lock paths


def test_a_symlink_lock_path_is_refused_and_its_target_left_whole(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    lock_path(tmp_path / "run").symlink_to(precious)
    with pytest.raises(FolderLockError, match="symlink"):
        lock_folder(tmp_path / "run", "writer")
    assert precious.read_text() == "keep me"  # ftruncate used to empty it


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_path_that_is_not_a_regular_file_is_one_error(kind, tmp_path):
    path = lock_path(tmp_path / "run")
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    with pytest.raises(FolderLockError, match="not a regular file|is a folder"):
        lock_folder(tmp_path / "run", "writer")


def test_an_unwritable_lock_folder_is_one_error(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(FolderLockError, match="Permission denied"):
        lock_folder(tmp_path / "run", "writer")


def test_the_root_folder_is_never_locked():
    with pytest.raises(FolderLockError, match="root folder"):
        lock_folder("/", "writer")


def test_a_released_lock_leaves_no_file_and_a_stale_inode_is_not_trusted(tmp_path):
    lock_folder(tmp_path / "run", "a")
    unlock_folder(tmp_path / "run")
    assert not lock_path(tmp_path / "run").exists()
    with folder_lock(tmp_path / "run", "b"):
        assert lock_path(tmp_path / "run").is_file()
    assert list(tmp_path.iterdir()) == []


def test_train_with_a_bad_lock_path_or_a_refused_folder_is_one_line_and_leaves_no_lock(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    folder = tmp_path / "run"
    lock_path(folder).mkdir()
    assert cli.main([str(recipe), "--output-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and ".run.lock" in err
    lock_path(folder).rmdir()
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert cli.main([str(recipe), "--output-dir", str(folder)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert not lock_path(folder).exists()  # the refusal left no lock file beside the folder
