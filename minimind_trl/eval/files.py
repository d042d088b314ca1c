"""Small file helpers for evaluation outputs: key-sorted JSON / JSONL (so reruns are byte-identical)
on top of the package's atomic writer and SHA-256 (``minimind_trl.data.manifest``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from minimind_trl.data.manifest import sha256_file, write_text_atomic
from minimind_trl.data.validation import DataFormatError, iter_jsonl_objects

__all__ = ["atomic_write_text", "atomic_write_json", "atomic_write_jsonl", "read_jsonl", "sha256_file"]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then ``os.replace`` it into place."""
    write_text_atomic(path, text)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line (keys sorted, so reruns are byte-identical)."""
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file of objects through the data package's bounded reader
    (:func:`minimind_trl.data.validation.iter_jsonl`); a malformed line raises ``ValueError``
    naming the file, line and field."""
    try:
        return [row for _, row in iter_jsonl_objects(path)]
    except DataFormatError as exc:
        raise ValueError(str(exc)) from None
