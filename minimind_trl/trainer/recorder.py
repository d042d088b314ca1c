"""The step recorder: one JSON object per optimizer step in ``RUN_DIR/metrics.jsonl``.

The GRPO trainer builds each step's record (keys: :mod:`minimind_trl.metric_names`) and pushes
it into a :class:`StepRecorder`; nothing here looks at the trainer. Lines are flushed as they
are written and the file is fsynced on close, so a killed run loses at most its last line; on
resume the run folder code cuts the file back to the resumed checkpoint's step
(:func:`truncate_metrics`). Non-finite floats are written as ``null`` (JSON has no NaN). Writing
and reading go through :mod:`minimind_trl.fsio` (``JsonlAppender``, ``read_jsonl``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from minimind_trl.fsio import JsonlAppender, read_jsonl, write_jsonl_atomic
from minimind_trl.metric_names import STEP


def jsonable(value: Any) -> Any:
    """Floats stay floats; NaN/inf become None (JSON has no NaN); lists are converted element-wise."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


class MetricsWriter(JsonlAppender):
    """:class:`~minimind_trl.fsio.JsonlAppender` of records whose values go through :func:`jsonable`
    (one compact line per record, flushed; fsync on close)."""

    def write(self, record: dict[str, Any]) -> None:
        super().write({k: jsonable(v) for k, v in record.items()})


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a torn last line, from a kill, is skipped)."""
    return read_jsonl(path, torn_tail=True)


def truncate_metrics(path: str | os.PathLike, last_step: int) -> int:
    """Keep only records with ``step <= last_step`` (atomically); returns how many were kept."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept = [row for row in read_metrics(path) if row.get(STEP, 0) <= last_step]
    write_jsonl_atomic(path, kept)
    return len(kept)


class StepRecorder:
    """Appends the step records pushed into it to ``path`` (opened on the first record).

    A record whose ``step`` is not after the last one written is ignored, so a step is written
    once. The trainer pushes only on the main process and closes the recorder when training ends.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._writer: MetricsWriter | None = None
        self._last_step = -1

    def record(self, row: dict[str, Any]) -> bool:
        """Append ``row`` (a record with a ``step``); returns whether it was written."""
        if row[STEP] <= self._last_step:
            return False
        if self._writer is None:
            self._writer = MetricsWriter(self.path)
        self._writer.write(row)
        self._last_step = row[STEP]
        return True

    def close(self) -> None:
        """Flush and fsync; a later :meth:`record` reopens the file for appending."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
