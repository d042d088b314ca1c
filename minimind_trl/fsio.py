"""Ground-floor file IO: the one bounded JSON/JSONL reader, atomic file writes, the metrics-file
appender, SHA-256 of files, and the one atomic directory commit. Imports nothing from the package.

Reading. Every JSONL file is read through :func:`iter_jsonl` (JSON documents through
:func:`read_json_file`) with fixed bounds: a line of at most :data:`MAX_LINE_BYTES` (longer lines
are skipped unread), nesting of at most :data:`MAX_JSON_DEPTH`, no lone surrogates, integers
Python can read; invalid UTF-8 is an error, a byte-order mark opening the file and CRLF line ends
are accepted. A problem raises :class:`DataFormatError` naming the file, the 1-based line and the
field. The error classes live here, not in ``data/validation.py`` (which adds the task-row schema
on top of them), because the reader raises them and this module must not import upward.

Writing files. :func:`write_text_atomic` writes a temporary file in the destination folder, flushes
and fsyncs it, then moves it into place with :func:`os.replace`: a reader never sees a half-written
file and a crash leaves the previous version. :class:`JsonlAppender` is the append-only writer of
``metrics.jsonl``-style files (each line flushed, fsync on close; a torn last line left by a killed
writer is cut off before appending).

Writing folders. :func:`commit_directory` puts a fully built folder at its target path::

    .staging-NAME/          built here (see :func:`build_directory`), every file and folder fsynced
    NAME -> .old-NAME       the previous folder moved aside (rename 1)
    .staging-NAME -> NAME   the new folder moved in         (rename 2)
    .old-NAME removed

A kill at any point leaves the old folder or the new one at ``NAME`` (between the renames, the old
one under ``.old-NAME``); :func:`recover_directory`, run by the next commit and by readers such as
the run folder, moves a lone ``.old-NAME`` back and deletes one whose replacement is in place. One
writer per target at a time. Both names are hidden and do not match ``checkpoint-*`` globs.

Locks. :func:`lock_folder` gives one process at a time a run, demo, sweep, eval or export target: an
``flock`` on ``.NAME.lock`` beside it, holding the holder's pid and command, removed on release. The
kernel drops the lock when the process dies, so a lock left by a killed run is taken over (and says
so); a live holder is named in :class:`FolderInUseError`. The lock file is opened with
``O_NOFOLLOW`` and must be a regular file; any path that cannot be one is a one-line
:class:`FolderLockError`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------- errors


class DataError(Exception):
    """A data problem the user must fix (bad arguments, a non-empty output folder, ...)."""


FAILURE_KINDS = ("encoding", "too_long", "json", "too_deep", "number", "surrogate", "schema", "duplicate_id")
"""Kinds of malformed rows (``DataFormatError.kind``), counted per kind by ``--skip-invalid``."""


class DataFormatError(DataError):
    """A malformed row: carries ``path``, ``line`` (1-based, or None), ``field`` and ``kind`` (one
    of :data:`FAILURE_KINDS`)."""

    def __init__(self, path: str | os.PathLike | None, line: int | None, field: str, message: str,
                 kind: str = "schema"):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field if len(field) <= 200 else field[:200] + "..."  # hostile keys stay one short line
        self.reason = message
        self.kind = kind
        where = self.path or "<row>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: field '{self.field}': {message}")


# --------------------------------------------------------------------------------------------- reading

MAX_LINE_BYTES = 1 << 20
"""A JSONL row (one line, line end included) may hold at most 1 MiB; a longer line is refused
unread (a task row is a few KB; a 50 MB line would otherwise cost ~12x its size in memory)."""
MAX_JSON_DEPTH = 32
"""Arrays and objects may nest at most 32 deep, in a row and in the JSON strings it carries
(``tools``, ``tool_calls``); deeper input is refused before Python's recursion limit is met."""
MAX_JSON_FILE_BYTES = 16 << 20
"""A whole JSON document (a split or eval manifest, ``metrics.json``) may hold at most 16 MiB."""


