"""Fixed-K replay as an explicit axis: E passes x M minibatches, the position inside K, the
per-minibatch weighting and the per-update diagnostics (tiny model, scripted rollouts, CPU fp32)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import make_trainer

from minimind_trl.metric_names import GENERATION_TOKENS_PER_SECOND, TIMING_KEYS, UPDATE_TOKENS_PER_SECOND
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.rollout_state import ReplayPosition


def test_replay_position_of_each_micro_step_hand_worked():
    """GA = 2 micro-batches per step, M = 3 minibatches, E = 2 passes: K = 6 updates and 12
    micro-steps per rollout; the buffer holds M x GA = 6 micro-batches."""
    args = SimpleNamespace(gradient_accumulation_steps=2, minibatches=3, num_iterations=2)
    expected = {  # micro-step -> (rollout, update k, pass e, minibatch m, buffer index)
        0: (0, 0, 0, 0, 0), 1: (0, 0, 0, 0, 1), 2: (0, 1, 0, 1, 2), 5: (0, 2, 0, 2, 5),
        6: (0, 3, 1, 0, 0), 9: (0, 4, 1, 1, 3), 11: (0, 5, 1, 2, 5), 12: (1, 0, 0, 0, 0), 25: (2, 0, 0, 0, 1),
    }
    for step, (rollout, k, e, m, index) in expected.items():
        assert ReplayPosition.of_micro_step(step, args) == ReplayPosition(rollout, k, e, m, index), step


class ServedRows:
    """Wraps ``_compute_loss``: per optimizer step, the (prompt, completion) rows each micro-batch
    held and their advantages and action masks."""

    def __init__(self, trainer):
        self.steps: dict[int, list[tuple]] = {}
        original = trainer._compute_loss

        def spy(model, inputs):
            rows = self.steps.setdefault(trainer.state.global_step, [])
            mask = trainer._action_mask(inputs)
            for b in range(inputs["completion_ids"].size(0)):
                key = (tuple(inputs["prompt_ids"][b].tolist()), tuple(inputs["completion_ids"][b].tolist()))
                rows.append((key, float(inputs["advantages"][b]), int(mask[b].sum())))
            return original(model, inputs)

        trainer._compute_loss = spy


@pytest.mark.parametrize("accumulation", [1, 2])
def test_minibatch_form_uses_every_trajectory_once_and_weights_each_step_by_its_minibatch(tmp_path, accumulation):
    """M = 2 minibatches, E = 1 pass: a rollout of 8 trajectories feeds 2 optimizer steps of 4,
    every trajectory exactly once; step 1's ratio is exactly 1, step 2's is not (the policy moved
    since the rollout); each step's policy loss is its own minibatch's mean (at ratio 1, Dr.GRPO's
    loss of a row is -A n / L: the step's loss is -sum(A n) / (L x the minibatch's valid rows), not
    over the whole rollout's rows)."""
    trainer = make_trainer(tmp_path, max_steps=4, num_iterations=1, minibatches=2, objective="dr_grpo",
                           fixed_length=12, per_device_train_batch_size=4 // accumulation,
                           gradient_accumulation_steps=accumulation)
    assert trainer.args.steps_per_generation == 2 * accumulation and trainer.args.updates_per_rollout == 2
    served = ServedRows(trainer)
    trainer.train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["rollout"], r["update"], r["replay_pass"], r["replay_minibatch"]) for r in records] == [
        (0, 0, 0, 0), (0, 1, 0, 1), (1, 0, 0, 0), (1, 1, 0, 1)]
    for rollout in (0, 1):
        first, second = served.steps[2 * rollout], served.steps[2 * rollout + 1]
        assert len(first) == len(second) == 4
        keys = [key for key, _, _ in first + second]
        assert len(set(keys)) == 8  # 8 distinct trajectories, none twice
    assert records[0]["max_abs_log_ratio"] == 0.0 and records[0]["ratio_ess"] == 1.0
    assert records[1]["max_abs_log_ratio"] > 0.0 and records[1]["kl_new_old"] > 0.0
    valid = [(advantage, tokens) for _, advantage, tokens in served.steps[0] if tokens > 0]
    expected = -sum(a * n for a, n in valid) / (12 * len(valid))
    assert abs(expected) > 1e-3  # else a mean over the whole rollout's rows would pass too
    assert records[0]["policy_loss"] == pytest.approx(expected, rel=1e-5)


