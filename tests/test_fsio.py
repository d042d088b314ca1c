"""minimind_trl.fsio: atomic writes, the bounded JSONL reader, the appender, the directory commit."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from minimind_trl import fsio
from minimind_trl.data import validation
from minimind_trl.fsio import (
    DataFormatError,
    JsonlAppender,
    aside_path,
    build_directory,
    commit_directory,
    read_jsonl,
    recover_directory,
    sha256_file,
    staging_path,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)


def test_the_reader_and_its_errors_have_one_home():
    """data/validation.py raises fsio's errors and adds the task-row schema; it does not re-export
    the reader."""
    assert validation.DataFormatError is fsio.DataFormatError
    assert issubclass(validation.GenerationError, fsio.DataError)
    assert not {"iter_jsonl", "read_json_file", "DataError", "DataFormatError"} & set(validation.__all__)
    assert not hasattr(validation, "iter_jsonl")


def test_atomic_text_json_jsonl_and_sha(tmp_path):
    path = write_text_atomic(tmp_path / "sub" / "a.txt", "héllo\n")
    assert path.read_bytes() == "héllo\n".encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~fsio.current_umask()
    write_json_atomic(tmp_path / "b.json", {"z": 1, "a": "é"})
    assert (tmp_path / "b.json").read_text(encoding="utf-8") == '{\n  "z": 1,\n  "a": "é"\n}\n'
    write_json_atomic(tmp_path / "c.json", {"z": 1, "a": 2}, sort_keys=True)
    assert list(json.loads((tmp_path / "c.json").read_text())) == ["a", "z"]
    write_jsonl_atomic(tmp_path / "d.jsonl", [{"b": 1, "a": [1, 2]}])
    assert (tmp_path / "d.jsonl").read_text() == '{"b":1,"a":[1,2]}\n'
    write_jsonl_atomic(tmp_path / "e.jsonl", [{"b": 1, "a": 2}], sort_keys=True, compact=False)
    assert (tmp_path / "e.jsonl").read_text() == '{"a": 2, "b": 1}\n'
    assert sha256_file(tmp_path / "d.jsonl") == fsio.sha256_text('{"b":1,"a":[1,2]}\n')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "c.json", "d.jsonl", "e.jsonl", "sub"]


def test_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = write_text_atomic(tmp_path / "a.json", "old\n")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"x": object()})
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_reader_names_file_line_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n[1]\n')
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:3: field '<row>': must be a JSON object, got list"):
        read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n{"a": \n')
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:2: field '<json>': not valid JSON") as info:
        read_jsonl(path)
    assert info.value.kind == "json"


def test_torn_tail_is_dropped_only_when_asked_and_only_at_the_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert read_jsonl(path, torn_tail=True) == [{"step": 1}, {"step": 2}]
    with pytest.raises(DataFormatError, match=":3:"):
        read_jsonl(path)
    path.write_bytes(b'{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(DataFormatError, match=":2:"):
        read_jsonl(path, torn_tail=True)


def test_appender_flushes_each_line_and_cuts_a_torn_tail(tmp_path):
    path = tmp_path / "m" / "metrics.jsonl"
    with JsonlAppender(path) as writer:
        writer.write({"step": 1, "loss": 0.5})
        assert path.read_text() == '{"step":1,"loss":0.5}\n'  # visible before close
    assert writer.closed
    with open(path, "a") as handle:  # a writer killed mid-line
        handle.write('{"step": 2, "lo')
    with JsonlAppender(path) as writer:
        writer.write({"step": 2})
    assert read_jsonl(path) == [{"step": 1, "loss": 0.5}, {"step": 2}]
    path.write_text('{"step": 9')  # a file holding only a torn line
    with JsonlAppender(path) as writer:
        writer.write({"step": 1})
    assert path.read_text() == '{"step":1}\n'


def _folder(path, text):
    path.mkdir(parents=True, exist_ok=True)
    (path / "weights.txt").write_text(text)
    (path / "sub").mkdir(exist_ok=True)
    (path / "sub" / "x.txt").write_text(text)


def test_build_directory_creates_and_replaces(tmp_path):
    target = tmp_path / "final"
    with build_directory(target) as folder:
        assert folder == staging_path(target)
        _folder(folder, "one")
    assert (target / "sub" / "x.txt").read_text() == "one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~fsio.current_umask()
    with build_directory(target) as folder:
        _folder(folder, "two")
    assert (target / "weights.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_failed_build_leaves_the_old_folder(tmp_path):
    target = tmp_path / "final"
    with build_directory(target) as folder:
        _folder(folder, "one")
    with pytest.raises(RuntimeError):
        with build_directory(target) as folder:
            _folder(folder, "half")
            raise RuntimeError("killed in the middle")
    assert (target / "weights.txt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_failed_second_rename_rolls_back(tmp_path, monkeypatch):
    target = tmp_path / "final"
    _folder(target, "old")
    staged = staging_path(target)
    _folder(staged, "new")
    real_replace = os.replace

    def replace(src, dst):
        if os.fspath(src) == os.fspath(staged):
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(fsio.os, "replace", replace)
    with pytest.raises(OSError, match="disk gone"):
        commit_directory(staged, target)
    assert (target / "weights.txt").read_text() == "old"
    assert not aside_path(target).exists()


class _Killed(BaseException):
    """Stands for SIGKILL: no ``except OSError`` rollback runs."""


@pytest.mark.parametrize("kill_at", [1, 2])
def test_kill_between_renames_leaves_old_or_new_and_next_commit_recovers(tmp_path, monkeypatch, kill_at):
    """kill_at=1: killed after moving the old folder aside (before the new one is in);
    kill_at=2: killed after the new folder is in (before the old one is deleted)."""
    target = tmp_path / "final"
    _folder(target, "old")
    staged = staging_path(target)
    _folder(staged, "new")
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == kill_at:
            raise _Killed()

    monkeypatch.setattr(fsio.os, "replace", replace)
    with pytest.raises(_Killed):
        commit_directory(staged, target)
    monkeypatch.setattr(fsio.os, "replace", real_replace)
    if kill_at == 1:
        assert not target.exists() and (aside_path(target) / "weights.txt").read_text() == "old"
    else:
        assert (target / "weights.txt").read_text() == "new" and aside_path(target).exists()
    assert recover_directory(target) == target  # what a reader or the next commit does first
    assert (target / "weights.txt").read_text() == ("old" if kill_at == 1 else "new")
    assert not aside_path(target).exists()
    with build_directory(target) as folder:
        _folder(folder, "third")
    assert (target / "weights.txt").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_next_commit_recovers_a_lone_aside_folder(tmp_path):
    target = tmp_path / "final"
    _folder(aside_path(target), "old")  # killed between the renames, nothing recovered since
    staged = staging_path(target)
    _folder(staged, "new")
    commit_directory(staged, target)
    assert (target / "weights.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    assert recover_directory(tmp_path / "missing") is None


def test_real_kill_between_renames_in_a_child_process(tmp_path):
    """os._exit(9) right after the first rename, as SIGKILL would: the old folder survives aside."""
    target = tmp_path / "final"
    _folder(target, "old")
    script = textwrap.dedent(f"""
        import os
        from minimind_trl import fsio
        real = os.replace
        def replace(src, dst):
            real(src, dst)
            os._exit(9)
        fsio.os.replace = replace
        with fsio.build_directory({str(target)!r}) as folder:
            (folder / "weights.txt").write_text("new")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    assert not target.exists() and aside_path(target).is_dir()
    recover_directory(target)
    assert (target / "weights.txt").read_text() == "old"
