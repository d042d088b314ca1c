"""Callbacks that write training logs of stock TRL trainers (SFT, DPO, distillation) and evaluations.

They use only what the callback API hands them (``logs``, ``metrics``, ``state``); the GRPO
trainer's per-step records do not go through a callback: the trainer pushes them into
:class:`minimind_trl.trainer.recorder.StepRecorder`.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback

from minimind_trl.metric_names import LOSS, STEP
from minimind_trl.trainer.recorder import MetricsWriter

__all__ = [
    "EVAL_METRICS_FILE",
    "EvalLogCallback",
    "LogHistoryCallback",
]


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
            writer.write({STEP: state.global_step, **metrics})
        finally:
            writer.close()


EVAL_METRICS_FILE = "eval_metrics.jsonl"


class LogHistoryCallback(TrainerCallback):
    """For trainers without step records (SFT): each training log (``step`` + the logged figures)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._writer: MetricsWriter | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or LOSS not in logs or not state.is_world_process_zero:
            return
        if self._writer is None:
            self._writer = MetricsWriter(self.path)
        self._writer.write({STEP: state.global_step, **logs})

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
