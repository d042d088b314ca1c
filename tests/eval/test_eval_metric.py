"""The local `evaluate` metric module: loads offline by path, computes the documented numbers."""

import evaluate
import pytest

from minimind_trl.eval import stats
from minimind_trl.eval.metrics import METRIC_DIR, available_metrics, compute_metrics, per_question_values

RECORDS = [
    # id, success, all covered, hits, tool calls (valid, failed, malformed), turns, answer length, op type
    dict(id="q1", success=True, all_gt_covered=True, gt_hits=[True], n_tool_calls=1, valid_calls=1,
         failed_calls=0, malformed_calls=0, num_turns=2, answer_length=10, op_type="arith"),
    dict(id="q2", success=False, all_gt_covered=False, gt_hits=[True, False], n_tool_calls=2, valid_calls=1,
         failed_calls=1, malformed_calls=1, num_turns=3, answer_length=30, op_type="unit"),
    dict(id="q3", success=False, all_gt_covered=False, gt_hits=[False], n_tool_calls=0, valid_calls=0,
         failed_calls=0, malformed_calls=2, num_turns=1, answer_length=5, op_type="arith"),
    dict(id="q4", success=True, all_gt_covered=True, gt_hits=[True, True, True], n_tool_calls=1, valid_calls=1,
         failed_calls=0, malformed_calls=0, num_turns=2, answer_length=40, op_type="fx"),
    # two calls in the last turn, never run (turn cap): neither valid nor failed
    dict(id="q5", success=False, all_gt_covered=True, gt_hits=[True, True], n_tool_calls=2, valid_calls=0,
         failed_calls=0, malformed_calls=0, num_turns=4, answer_length=15, op_type="unit"),
]
COUNTS = ("n_tool_calls", "valid_calls", "failed_calls", "malformed_calls", "num_turns", "answer_length")


def _compute(metric, records):
    return metric.compute(
        success=[int(r["success"]) for r in records],
        all_gt_covered=[int(r["all_gt_covered"]) for r in records],
        gt_hits=[r["gt_hits"] for r in records],
        **{key: [r[key] for r in records] for key in COUNTS},
        op_type=[r["op_type"] for r in records],
    )


@pytest.mark.parametrize("path", [str(METRIC_DIR), str(METRIC_DIR / "tool_math_metric.py")])
def test_metric_loads_by_path_and_computes_documented_numbers(path):
    metric = evaluate.load(path, keep_in_memory=True)
    out = _compute(metric, RECORDS)
    assert out["count"] == 5
    assert out["task_success"] == pytest.approx(2 / 5)
    assert out["all_gt_coverage"] == pytest.approx(3 / 5)
    # per-question coverage 1, 1/2, 0, 1, 1 -> macro 3.5/5; hits 1+1+0+3+2=7 of 1+2+1+3+2=9
    assert out["macro_gt_coverage"] == pytest.approx(3.5 / 5)
    assert out["micro_gt_coverage"] == pytest.approx(7 / 9)
    assert out["tool_call_rate"] == pytest.approx(4 / 5)
    # calls == n_gt: q1 (1,1), q2 (2,2), q5 (2,2) -> 3/5
    assert out["tool_count_match"] == pytest.approx(3 / 5)
    assert out["mean_tool_calls"] == pytest.approx(6 / 5)
    assert out["mean_answer_length"] == pytest.approx(100 / 5)
    assert out["valid_call_rate"] == pytest.approx(3 / 6)  # valid 1+1+0+1+0 of 6 calls
    assert out["failures_per_question"] == pytest.approx(1 / 5)
    assert out["mean_turns"] == pytest.approx(12 / 5)
    assert out["mean_malformed_calls"] == pytest.approx(3 / 5)  # 0 + 1 + 2 + 0 + 0

    assert sorted(out["by_n_gt"]) == ["1", "2", "3"]
    one = out["by_n_gt"]["1"]  # q1, q3
    assert one["count"] == 2 and one["task_success"] == pytest.approx(0.5)
    assert one["mean_answer_length"] == pytest.approx(7.5)
    assert one["mean_malformed_calls"] == pytest.approx(1.0)  # q1 0, q3 2
    two = out["by_n_gt"]["2"]  # q2, q5
    assert two["macro_gt_coverage"] == pytest.approx(0.75) and two["all_gt_coverage"] == pytest.approx(0.5)

    assert sorted(out["by_op_type"]) == ["arith", "fx", "unit"]
    unit = out["by_op_type"]["unit"]  # q2, q5
    assert unit["count"] == 2 and unit["task_success"] == 0.0
    assert unit["micro_gt_coverage"] == pytest.approx(3 / 4)
    assert out["by_op_type"]["fx"]["task_success"] == 1.0
    assert unit["valid_call_rate"] == pytest.approx(1 / 4) and unit["mean_turns"] == pytest.approx(3.5)
    assert out["by_op_type"]["arith"]["valid_call_rate"] == 1.0  # q1's one call; q3 made none
    no_calls = _compute(metric, [RECORDS[2]])
    assert no_calls["valid_call_rate"] is None and no_calls["tool_call_rate"] == 0.0


