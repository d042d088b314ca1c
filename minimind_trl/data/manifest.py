"""Hashes and atomic writes: the audit trail shared by data preparation, training and evaluation.

Every file that matters is written to a temporary file in the destination folder, flushed to disk,
then moved into place with :func:`os.replace`, so a reader never sees a half-written file and a
crash leaves the previous version intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from minimind_trl.data.validation import DataFormatError, read_json_file

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


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept, trailing newline) atomically."""
    return write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def dumps_jsonl_row(row: Any) -> str:
    """One JSONL line (no newline): compact separators, non-ASCII kept, key order preserved."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[Any]) -> Path:
    """Write one compact JSON object per line atomically (see :func:`dumps_jsonl_row`)."""
    return write_text_atomic(path, "".join(dumps_jsonl_row(row) + "\n" for row in rows))


def verify_manifest(folder: str | os.PathLike, manifest_name: str = "manifest.json") -> dict:
    """Check that every file listed under the manifest's ``"outputs"`` has its recorded SHA-256.

    Returns the manifest. Raises ``ValueError`` naming the first file that is missing or differs,
    :class:`~minimind_trl.data.validation.DataFormatError` for a malformed manifest.
    """
    folder = Path(folder)
    manifest_path = folder / manifest_name
    manifest = read_json_file(manifest_path)
    outputs = manifest.get("outputs") if isinstance(manifest, dict) else None
    if not isinstance(outputs, dict) or not outputs:
        raise DataFormatError(manifest_path, None, "outputs",
                              "is missing or empty (a manifest is an object listing its outputs)")
    for name, record in outputs.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise DataFormatError(manifest_path, None, f"outputs.{name}", "must be a plain file name in the folder")
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            raise DataFormatError(manifest_path, None, f"outputs.{name}.sha256", "must be a hex string")
        file_path = folder / name
        if not file_path.is_file():
            raise ValueError(f"{manifest_path}: listed output {name!r} does not exist")
        actual = sha256_file(file_path)
        if actual != record["sha256"]:
            raise ValueError(f"{manifest_path}: {name} has sha256 {actual}, manifest records {record['sha256']}")
    return manifest