def _physical_lines(path: str | os.PathLike, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """``(line_number, raw)`` for every line; ``raw`` is None for a line over ``max_bytes``, whose
    bytes are skipped in bounded chunks, never held."""
    with open(path, "rb") as handle:
        number = 0
        while True:
            raw = handle.readline(max_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_bytes:
                while raw and not raw.endswith(b"\n"):
                    raw = handle.readline(1 << 16)
                raw = None
            yield number, raw


def iter_jsonl_lines(path: str | os.PathLike, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(line_number, raw_bytes)`` for every non-blank line (blank lines are not rows);
    ``raw_bytes`` is None for a line longer than ``max_bytes`` (:func:`parse_jsonl_line` refuses it)."""
    for number, raw in _physical_lines(path, max_bytes):
        if raw is None or raw.strip():
            yield number, raw


def count_blank_lines(path: str | os.PathLike) -> int:
    """Number of whitespace-only lines in a file (they are not rows)."""
    return sum(1 for _, raw in _physical_lines(path, MAX_LINE_BYTES) if raw is not None and not raw.strip())


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_json_value(value: Any, path=None, line=None, field: str = "<row>") -> Any:
    """Walk a parsed JSON value without recursion: nesting beyond :data:`MAX_JSON_DEPTH` and a
    lone surrogate (``"\\ud800"``) in a string or key raise :class:`DataFormatError` naming the
    field; returns ``value``."""
    stack = [(value, field, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                raise DataFormatError(path, line, where, "holds a lone surrogate (not encodable as UTF-8)", "surrogate")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise DataFormatError(path, line, where, f"nests deeper than {MAX_JSON_DEPTH} levels", "too_deep")
        prefix = "" if where == "<row>" else where
        if isinstance(item, list):
            stack.extend((child, f"{prefix}[{index}]", depth + 1) for index, child in enumerate(item))
            continue
        for key, child in item.items():
            name = f"{prefix}.{key}" if prefix else key
            if _has_surrogate(key):
                raise DataFormatError(path, line, where, "has a key holding a lone surrogate", "surrogate")
            stack.append((child, name, depth + 1))
    return value


def loads_json(text: str, path=None, line=None, field: str = "<json>") -> Any:
    """``json.loads`` for untrusted text: every failure (bad JSON, nesting that would exhaust the
    recursion limit, an integer of over 4300 digits, a lone surrogate) is a :class:`DataFormatError`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        raise DataFormatError(path, line, field, f"not valid JSON ({exc.msg} at {where})", "json") from None
    except RecursionError:
        raise DataFormatError(path, line, field, f"nests deeper than {MAX_JSON_DEPTH} levels", "too_deep") from None
    except ValueError:  # int("1" * 5000): over Python's integer-string conversion limit
        raise DataFormatError(path, line, field, f"holds an integer of more than {sys.get_int_max_str_digits()} digits",
                              "number") from None
    return check_json_value(value, path, line, "<row>" if field == "<json>" else field)


def parse_jsonl_line(raw: bytes | None, path: str | os.PathLike | None, line: int | None) -> Any:
    """Decode one JSONL line; an over-long line, bad UTF-8 or invalid JSON raise
    :class:`DataFormatError` (field ``<json>``). A UTF-8 byte-order mark opening the file and
    CRLF line ends are accepted."""
    if raw is None:
        raise DataFormatError(path, line, "<json>", f"line is longer than {MAX_LINE_BYTES} bytes", "too_long")
    try:
        text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, line, "<json>", f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                              "encoding") from None
    return loads_json(text, path, line)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_value)`` for every non-blank line of a UTF-8 JSONL file, through
    the bounds above; the first malformed line raises :class:`DataFormatError`. Every command that
    reads JSONL (``data prepare`` / ``gold``, ``train``, ``eval``, ``summarize``, ``plot``) reads it here."""
    for number, raw in iter_jsonl_lines(path):
        yield number, parse_jsonl_line(raw, path, number)


def _require_object(row: Any, path, number: int) -> dict:
    if not isinstance(row, dict):
        raise DataFormatError(path, number, "<row>", f"must be a JSON object, got {type(row).__name__}")
    return row


def iter_jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """:func:`iter_jsonl` for files whose every row must be a JSON object."""
    for number, row in iter_jsonl(path):
        yield number, _require_object(row, path, number)


def read_jsonl(path: str | os.PathLike, *, torn_tail: bool = False) -> list[dict]:
    """Every row of a JSONL file of objects (:func:`iter_jsonl_objects`).

    ``torn_tail=True`` is for files an appender may have been killed writing (``metrics.jsonl``):
    a malformed last line without its line end is dropped instead of raising. Any other malformed
    line raises :class:`DataFormatError`.
    """
    rows = []
    for number, raw in iter_jsonl_lines(path):
        try:
            rows.append(_require_object(parse_jsonl_line(raw, path, number), path, number))
        except DataFormatError:
            if torn_tail and raw is not None and not raw.endswith(b"\n"):
                break  # only the last line of a file can lack its line end
            raise
    return rows


def read_json_file(path: str | os.PathLike, max_bytes: int = MAX_JSON_FILE_BYTES) -> Any:
    """One JSON document (a manifest, ``metrics.json``), with the same bounds as a row; a file over
    ``max_bytes``, an empty file or bad UTF-8 raise :class:`DataFormatError` naming the file."""
    size = os.path.getsize(path)
    if size > max_bytes:
        raise DataFormatError(path, None, "<json>", f"file is larger than {max_bytes} bytes", "too_long")
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, "<json>", f"file is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                              "encoding") from None
    if not text.strip():
        raise DataFormatError(path, None, "<json>", "file is empty", "json")
    return loads_json(text, path, None)


# -------------------------------------------------------------------------------------------- hashing

_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -------------------------------------------------------------------------------------- writing files


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp_name, 0o666 & ~current_umask())  # mkstemp makes 0600; give a normal file's mode
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    return target


def dumps_json(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """A JSON document as written to disk: UTF-8 text, non-ASCII kept, trailing newline."""
    return json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=sort_keys) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2, *, sort_keys: bool = False) -> Path:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept, trailing newline) atomically."""
    return write_text_atomic(path, dumps_json(obj, indent=indent, sort_keys=sort_keys))


def dumps_jsonl_row(row: Any, *, sort_keys: bool = False, compact: bool = True) -> str:
    """One JSONL line (no newline), non-ASCII kept. ``compact``: ``","``/``":"`` separators (data
    and metrics files); else json's default ``", "``/``": "`` (evaluation records). ``sort_keys``
    makes reruns byte-identical whatever the dict order; by default key order is preserved."""
    separators = (",", ":") if compact else None
    return json.dumps(row, ensure_ascii=False, separators=separators, sort_keys=sort_keys)


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[Any], *, sort_keys: bool = False,
                       compact: bool = True) -> Path:
    """Write one JSON value per line atomically (see :func:`dumps_jsonl_row`)."""
    return write_text_atomic(path, "".join(dumps_jsonl_row(row, sort_keys=sort_keys, compact=compact) + "\n"
                                           for row in rows))


