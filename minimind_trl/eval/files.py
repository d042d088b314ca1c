"""Evaluation-output flavour of the package's file IO (:mod:`minimind_trl.fsio`): key-sorted JSON
and JSONL (so reruns are byte-identical), and a JSONL reader raising ``ValueError``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from minimind_trl import fsio
from minimind_trl.fsio import sha256_file

__all__ = ["atomic_write_text", "atomic_write_json", "atomic_write_jsonl", "read_jsonl", "sha256_file"]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then ``os.replace`` it into place."""
    fsio.write_text_atomic(path, text)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    fsio.write_json_atomic(path, obj, indent=2, sort_keys=True)


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line (keys sorted, json's default separators)."""
    fsio.write_jsonl_atomic(path, rows, sort_keys=True, compact=False)


def read_jsonl(path: str | os.PathLike, *, torn_tail: bool = False) -> list[dict]:
    """Every object of a JSONL file, through the package's one bounded reader
    (:func:`minimind_trl.fsio.read_jsonl`); a malformed line raises ``ValueError`` naming the file,
    line and field."""
    try:
        return fsio.read_jsonl(path, torn_tail=torn_tail)
    except fsio.DataFormatError as exc:
        raise ValueError(str(exc)) from None
