"""Errors raised by evaluation, summary and plotting on bad input.

The CLI catches :class:`EvalError` (and the checkpoint loader's
:class:`~minimind_trl.modeling.checkpoints.CheckpointError`), prints its message on one line and exits with status 2.
"""

from __future__ import annotations


class EvalError(Exception):
    """Base class: bad input to `eval`, `summarize` or `plot` (a user error, not a bug)."""


class OutputDirNotEmptyError(EvalError):
    """The output folder already holds files; evaluation never overwrites results."""


class EvalFolderError(EvalError):
    """An eval folder lacks records.jsonl / eval_manifest.json or holds malformed records."""


class SplitMismatchError(EvalError):
    """Eval folders were made from different frozen splits (manifest hash or split name differ)."""


class QuestionSetMismatchError(EvalError):
    """Eval folders cover different question ids, so paired statistics are impossible."""


class SamplingMismatchError(EvalError):
    """Sampled eval folders were sampled at different temperatures, so sampled metrics do not compare."""
