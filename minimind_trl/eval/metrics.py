"""Per-question evaluation records → metric numbers.

Aggregates go through the local `evaluate` module in ``tool_math_metric/`` (loaded by path,
offline). Summaries need the same numbers *per question* (the bootstrap resamples questions), so
:data:`PER_QUESTION_METRICS` maps each summarised metric to its per-question value; the mean over
questions of that value equals the metric module's number of the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import evaluate
import numpy as np

METRIC_DIR = Path(__file__).resolve().parent / "tool_math_metric"

# Keys every record must carry for metrics and summaries.
REQUIRED_RECORD_KEYS = ("id", "success", "all_gt_covered", "gt_hits", "n_tool_calls", "answer_length")


def _coverage(record: dict) -> float:
    hits = record["gt_hits"]
    return sum(bool(h) for h in hits) / len(hits)


PER_QUESTION_METRICS: dict[str, Callable[[dict], float]] = {
    "task_success": lambda r: float(bool(r["success"])),
    "all_gt_coverage": lambda r: float(bool(r["all_gt_covered"])),
    "macro_gt_coverage": _coverage,
    "tool_call_rate": lambda r: float(r["n_tool_calls"] > 0),
    "tool_count_match": lambda r: float(r["n_tool_calls"] == len(r["gt_hits"])),
    "mean_tool_calls": lambda r: float(r["n_tool_calls"]),
    "mean_answer_length": lambda r: float(r["answer_length"]),
}


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
    """Metric names summarisable for ``records``: the fixed ones, plus pass@k held by every record."""
    names = list(PER_QUESTION_METRICS)
    if records and all(isinstance(r.get("pass_at_k"), dict) for r in records):
        common = set.intersection(*(set(r["pass_at_k"]) for r in records))
        names += [f"pass@{k}" for k in sorted(common, key=int)]
    return names