def test_passes_form_replays_the_whole_rollout_each_update(tmp_path):
    """E = 2 passes, M = 1: both updates of a rollout see all 8 trajectories; update 0's ratio is
    exactly 1 and its ESS 1, update 1's ratio moves."""
    trainer = make_trainer(tmp_path, max_steps=2, num_iterations=2)
    served = ServedRows(trainer)
    trainer.train()
    first, second = served.steps[0], served.steps[1]
    assert sorted(first) == sorted(second) and len(first) == 8
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["update"], r["replay_pass"], r["replay_minibatch"]) for r in records] == [(0, 0, 0), (1, 1, 0)]
    assert (records[0]["max_abs_log_ratio"], records[0]["ratio_std"], records[0]["ratio_ess"]) == (0.0, 0.0, 1.0)
    assert records[0]["kl_new_old"] == records[0]["kl_old"] == 0.0
    assert records[1]["ratio_std"] > 0.0 and records[1]["ratio_ess"] < 1.0 and records[1]["kl_new_old"] > 0.0


def test_both_forms_together(tmp_path):
    """E = 2, M = 2: K = 4 updates per rollout, positions (pass, minibatch) in order; update 0 only
    has ratio exactly 1."""
    trainer = make_trainer(tmp_path, max_steps=4, num_iterations=2, minibatches=2, per_device_train_batch_size=4)
    trainer.train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["update"], r["replay_pass"], r["replay_minibatch"]) for r in records] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert records[0]["max_abs_log_ratio"] == 0.0
    assert all(r["max_abs_log_ratio"] > 0.0 for r in records[1:])


def test_the_step_pools_its_micro_batches_moments_exactly(tmp_path):
    """With 2 accumulation steps the recorded ratio std and ESS are those of the whole step
    (pooled second moments), equal to a run of one micro-batch of the same rows."""
    runs = {}
    for accumulation in (1, 2):
        folder = tmp_path / f"ga{accumulation}"
        trainer = make_trainer(folder, max_steps=2, num_iterations=2, per_device_train_batch_size=8 // accumulation,
                               gradient_accumulation_steps=accumulation, prefix_sharing=False)
        trainer.train()
        runs[accumulation] = read_metrics(folder / "metrics.jsonl")[1]
    for key in ("ratio_mean", "ratio_std", "ratio_ess", "seq_ratio_std", "seq_ratio_ess", "kl_new_old"):
        assert runs[2][key] == pytest.approx(runs[1][key], rel=1e-4), key
    assert "ratio_sq_mean" not in runs[1] and "seq_ratio_sq_mean" not in runs[1]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_minibatches_must_be_a_positive_int(tmp_path, bad):
    with pytest.raises(ValueError, match="minibatches"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), minibatches=bad, per_device_train_batch_size=8, num_generations=4,
                           use_cpu=True, report_to=[], bf16=False)


def test_the_config_names_the_replay(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, num_iterations=3, minibatches=2, per_device_train_batch_size=4)
    assert trainer.args.replay_dict() == {"passes": 3, "minibatches": 2, "updates_per_rollout": 6}
    assert trainer.args.steps_per_generation == 2 and trainer.args.generation_batch_size == 8


