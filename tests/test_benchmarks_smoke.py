"""Each benchmark script runs with ``--quick`` and writes valid JSON (not a measurement).

The scripts run in one child process (one import of torch/transformers/TRL, and the
benchmarks' thread settings stay out of the test process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = ("rollout", "update", "mfu", "step_breakdown", "policy_pass", "rl_step", "cpu_speed")

DRIVER = """
import contextlib, io, sys
sys.path.insert(0, sys.argv[1])
out = sys.argv[2]
for name in sys.argv[3:]:
    module = __import__(name)
    with contextlib.redirect_stdout(io.StringIO()):
        module.main(["--quick", "--output", f"{out}/{name}.json"])
"""


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="no benchmarks/ folder")
def test_benchmarks_quick_write_json(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TRL_EXPERIMENTAL_SILENCE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(BENCHMARKS), str(tmp_path), *SCRIPTS],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results = {name: json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8")) for name in SCRIPTS}
    for name, payload in results.items():
        assert payload["benchmark"] == name and payload["quick"] is True

    rollout = results["rollout"]["results"]
    assert {r["kind"] for r in rollout} == {"naive", "batched"}
    assert {r["samples_per_task"] for r in rollout} == {1, 2}  # distinct prompts, and repeated ones
    assert all(r["trajectories_per_s"] > 0 and r["generated_tokens"] > 0 for r in rollout)
    assert all(r["identical_to_naive"] and r["all_finished"] for r in rollout if r["kind"] == "batched")

    update = results["update"]
    assert {"replay", "update", "optimizer", "step"} <= set(update["phases"])
    assert update["loss_comparison"]["loss_abs_diff"] <= 1e-6  # grpo: same value as TRL's stock loss
    assert update["grid"]["points"] and "update_s_vs_tokens" in update["grid"]["fits"]

    mfu = results["mfu"]
    assert mfu["matmul_peak"]["main"]["peak_flops_per_s"] > 0
    assert mfu["update"]["mfu"] > 0 and mfu["rollout"]["mfu"] > 0

    speed = results["cpu_speed"]["results"]
    assert set(speed["rollout"]) == {"fp32/1t", "fp32/2t", "bf16/1t", "bf16/2t"}
    assert all(r["generation_s"] > 0 and r["update_s"] > 0 for r in speed["rollout"].values())
    assert [speed["rollout"][c]["mixed_precision"] for c in ("bf16/1t", "fp32/1t")] == ["bf16", "no"]
    attention = speed["attention"]
    assert set(attention) == {"1t", "2t"} and all(r["micro_batches"] >= 1 for r in attention.values())
    assert all(r[f"{way}_s"] > 0 for r in attention.values() for way in ("fp32", "bf16", "bf16_fp32_attention"))
    head = speed["head"]
    assert set(head) == {"1t", "2t"} and all(r[f"{p}_{h}_s"] > 0 for r in head.values() for p in ("fp32", "bf16")
                                             for h in ("trl", "cpu"))
    assert all(r["identical"] == {"fp32": True, "bf16": True} for r in head.values())  # same numbers, both heads
    assert speed["jobs"]["throughput_ratio"] > 0 and speed["eval"]["texts_identical"]
    assert speed["projection"]["before_s"] > 0 and speed["profile"]["total_s"] > 0

    breakdown = results["step_breakdown"]
    assert breakdown["steps"] and not breakdown["missing_timing_fields"]
    assert all(step["measured"] > 0 for step in breakdown["steps"])

    policy_pass = results["policy_pass"]["results"]
    assert policy_pass and all(r["plain"]["update_s"] > 0 and r["shared"]["update_s"] > 0 for r in policy_pass)
    assert all(r["max_abs_logp_difference"] < 1e-4 for r in policy_pass)  # the two passes agree

    rl_step = results["rl_step"]["results"]
    assert set(rl_step) == {"before", "after"}  # --quick: the two ends
    for name in ("before", "after"):
        assert rl_step[name]["per_rollout"]["measured"] > 0 and rl_step[name]["per_rollout"]["update"] > 0
        assert len(rl_step[name]["per_rollout"]["rollout_each"]) == rl_step[name]["per_rollout"]["rollouts_averaged"]


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="no benchmarks/ folder")
def test_rl_step_averages_rollouts_after_the_first_and_keeps_each():
    """Phases summed per rollout (K steps share one), the first rollout left out as warm-up; the
    rollout figure is the trainer's rollout_seconds, rewards included."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import rl_step
    finally:
        sys.path.remove(str(BENCHMARKS))

    def step(index, rollout, reward, update):
        return {"rollout_index": index, "rollout": rollout, "reward": reward, "old_logp": 0.5 if rollout else 0.0,
                "update": update, "measured": rollout + reward + update + (0.5 if rollout else 0.0),
                "action_tokens": 1000.0 * (index + 1), "completion_tokens_max": 100.0 + index}  # repeated per step

    steps = [step(0, 9.0, 1.0, 2.0), step(0, 0.0, 0.0, 2.0),  # warm-up rollout: left out
             step(1, 3.0, 0.5, 1.0), step(1, 0.0, 0.0, 1.0),
             step(2, 1.0, 0.5, 3.0), step(2, 0.0, 0.0, 3.0)]
    mean = rl_step.per_rollout(steps)
    assert mean["rollouts_averaged"] == 2 and mean["rollout_each"] == [3.5, 1.5]
    assert mean["rollout"] == pytest.approx(2.5) and mean["update"] == pytest.approx(4.0)
    assert mean["old_logp"] == pytest.approx(0.5) and mean["measured"] == pytest.approx(7.0)
    # the workload is the rollout's own figure (not summed over its steps), averaged over rollouts 1 and 2
    assert mean["action_tokens"] == pytest.approx(2500.0) and mean["completion_tokens_max"] == pytest.approx(101.5)
    assert rl_step.per_rollout(steps[:2])["rollout_each"] == [10.0]  # one rollout: kept
    assert rl_step.per_rollout([]) is None
