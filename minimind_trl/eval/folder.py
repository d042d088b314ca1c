"""The eval-folder format written by ``minimind-trl eval`` (:mod:`minimind_trl.eval.runner`) and read
by ``summarize``, the sweep and the demo::

    records.jsonl        one record per question, in split order (keys: runner.build_record)
    metrics.json         the evaluate module's numbers (plus pass@k)
    eval_manifest.json   checkpoint and tokenizer SHA-256, split, decoding settings, versions,
                         SHA-256 of the two files above (written last)

The folder is built in ``.staging-NAME`` beside it and committed whole
(:func:`minimind_trl.fsio.build_directory`), so it exists complete or not at all; a folder holding
``eval_manifest.json`` is a finished evaluation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimind_trl.fsio import DataFormatError, read_json_file

RECORDS = "records.jsonl"
METRICS = "metrics.json"
EVAL_MANIFEST = "eval_manifest.json"
OUTPUTS = (RECORDS, METRICS)  # hashed in the manifest's "outputs"


@dataclass(frozen=True)
class EvalFolder:
    """One eval folder (it need not exist yet)."""

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def manifest_path(self) -> Path:
        return self.path / EVAL_MANIFEST

    def is_empty(self) -> bool:
        """Missing, or an empty folder."""
        return not self.path.exists() or (self.path.is_dir() and not any(self.path.iterdir()))

    def is_complete(self) -> bool:
        """A finished evaluation (its manifest, written last, is there)."""
        return self.manifest_path.is_file()

    def manifest(self) -> dict[str, Any] | None:
        """``eval_manifest.json`` as a dict; None when it is missing or not a readable JSON object."""
        try:
            manifest = read_json_file(self.manifest_path)
        except (OSError, DataFormatError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def checkpoint_sha256(self) -> str | None:
        """The SHA-256 of the weights that were evaluated (None without a manifest)."""
        return ((self.manifest() or {}).get("checkpoint") or {}).get("sha256")
