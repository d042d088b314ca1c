"""Output targets: the one rule every command checks before it writes a folder or a file.

``export``, ``eval``, ``summarize``, ``plot``, ``data``, ``train``, ``sweep`` and ``demo`` ask
:func:`check_output_folder` (or :func:`check_output_file`) before they write anything, and the
writers that build a folder beside its target and swap it in (``export``, ``eval``) hold the
target's lock while they write (:func:`writing`). A target is refused, with a one-line
:class:`OutputTargetError` naming it, when it

* is the root folder, the home folder or a folder above the home folder;
* lies under a file (some folder on its path is a file), or is a symlink;
* is one of the command's inputs, holds one (a folder above it), or lies inside an input folder;
* (a folder) holds the record of a run, split, evaluation, sweep or demo (:data:`MARKERS`) that
  the command does not own (``own``): such a folder is never written over;
* (a folder) is not empty and not an earlier output of the same command (its ``reuse`` test,
  e.g. an earlier export of the same format); that case raises :class:`TargetNotEmptyError`;
* (a file) is a folder, bears a record's name (``manifest.json`` ...), or would replace a file
  of a folder that holds a record (adding a new file beside them is allowed).

The lock is :func:`minimind_trl.fsio.lock_folder` on the target, so a second writer into the same
target is refused (:class:`~minimind_trl.fsio.FolderInUseError`) instead of sharing its staging folder.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from minimind_trl.fsio import folder_lock
from minimind_trl.run_folder import MANIFEST

MARKERS: dict[str, str] = {
    MANIFEST: "a run or split manifest",
    "eval_manifest.json": "an evaluation's manifest",
    "sweep-*.json": "a sweep's record",
    "timings.json": "a demo's record",
}
"""File-name pattern -> what it marks: a folder holding one belongs to the command that wrote it."""

Reuse = Callable[[Path], bool]


class OutputTargetError(ValueError):
    """A command's output target must not be written (one line naming it and why)."""


class TargetNotEmptyError(OutputTargetError):
    """The output folder is not empty and not an earlier output of the same command."""


def _markers(folder: Path, own: Iterable[str], target: Path) -> list[tuple[str, str]]:
    """(file name, what it marks) for every record in ``folder`` that is not one of ``own``."""
    mine = set(own)
    found = []
    for name in _entries(folder, target):
        for pattern, what in MARKERS.items():
            if pattern not in mine and fnmatch.fnmatchcase(name, pattern):
                found.append((name, what))
    return found


def _resolved(target: Path) -> Path:
    """``target`` made absolute with its links followed; a link loop is a one-line error."""
    try:
        return target.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (pathlib)
        raise OutputTargetError(f"{target}: cannot resolve it ({exc})") from None


def _entries(folder: Path, target: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        raise OutputTargetError(f"{target}: cannot list it ({exc.strerror or exc})") from None


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return None


def _check_place(target: Path, path: Path) -> None:
    """Root, home, symlink and under-a-file checks shared by folders and files (``path``: resolved)."""
    home = _home()
    if path.parent == path or (home is not None and (path == home or path in home.parents)):
        raise OutputTargetError(f"{target}: the root folder, the home folder and the folders above it are never "
                                "an output; name a folder of its own")
    if target.is_symlink():
        raise OutputTargetError(f"{target} is a symlink; name the real path ({path})")
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise OutputTargetError(f"{target}: {parent} is a file, so nothing can be written under it")
            return


def _check_sources(target: Path, path: Path, sources: Iterable[str | os.PathLike]) -> None:
    """Refuse an output that is an input, holds one, or lies inside an input folder."""
    for source in sources:
        src = _resolved(Path(source))
        same = path == src or (path.exists() and src.exists() and os.path.samefile(path, src))
        if same:
            raise OutputTargetError(f"{target} is this command's input; write the output elsewhere")
        if path in src.parents:
            raise OutputTargetError(f"{target} holds this command's input {source}; write the output elsewhere")
        if src.is_dir() and src in path.parents:
            raise OutputTargetError(f"{target} lies inside this command's input folder {source}; write the output "
                                    "elsewhere")


def check_output_folder(target: str | os.PathLike, *, sources: Iterable[str | os.PathLike] = (),
                        own: Iterable[str] = (), reuse: Reuse | None = None, expect: str = "") -> Path:
    """``target`` as a folder a command may fill or replace (module docstring); returns it.

    ``own``: :data:`MARKERS` patterns the command itself writes there (``train`` its manifest,
    ``sweep`` its record). ``reuse(folder)``: whether a non-empty folder is an earlier output of
    the same command (None: only a missing or empty folder); ``expect`` says what it accepts, for
    the message (e.g. "an earlier minimind export")."""
    target = Path(target)
    path = _resolved(target)
    _check_place(target, path)
    _check_sources(target, path, sources)
    if not path.exists():
        return target
    if not path.is_dir():
        raise OutputTargetError(f"{target} is a file, not a folder")
    found = _markers(path, own, target)
    if found:
        name, what = found[0]
        raise OutputTargetError(f"{target} holds {what} ({name}); it is never written over: choose a new folder")
    if _entries(path, target) and (reuse is None or not reuse(path)):
        tail = f" and not {expect}" if expect else ""
        raise TargetNotEmptyError(f"{target} is not empty{tail}; choose a new or empty folder")
    return target


def check_output_file(target: str | os.PathLike, *, sources: Iterable[str | os.PathLike] = (),
                      reuse: Reuse | None = None, expect: str = "") -> Path:
    """``target`` as a file a command may write (module docstring); returns it. ``reuse(file)``:
    whether an existing file may be replaced (None: any file outside a folder holding a record)."""
    target = Path(target)
    path = _resolved(target)
    _check_place(target, path)
    _check_sources(target, path, sources)
    if path.is_dir():
        raise OutputTargetError(f"{target} is a folder; name a file")
    for pattern, what in MARKERS.items():
        if fnmatch.fnmatchcase(path.name, pattern):
            raise OutputTargetError(f"{target} bears the name of {what}; choose another file name")
    if not path.exists():
        return target
    found = _markers(path.parent, (), target) if path.parent.is_dir() else []
    if found:
        name, what = found[0]
        raise OutputTargetError(f"{target} belongs to a folder that holds {what} ({name}); it is never written over")
    if reuse is not None and not reuse(path):
        raise OutputTargetError(f"{target} exists and is not {expect or 'a file this command writes'}; "
                                "choose a new file")
    return target


@contextmanager
def writing(target: str | os.PathLike, command: str, *, folder: bool = True,
            sources: Iterable[str | os.PathLike] = (), own: Iterable[str] = (), reuse: Reuse | None = None,
            expect: str = "") -> Iterator[Path]:
    """``with writing(target, "minimind-trl export", ...):`` check ``target`` (a folder, or a file
    with ``folder=False``), then hold its lock for the block."""
    sources = list(sources)
    if folder:
        check_output_folder(target, sources=sources, own=own, reuse=reuse, expect=expect)
    else:
        check_output_file(target, sources=sources, reuse=reuse, expect=expect)
    with folder_lock(target, command):
        yield Path(target)