_NOT_TIMINGS = {*TIMING_KEYS, UPDATE_TOKENS_PER_SECOND, GENERATION_TOKENS_PER_SECOND}  # wall-clock figures


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", [
    {"num_iterations": 2, "max_steps": 4},
    {"minibatches": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 4},
    {"num_iterations": 2, "minibatches": 2, "per_device_train_batch_size": 4, "max_steps": 8},
], ids=["passes", "minibatches", "both"])
def test_update_zero_keeping_its_own_log_probs_is_exactly_the_separate_old_pass(tmp_path, form, bf16):
    """Update 0's micro-batches skip the old-log-prob pass and keep their own update-0 log-probs
    (the whole rollout in the E form, minibatch 0 in the M form): every record and every weight
    after two rollouts equals the run where the old pass scores every micro-batch."""
    runs = {}
    for name in ("kept", "separate"):
        trainer = make_trainer(tmp_path / name, bf16=bf16, **form)  # two rollouts
        if name == "separate":
            trainer._old_pass_indices = lambda count: range(count)
        scored = []
        forward = trainer._policy_forward

        def spy(model, inputs, keep_topk=False, compute_entropy=True, forward=forward, scored=scored):
            scored.append(keep_topk)  # keep_topk marks the old pass
            return forward(model, inputs, keep_topk=keep_topk, compute_entropy=compute_entropy)

        trainer._policy_forward = spy
        trainer.train()
        runs[name] = (read_metrics(tmp_path / name / "metrics.jsonl"), trainer.model.state_dict(), sum(scored))
    (kept, kept_weights, kept_old), (separate, separate_weights, separate_old) = runs["kept"], runs["separate"]
    micro_batches = trainer.args.steps_per_generation  # per rollout
    accumulation = trainer.args.gradient_accumulation_steps
    rollouts = 1 + max(r["rollout"] for r in kept)
    assert separate_old == rollouts * micro_batches and kept_old == rollouts * (micro_batches - accumulation)
    assert [set(r) for r in kept] == [set(r) for r in separate]
    for a, b in zip(kept, separate):
        for key in a:
            if key not in _NOT_TIMINGS:
                assert a[key] == b[key], (a["step"], key)
    assert kept[0]["max_abs_log_ratio"] == 0.0 and kept[1]["max_abs_log_ratio"] > 0.0
    if kept_old == 0:  # E form: no separate pass at all
        assert all(r["old_logp_seconds"] == 0.0 for r in kept)
    for key, weight in separate_weights.items():
        assert torch.equal(kept_weights[key], weight), key


@pytest.mark.parametrize("prefix_sharing,cast_attention_to_fp32", [(True, False), (False, False), (True, True)],
                         ids=["shared_pass", "plain_pass", "shared_pass_fp32_attention"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_old_pass_gives_the_update_forwards_log_probs_bit_for_bit(tmp_path, prefix_sharing, bf16,
                                                                       cast_attention_to_fp32):
    """The old pass (no grad, no entropies) and the update's forward (grad, entropies) on the same
    weights give identical log-probs: what makes a kept update-0 forward and a separate pass the
    same numbers, and update 0's ratio exactly 1 (also with attention cast to fp32 under bf16)."""
    trainer = make_trainer(tmp_path, max_steps=1, num_iterations=2, bf16=bf16, prefix_sharing=prefix_sharing,
                           per_device_train_batch_size=4, gradient_accumulation_steps=2,
                           cast_attention_to_fp32=cast_attention_to_fp32)
    trainer.train()
    model = trainer.model_wrapped
    for batch in trainer._buffered_inputs:
        with torch.no_grad():
            old, no_entropy, _, _ = trainer._policy_forward(model, batch, keep_topk=True, compute_entropy=False)
        new, entropy, _, _ = trainer._policy_forward(model, batch)
        assert no_entropy is None and entropy is not None and new.requires_grad
        assert torch.equal(old, new.detach())


def test_a_copy_of_the_buffered_micro_batch_is_refused_not_replayed_at_ratio_one(tmp_path):
    """Update 0 writes its log-probs into the micro-batch TRL serves; were a copy served (an
    upstream change), update 1 would find none and silently see ratio 1: it stops instead."""
    trainer = make_trainer(tmp_path, max_steps=2, num_iterations=2)
    serve = trainer._prepare_inputs
    trainer._prepare_inputs = lambda batch: dict(serve(batch)) if trainer.model.training else serve(batch)
    with pytest.raises(RuntimeError, match="update 1 of a rollout was served a micro-batch without old log-probs"):
        trainer.train()