def test_pass_at_k_config_matches_stats():
    metric = evaluate.load(str(METRIC_DIR), "pass_at_k", keep_in_memory=True)
    n, c = [8, 8, 8, 4], [0, 3, 8, 1]
    out = metric.compute(num_samples=n, num_correct=c, k=[1, 4])
    for k in (1, 4):
        expected = sum(stats.pass_at_k(nn, cc, k) for nn, cc in zip(n, c)) / 4
        assert out[f"pass@{k}"] == pytest.approx(expected)
    assert out["pass@1"] == pytest.approx((0 + 3 / 8 + 1 + 1 / 4) / 4)
    with pytest.raises(ValueError):
        metric.compute(num_samples=[2], num_correct=[1], k=[3])


def test_compute_metrics_wrapper_and_per_question_values_agree():
    records = [dict(r, samples={"n": 4, "num_correct": i % 3}) for i, r in enumerate(RECORDS)]
    out = compute_metrics(records, pass_k=[1, 2])
    for name in ("task_success", "all_gt_coverage", "macro_gt_coverage", "tool_call_rate",
                 "tool_count_match", "mean_tool_calls", "mean_answer_length", "mean_malformed_calls"):
        assert per_question_values(records, name).mean() == pytest.approx(out[name]), name
    assert out["pass@1"] == pytest.approx(sum(i % 3 for i in range(5)) / 4 / 5)
    assert per_question_values(records, "sampled_pass@1").mean() == pytest.approx(out["pass@1"])
    assert "pass@2" in out


def test_optional_metrics_need_their_key_in_every_record():
    names = available_metrics(RECORDS)
    assert "mean_malformed_calls" in names and "sampled_pass@1" not in names
    assert per_question_values(RECORDS, "mean_malformed_calls").tolist() == [0.0, 1.0, 2.0, 0.0, 0.0]
    no_malformed = [{k: v for k, v in r.items() if k != "malformed_calls"} if i == 3 else r
                    for i, r in enumerate(RECORDS)]
    assert "mean_malformed_calls" not in available_metrics(no_malformed)
    sampled = [dict(r, samples={"n": 4, "num_correct": i % 3}, pass_at_k={"1": (i % 3) / 4, "2": 0.5})
               for i, r in enumerate(RECORDS)]
    names = available_metrics(sampled)
    # pass@1 is the same number per question as sampled_pass@1: one table, under the sampled name
    assert names[-2:] == ["sampled_pass@1", "pass@2"] and "pass@1" not in names
    assert per_question_values(sampled, "sampled_pass@1").tolist() == [0.0, 0.25, 0.5, 0.0, 0.25]
    assert "sampled_pass@1" not in available_metrics(sampled[:4] + RECORDS[4:])


def test_metric_rejects_empty_gt_and_empty_input():
    metric = evaluate.load(str(METRIC_DIR), keep_in_memory=True)
    bad = [dict(RECORDS[0], gt_hits=[])]
    with pytest.raises(ValueError, match="GT"):
        _compute(metric, bad)
    with pytest.raises(ValueError):
        compute_metrics([])
    with pytest.raises(KeyError):
        evaluate.load(str(METRIC_DIR), "nonsense", keep_in_memory=True)
