"""Diagnostics callback: one JSON object per optimizer step in ``RUN_DIR/metrics.jsonl``.

Callbacks get neither the trainer nor the batch, so the trainer builds each step's record
(``trainer.last_record``) and this callback, which holds a reference to the trainer, writes it
when the step is logged. Lines are flushed as they are written and the file is fsynced on close,
so a killed run loses at most its last line; on resume the run folder code cuts the file back to
the resumed checkpoint's step (:func:`truncate_metrics`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from minimind_trl.data.manifest import dumps_jsonl_row, write_text_atomic

if TYPE_CHECKING:
    from minimind_trl.trainer.grpo_trainer import MiniMindGRPOTrainer


METRIC_KEYS = (
    # position
    "step", "rollout", "update", "learning_rate",
    # the update
    "loss", "policy_loss", "kl", "grad_norm", "entropy", "num_action_tokens",
    "ratio_min", "ratio_mean", "ratio_max", "max_abs_log_ratio",
    "clip_fraction", "clip_fraction_low", "clip_fraction_high",
    # the rollout it trained on
    "reward_mean", "reward_std", "zero_std_group_fraction",
    "completion_tokens_mean", "completion_tokens_max", "action_tokens_mean", "truncation_rate",
    "tool_calls_per_trajectory", "tool_valid_per_trajectory", "tool_failures_per_trajectory",
    "tool_malformed_per_trajectory",
    "rollout_valid_rows", "rollout_action_tokens", "rollout_generated_tokens",
    # time
    "rollout_seconds", "old_logp_seconds", "update_seconds",
    "update_tokens_per_second", "generation_tokens_per_second",
)
"""Keys present in every GRPO record (docs/recipes.md describes each); objective-, reward- and
MoE-specific keys come in addition."""


def _jsonable(value: Any) -> Any:
    """Floats stay floats; NaN/inf become None (JSON has no NaN); lists are converted element-wise."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Append-only JSONL file: each line flushed, fsync on :meth:`close`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8", newline="\n")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(dumps_jsonl_row({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle.closed:
            return
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a torn last line, from a kill, is skipped)."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def truncate_metrics(path: str | os.PathLike, last_step: int) -> int:
    """Keep only records with ``step <= last_step`` (atomically); returns how many were kept."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept = [row for row in read_metrics(path) if row.get("step", 0) <= last_step]
    write_text_atomic(path, "".join(dumps_jsonl_row(row) + "\n" for row in kept))
    return len(kept)


class DiagnosticsCallback(TrainerCallback):
    """Writes ``trainer.last_record`` to ``metrics.jsonl`` once per optimizer step (main process only)."""

    def __init__(self, trainer: "MiniMindGRPOTrainer", path: str | os.PathLike):
        self.trainer = trainer
        self.path = Path(path)
        self._writer: MetricsWriter | None = None
        self._last_step = -1

    def on_log(self, args, state, control, logs=None, **kwargs):
        record = self.trainer.last_record
        if record is None or record["step"] <= self._last_step or not state.is_world_process_zero:
            return
        if self._writer is None:
            self._writer = MetricsWriter(self.path)
        self._writer.write(record)
        self._last_step = record["step"]

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EvalLogCallback(TrainerCallback):
    """Each evaluation during training (``data.eval_split`` + ``training.eval_strategy``): one line
    ``{"step", eval_*...}`` in ``eval_metrics.jsonl`` (``EVAL_METRICS_FILE``), main process only."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not metrics or not state.is_world_process_zero:
            return
        writer = MetricsWriter(self.path)
        try:
            writer.write({"step": state.global_step, **metrics})
        finally:
            writer.close()


EVAL_METRICS_FILE = "eval_metrics.jsonl"


class LogHistoryCallback(TrainerCallback):
    """For trainers without step records (SFT): each training log (``step`` + the logged figures)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._writer: MetricsWriter | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        if self._writer is None:
            self._writer = MetricsWriter(self.path)
        self._writer.write({"step": state.global_step, **logs})

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