def _cut_torn_tail(path: Path) -> None:
    """Truncate a file whose last line lacks its line end back to its last complete line."""
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        position = size
        while position > 0:  # scan back in chunks for the last line end
            start = max(0, position - (1 << 16))
            handle.seek(start)
            chunk = handle.read(position - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                return
            position = start
        handle.truncate(0)


class JsonlAppender:
    """Append-only JSONL file (``metrics.jsonl``): one compact line per :meth:`write`, flushed as
    written, fsynced on :meth:`close`, so a killed writer loses at most its last line. Opening a
    file whose last line is torn (no line end) first cuts that line off, so the next row does not
    join it. Usable as a context manager."""

    def __init__(self, path: str | os.PathLike, *, sort_keys: bool = False):
        self.path = Path(path)
        self.sort_keys = sort_keys
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            _cut_torn_tail(self.path)
        self._handle = open(self.path, "a", encoding="utf-8", newline="\n")

    def write(self, row: Any) -> None:
        self._handle.write(dumps_jsonl_row(row, sort_keys=self.sort_keys) + "\n")
        self._handle.flush()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def close(self) -> None:
        if self._handle.closed:
            return
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ------------------------------------------------------------------------------------ writing folders


def staging_path(target: str | os.PathLike) -> Path:
    """Where a new ``target`` folder is built: ``.staging-NAME`` beside it (same file system, so
    the commit is a rename)."""
    target = Path(target)
    return target.with_name(f".staging-{target.name}")


def aside_path(target: str | os.PathLike) -> Path:
    """Where the previous ``target`` folder waits during a commit: ``.old-NAME`` beside it."""
    target = Path(target)
    return target.with_name(f".old-{target.name}")


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder's entry table (makes renames and new names in it durable)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file and every folder under ``folder`` (deepest first), ``folder`` included."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(root)


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder (or file) if present; a missing path is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def recover_directory(target: str | os.PathLike) -> Path | None:
    """Finish a commit that was killed: a ``.old-NAME`` with no ``NAME`` (killed between the two
    renames) is moved back to ``NAME``; one whose replacement is in place is deleted. Returns
    ``target`` if it exists afterwards, else None. A leftover staging folder is left alone (the
    next :func:`build_directory` empties it)."""
    target = Path(target)
    aside = aside_path(target)
    if aside.exists():
        if target.exists():
            remove_tree(aside)
        else:
            os.replace(aside, target)
            fsync_dir(target.parent)
    return target if target.exists() else None


def commit_directory(staged: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Make the fully written folder ``staged`` the folder ``target`` (see the module docstring).

    ``staged`` must lie on ``target``'s file system (normally :func:`staging_path`). Every file and
    folder in it is fsynced first; an existing ``target`` is moved aside, ``staged`` moved in, and
    the old folder deleted. If moving the new folder in fails, the old one is moved back and the
    error raised. Returns ``target``.
    """
    staged, target = Path(staged), Path(target)
    if not staged.is_dir():
        raise FileNotFoundError(f"commit_directory: {staged} is not a folder")
    recover_directory(target)
    fsync_tree(staged)
    aside = aside_path(target)
    if target.exists():
        os.replace(target, aside)
        try:
            os.replace(staged, target)
        except OSError:
            os.replace(aside, target)  # put the previous folder back
            raise
        fsync_dir(target.parent)
        remove_tree(aside)
    else:
        os.replace(staged, target)
    fsync_dir(target.parent)
    return target


@contextmanager
def build_directory(target: str | os.PathLike) -> Iterator[Path]:
    """``with build_directory(target) as folder:`` write the new folder's files into ``folder``
    (an empty :func:`staging_path`, made with the umask's modes); on a clean exit it is committed
    to ``target`` (:func:`commit_directory`), on an error it is deleted and ``target`` untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(target)
    remove_tree(staging)
    staging.mkdir()
    try:
        yield staging
        commit_directory(staging, target)
    finally:
        if staging.exists():
            remove_tree(staging)


# ------------------------------------------------------------------------------------------- locks


class FolderLockError(RuntimeError):
    """The folder's lock cannot be taken (:func:`lock_folder`): the message is one line naming the lock file."""


class FolderInUseError(FolderLockError):
    """Another live process holds the folder's lock (:func:`lock_folder`)."""


_HELD: dict[Path, tuple[int, int]] = {}  # resolved folder -> (lock file descriptor, depth)


def lock_path(folder: str | os.PathLike) -> Path:
    """The lock file of ``folder``: ``.NAME.lock`` beside it, so a run folder's own layout (a new
    run needs it empty) is untouched."""
    folder = Path(folder).resolve()
    return folder.parent / f".{folder.name}.lock"


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {int(info['pid'])} ({info.get('command', '?')}, since {info.get('since', '?')})"
    except (ValueError, KeyError, TypeError):
        return "another process"


_LOCK_ATTEMPTS = 8  # a lock file unlinked by its releaser between our open and flock is opened again


def _open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if missing), never through a symlink
    (``O_NOFOLLOW``) and never anything but a regular file; a path that cannot be one raises a
    one-line :class:`FolderLockError` naming it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FolderLockError(f"lock file {path} is a symlink; refusing to follow it (remove it)") from None
        if exc.errno == errno.EISDIR:
            raise FolderLockError(f"lock file {path} is a folder, not a regular file (remove it)") from None
        raise FolderLockError(f"cannot create lock file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderLockError(f"lock file {path} is not a regular file (a FIFO, a device, ...); remove it")
    return fd


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a releaser may have unlinked it)."""
    try:
        on_disk, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _flocked(path: Path, key: Path) -> int:
    """A descriptor of ``path`` holding its exclusive ``flock``; the file it names is the one locked."""
    for _ in range(_LOCK_ATTEMPTS):
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            raise FolderInUseError(f"{key} is in use by {_holder(previous)}; wait for it to finish or stop it "
                                   f"(lock file {path})") from None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder released it and removed the file meanwhile: lock the new one
    raise FolderLockError(f"lock file {path} keeps being replaced; another process is taking and releasing it")


def lock_folder(folder: str | os.PathLike, command: str) -> None:
    """Take the exclusive lock of ``folder`` for this process (``flock`` on :func:`lock_path`,
    released by :func:`unlock_folder` or when the process dies, even by kill -9). Re-entrant within
    one process. A lock held by a live process raises :class:`FolderInUseError` naming the holder; a
    lock file left by a dead one is taken over, and a line on stderr says so. A lock path that is a
    symlink (never followed), a folder, a FIFO or in a folder this process cannot write, and the
    root folder, raise :class:`FolderLockError` (one line)."""
    key = Path(folder).resolve()
    if key in _HELD:
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        return
    if key.parent == key:
        raise FolderLockError(f"{key}: the root folder is never a command's folder")
    path = lock_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FolderLockError(f"cannot create lock file {path}: {exc.strerror or exc}") from None
    fd = _flocked(path, key)
    previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    if previous.strip():
        print(f"note: {key}: took over the lock of {_holder(previous)}, which is no longer running", file=sys.stderr)
    record = json.dumps({"pid": os.getpid(), "command": command,
                         "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    _HELD[key] = (fd, 1)


def unlock_folder(folder: str | os.PathLike) -> None:
    """Release one :func:`lock_folder` of this process; at the last, the lock file is removed
    (while still locked, so a process waiting on the old file opens the path again)."""
    key = Path(folder).resolve()
    if key not in _HELD:
        return
    fd, depth = _HELD.pop(key)
    if depth > 1:
        _HELD[key] = (fd, depth - 1)
        return
    path = lock_path(key)
    if _same_file(fd, path):
        path.unlink(missing_ok=True)
    os.close(fd)


@contextmanager
def folder_lock(folder: str | os.PathLike, command: str) -> Iterator[None]:
    """``with folder_lock(folder, "minimind-trl demo"):`` — :func:`lock_folder` for the block."""
    lock_folder(folder, command)
    try:
        yield
    finally:
        unlock_folder(folder)
