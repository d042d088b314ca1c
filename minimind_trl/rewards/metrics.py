"""Trajectory-level metrics for evaluation and training logs.

`record_from_completion` turns one completion into a `TrajectoryRecord`;
`summarize_trajectories(records)` aggregates records into (N = number of trajectories,
C = Σ tool calls over all trajectories):

| key | definition |
|---|---|
| ``n`` | N |
| ``task_success`` | mean of ``success`` (the final answer states every GT value) |
| ``all_gt_coverage`` | mean of ``all_gt_covered`` (equals task_success with the default verifier; a custom verifier may make success stricter) |
| ``macro_gt_coverage`` | mean over trajectories of the fraction of GT values stated |
| ``tool_call_rate`` | share of trajectories with at least one well-formed tool call |
| ``calls_per_trajectory`` | C / N |
| ``valid_call_rate`` | Σ valid calls / C — a valid call names a known tool with arguments that satisfy its schema; NaN when C = 0 |
| ``tool_failure_rate`` | Σ failed observations / C (error observations); NaN when C = 0 |
| ``failures_per_trajectory`` | Σ failed observations / N |
| ``malformed_rate`` | share of trajectories with a malformed ``<tool_call>`` block |
| ``finished_rate`` | share of trajectories that end with a final answer (not on a tool call / result) |
| ``tool_backed_rate`` | share of trajectories where a successful tool result matches a GT value |
| ``mean_turns`` | mean number of assistant turns |
| ``mean_length_tokens`` | mean completion length in tokens (model and observation tokens, as recorded) |

All values are floats (``n`` too); an empty record list gives ``n = 0`` and NaN elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minimind_trl.envs.registry import ToolRegistry
from minimind_trl.rewards.rewards import evaluate_completion


@dataclass(frozen=True)
class TrajectoryRecord:
    """The per-trajectory facts the metrics need."""

    success: bool
    gt_coverage: float
    all_gt_covered: bool
    n_tool_calls: int = 0
    n_valid_calls: int = 0
    n_failed_calls: int = 0
    n_malformed: int = 0
    turns: int = 1
    length_tokens: int = 0
    finished: bool = True
    tool_backed: bool = False


def record_from_completion(completion, gt: list, length_tokens: int = 0,
                           registry: ToolRegistry | None = None) -> TrajectoryRecord:
    """Verify one completion and count its calls; ``registry`` judges call validity (default:
    the built-in tools)."""
    if registry is None:
        from minimind_trl.envs.tools import default_registry
        registry = default_registry()
    view, verification = evaluate_completion(completion, gt)
    valid = sum(registry.validate(c["name"], c["arguments"])[1] is None for c in view.calls)
    return TrajectoryRecord(
        success=verification.success, gt_coverage=verification.gt_coverage,
        all_gt_covered=verification.all_gt_covered, n_tool_calls=len(view.calls),
        n_valid_calls=valid, n_failed_calls=view.failed_observations,
        n_malformed=view.malformed, turns=view.turns, length_tokens=length_tokens,
        finished=not view.unfinished, tool_backed=verification.tool_backed)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def summarize_trajectories(records: list[TrajectoryRecord]) -> dict[str, float]:
    """Aggregate metrics (definitions in the module docstring)."""
    calls = sum(r.n_tool_calls for r in records)
    return {
        "n": float(len(records)),
        "task_success": _mean([float(r.success) for r in records]),
        "all_gt_coverage": _mean([float(r.all_gt_covered) for r in records]),
        "macro_gt_coverage": _mean([r.gt_coverage for r in records]),
        "tool_call_rate": _mean([float(r.n_tool_calls > 0) for r in records]),
        "calls_per_trajectory": _ratio(calls, len(records)),
        "valid_call_rate": _ratio(sum(r.n_valid_calls for r in records), calls),
        "tool_failure_rate": _ratio(sum(r.n_failed_calls for r in records), calls),
        "failures_per_trajectory": _ratio(sum(r.n_failed_calls for r in records), len(records)),
        "malformed_rate": _mean([float(r.n_malformed > 0) for r in records]),
        "finished_rate": _mean([float(r.finished) for r in records]),
        "tool_backed_rate": _mean([float(r.tool_backed) for r in records]),
        "mean_turns": _mean([float(r.turns) for r in records]),
        "mean_length_tokens": _mean([float(r.length_tokens) for r in records]),
    }
