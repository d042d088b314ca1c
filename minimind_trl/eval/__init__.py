"""Frozen evaluation and statistics.

* :mod:`.runner` — greedy (and sampled pass@k) evaluation of a checkpoint on a frozen split;
* :mod:`.metrics` and ``tool_math_metric/`` — the local `evaluate` metric module;
* :mod:`.stats` — paired / two-level bootstrap CIs, the 2x2 interaction, pass@k;
* :mod:`.summarize` — statistics against a baseline over several eval folders;
* :mod:`.report` — summary.json / summary.md / failures files;
* :mod:`.plots` — PNG figures from metrics.jsonl and summary.json;
* :mod:`.cli` — ``minimind-trl eval | summarize | plot``.

Heavy modules (model, rollout, matplotlib) are imported only by the submodules that need them.
"""

from minimind_trl.eval.errors import (
    EvalError,
    EvalFolderError,
    OutputDirNotEmptyError,
    QuestionSetMismatchError,
    SamplingMismatchError,
    SplitMismatchError,
)
from minimind_trl.eval.stats import (
    BootstrapResult,
    bootstrap_mean_ci,
    interaction_ci,
    mean_standard_error,
    minimum_detectable_effect,
    paired_difference_ci,
    pass_at_k,
    two_level_bootstrap_ci,
)

__all__ = [
    "BootstrapResult",
    "EvalError",
    "EvalFolderError",
    "OutputDirNotEmptyError",
    "QuestionSetMismatchError",
    "SamplingMismatchError",
    "SplitMismatchError",
    "bootstrap_mean_ci",
    "interaction_ci",
    "mean_standard_error",
    "minimum_detectable_effect",
    "paired_difference_ci",
    "pass_at_k",
    "two_level_bootstrap_ci",
]
