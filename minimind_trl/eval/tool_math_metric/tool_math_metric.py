"""Tool-math metric: an `evaluate.Metric` over per-question evaluation records.

Load it offline by path (never from the Hub)::

    metric = evaluate.load("<package>/minimind_trl/eval/tool_math_metric")           # greedy
    metric = evaluate.load(".../tool_math_metric", "pass_at_k")                     # sampled

Config ``"default"`` — one entry per question:

    success          int 0/1   verifier success
    all_gt_covered   int 0/1   every GT value found
    gt_hits          list[bool] one flag per GT value (length = number of GT values, >= 1)
    n_tool_calls     int       well-formed tool calls the model made (pending ones included)
    valid_calls      int       calls that ran and returned a result
    failed_calls     int       calls that ran and returned an error observation
    malformed_calls  int       tool-call attempts the protocol could not parse
    num_turns        int       model turns
    answer_length    int       tokens the model generated (action tokens; observations excluded)
    op_type          str       task family, for the breakdown

Returned numbers (q runs over the N questions of a group):

    task_success        = (1/N) sum_q success_q
    all_gt_coverage     = (1/N) sum_q all_gt_covered_q
    macro_gt_coverage   = (1/N) sum_q (hits_q / n_gt_q)
    micro_gt_coverage   = sum_q hits_q / sum_q n_gt_q
    tool_call_rate      = (1/N) sum_q [n_tool_calls_q > 0]
    tool_count_match    = (1/N) sum_q [n_tool_calls_q == n_gt_q]
    mean_tool_calls     = (1/N) sum_q n_tool_calls_q
    valid_call_rate     = sum_q valid_calls_q / sum_q n_tool_calls_q   (None without calls)
    failures_per_question = (1/N) sum_q failed_calls_q
    mean_malformed_calls = (1/N) sum_q malformed_calls_q
    mean_turns          = (1/N) sum_q num_turns_q
    mean_answer_length  = (1/N) sum_q answer_length_q
    count               = N

plus ``by_n_gt`` and ``by_op_type``: the same numbers for each number of GT values / op type
(keys are strings, sorted).

Config ``"pass_at_k"`` — one entry per question: ``num_samples`` (n) and ``num_correct`` (c);
``compute(..., k=[1, 5])`` returns ``{"pass@1": ..., "pass@5": ..., "count": N}`` with the
unbiased estimator pass@k = mean_q [1 - C(n_q - c_q, k) / C(n_q, k)].
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Task success, GT coverage, tool use and length of multi-turn tool-use math answers."
_KWARGS_DESCRIPTION = __doc__
_CITATION = ""

_DEFAULT_FEATURES = datasets.Features(
    {
        "success": datasets.Value("int32"),
        "all_gt_covered": datasets.Value("int32"),
        "gt_hits": datasets.Sequence(datasets.Value("bool")),
        "n_tool_calls": datasets.Value("int32"),
        "valid_calls": datasets.Value("int32"),
        "failed_calls": datasets.Value("int32"),
        "malformed_calls": datasets.Value("int32"),
        "num_turns": datasets.Value("int32"),
        "answer_length": datasets.Value("int32"),
        "op_type": datasets.Value("string"),
    }
)
_PASS_AT_K_FEATURES = datasets.Features(
    {"num_samples": datasets.Value("int32"), "num_correct": datasets.Value("int32")}
)


def _unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k)/C(n, k) as 1 - prod_{i=n-c+1}^{n} (1 - k/i); 1 when n - c < k."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def _group_numbers(success, covered, hits, n_gt, calls, valid, failed, malformed, turns, lengths) -> dict:
    return {
        "task_success": float(np.mean(success)),
        "all_gt_coverage": float(np.mean(covered)),
        "macro_gt_coverage": float(np.mean(hits / n_gt)),
        "micro_gt_coverage": float(hits.sum() / n_gt.sum()),
        "tool_call_rate": float(np.mean(calls > 0)),
        "tool_count_match": float(np.mean(calls == n_gt)),
        "mean_tool_calls": float(np.mean(calls)),
        "valid_call_rate": float(valid.sum() / calls.sum()) if calls.sum() else None,
        "failures_per_question": float(np.mean(failed)),
        "mean_malformed_calls": float(np.mean(malformed)),
        "mean_turns": float(np.mean(turns)),
        "mean_answer_length": float(np.mean(lengths)),
        "count": int(len(success)),
    }


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ToolMathMetric(evaluate.Metric):
    """Aggregate per-question tool-math records into the documented evaluation numbers."""

    def _info(self):
        if self.config_name not in ("default", "pass_at_k"):
            raise KeyError(f"unknown config {self.config_name!r}; use 'default' or 'pass_at_k'")
        features = _PASS_AT_K_FEATURES if self.config_name == "pass_at_k" else _DEFAULT_FEATURES
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=features,
        )

    def _compute(self, **columns):
        if self.config_name == "pass_at_k":
            return self._compute_pass_at_k(**columns)
        return self._compute_default(**columns)

    def _compute_default(self, success, all_gt_covered, gt_hits, n_tool_calls, valid_calls, failed_calls,
                         malformed_calls, num_turns, answer_length, op_type):
        if len(success) == 0:
            raise ValueError("no records to score")
        n_gt = np.array([len(h) for h in gt_hits], dtype=np.float64)
        if np.any(n_gt == 0):
            raise ValueError("every question needs at least one GT value (empty gt_hits found)")
        arrays = (
            np.asarray(success, dtype=np.float64),
            np.asarray(all_gt_covered, dtype=np.float64),
            np.array([sum(bool(x) for x in h) for h in gt_hits], dtype=np.float64),
            n_gt,
            np.asarray(n_tool_calls, dtype=np.float64),
            np.asarray(valid_calls, dtype=np.float64),
            np.asarray(failed_calls, dtype=np.float64),
            np.asarray(malformed_calls, dtype=np.float64),
            np.asarray(num_turns, dtype=np.float64),
            np.asarray(answer_length, dtype=np.float64),
        )
        result = _group_numbers(*arrays)
        for key, labels in (("by_n_gt", [str(int(v)) for v in n_gt]), ("by_op_type", list(op_type))):
            labels = np.asarray(labels, dtype=object)
            result[key] = {
                label: _group_numbers(*(a[labels == label] for a in arrays))
                for label in sorted(set(labels.tolist()))
            }
        return result

    def _compute_pass_at_k(self, num_samples, num_correct, k=(1,)):
        if len(num_samples) == 0:
            raise ValueError("no records to score")
        ks = [k] if isinstance(k, int) else list(k)
        out = {}
        for kk in ks:
            values = []
            for n, c in zip(num_samples, num_correct):
                if not (1 <= kk <= n and 0 <= c <= n):
                    raise ValueError(f"pass@{kk} needs 1 <= k <= n and 0 <= c <= n (got n={n}, c={c})")
                values.append(_unbiased_pass_at_k(int(n), int(c), int(kk)))
            out[f"pass@{kk}"] = float(np.mean(values))
        out["count"] = len(num_samples)
        return out
