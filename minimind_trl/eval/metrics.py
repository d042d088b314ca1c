"""Per-question evaluation records → metric numbers.

Aggregates go through the local `evaluate` module in ``tool_math_metric/`` (loaded by path,
offline). Summaries need the same numbers *per question* (the bootstrap resamples questions), so
:data:`PER_QUESTION_METRICS` maps each summarised metric to its per-question value; the mean over
questions of that value equals the metric module's number of the same name (``sampled_pass@1``:
its ``pass_at_k`` config's ``pass@1``, since pass@1 = c / n). A metric whose record key is listed
in :data:`OPTIONAL_RECORD_KEYS` is summarised only when every record holds that key.

:func:`n_gt` (the number of ground-truth values of a question) and :data:`BY_N_GT_METRICS` define
the by-n_gt subsets: ``task_success[n_gt=2]`` is ``task_success`` over the questions with two GT
values (:func:`subset_metric_name`), as the metric module's ``by_n_gt``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import evaluate
import numpy as np

METRIC_DIR = Path(__file__).resolve().parent / "tool_math_metric"

# Keys every record must carry for metrics and summaries.
REQUIRED_RECORD_KEYS = ("id", "success", "all_gt_covered", "gt_hits", "n_tool_calls", "answer_length")


def n_gt(record: dict) -> int:
    """Number of ground-truth values of the question (= ``len(gt)``, the record's ``n_gt``)."""
    return len(record["gt_hits"])


def _coverage(record: dict) -> float:
    hits = record["gt_hits"]
    return sum(bool(h) for h in hits) / len(hits)


def _sampled_pass_at_1(record: dict) -> float:
    samples = record["samples"]
    return samples["num_correct"] / samples["n"]


PER_QUESTION_METRICS: dict[str, Callable[[dict], float]] = {
    "task_success": lambda r: float(bool(r["success"])),
    "all_gt_coverage": lambda r: float(bool(r["all_gt_covered"])),
    "macro_gt_coverage": _coverage,
    "tool_call_rate": lambda r: float(r["n_tool_calls"] > 0),
    "tool_count_match": lambda r: float(r["n_tool_calls"] == n_gt(r)),
    "mean_tool_calls": lambda r: float(r["n_tool_calls"]),
    "mean_answer_length": lambda r: float(r["answer_length"]),
    # malformed tool calls of the greedy trajectory (rule: envs.protocol.turn_malformed_calls)
    "mean_malformed_calls": lambda r: float(r["malformed_calls"]),
    # sampled success rate at the eval's --temperature: num_correct / n samples (unbiased pass@1)
    "sampled_pass@1": _sampled_pass_at_1,
}
# Metric -> the record key it needs beyond REQUIRED_RECORD_KEYS (absent in some records).
OPTIONAL_RECORD_KEYS = {"mean_malformed_calls": "malformed_calls", "sampled_pass@1": "samples"}
# Metrics also tabled per number of GT values.
BY_N_GT_METRICS = ("task_success",)


def subset_metric_name(metric: str, k: int) -> str:
    """The table name of ``metric`` over the questions with ``k`` GT values: ``metric[n_gt=k]``."""
    return f"{metric}[n_gt={k}]"


def load_tool_math_metric(config_name: str = "default"):
    """Load the tool-math `evaluate.Metric` from its local folder (no network, in memory)."""
    return evaluate.load(str(METRIC_DIR), config_name, keep_in_memory=True)


def metric_inputs(records: Sequence[dict]) -> dict[str, list]:
    """The metric module's ``compute`` columns (config "default") from evaluation records."""
    return {
        "success": [int(bool(r["success"])) for r in records],
        "all_gt_covered": [int(bool(r["all_gt_covered"])) for r in records],
        "gt_hits": [[bool(h) for h in r["gt_hits"]] for r in records],
        "n_tool_calls": [int(r["n_tool_calls"]) for r in records],
        "valid_calls": [int(r["valid_calls"]) for r in records],
        "failed_calls": [int(r["failed_calls"]) for r in records],
        "malformed_calls": [int(r["malformed_calls"]) for r in records],
        "num_turns": [int(r["num_turns"]) for r in records],
        "answer_length": [int(r["answer_length"]) for r in records],
        "op_type": [str(r.get("op_type", "unknown")) for r in records],
    }


def compute_metrics(records: Sequence[dict], pass_k: Sequence[int] = ()) -> dict:
    """The metric module's numbers for ``records``; adds ``pass@k`` when records hold samples.

    Records with a ``samples`` entry (``{"n": int, "num_correct": int, ...}``) feed the
    ``pass_at_k`` config for every k in ``pass_k``.
    """
    if not records:
        raise ValueError("no records to score")
    result = load_tool_math_metric().compute(**metric_inputs(records))
    if pass_k:
        if not all("samples" in r for r in records):
            raise ValueError("pass@k requested but some records hold no samples")
        sampled = load_tool_math_metric("pass_at_k").compute(
            num_samples=[int(r["samples"]["n"]) for r in records],
            num_correct=[int(r["samples"]["num_correct"]) for r in records],
            k=[int(k) for k in pass_k],
        )
        result.update({key: val for key, val in sampled.items() if key.startswith("pass@")})
    return result


def per_question_values(records: Sequence[dict], metric: str) -> np.ndarray:
    """Per-question values of ``metric`` (a :data:`PER_QUESTION_METRICS` name or ``pass@k``)."""
    if metric.startswith("pass@"):
        k = metric.split("@", 1)[1]
        return np.array([float(r["pass_at_k"][k]) for r in records])
    return np.array([PER_QUESTION_METRICS[metric](r) for r in records])


def available_metrics(records: Sequence[dict]) -> list[str]:
    """Metric names summarisable for ``records``: the fixed ones (an optional one when every record
    holds its key), plus pass@k held by every record. pass@1 is left out when ``sampled_pass@1``
    is there (the same number per question)."""
    names = [m for m in PER_QUESTION_METRICS
             if m not in OPTIONAL_RECORD_KEYS or all(OPTIONAL_RECORD_KEYS[m] in r for r in records)]
    if records and all(isinstance(r.get("pass_at_k"), dict) for r in records):
        common = set.intersection(*(set(r["pass_at_k"]) for r in records))
        if "sampled_pass@1" in names:
            common.discard("1")
        names += [f"pass@{k}" for k in sorted(common, key=int)]
    return names
