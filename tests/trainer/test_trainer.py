"""MiniMindGRPOTrainer on a tiny MiniMind (CPU): fixed-K replay, split invariance, diagnostics."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    GradGrab,
    free_tool_trainer,
    make_config,
    make_trainer,
    saved_tiny_model,
    scripted_completion,
    tiny_model,
    tiny_tokenizer,
)

from minimind_trl.metric_names import (
    GRPO_RECORD_KEYS,
    MOE_ALL_FLIP_RATE,
    MOE_AUX_LOSS,
    MOE_IMBALANCE,
    MOE_LOAD,
    MOE_ROUTER_ENTROPY,
    moe_layer_key,
)
from minimind_trl.modeling import MiniMindForCausalLM, get_preset
from minimind_trl.objectives import compute_advantages
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import _regroup_by_prompt
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import save_initial_model


@pytest.fixture(scope="module")
def k4_run(tmp_path_factory):
    """Real generation: 2 rollouts x K=4 updates, 2 prompts x 4 completions per rollout."""
    run_dir = tmp_path_factory.mktemp("k4")
    trainer = make_trainer(run_dir, scripted=False, max_steps=8, num_iterations=4)
    trainer.train()
    return trainer, read_metrics(run_dir / "metrics.jsonl")


def test_update_zero_ratio_is_exactly_one_and_later_updates_move(k4_run):
    _, rows = k4_run
    assert [(r["step"], r["rollout"], r["update"]) for r in rows] == [
        (s + 1, s // 4, s % 4) for s in range(8)
    ]
    for row in rows:
        if row["update"] == 0:
            assert row["max_abs_log_ratio"] == 0.0
            assert row["ratio_min"] == row["ratio_max"] == 1.0
            assert row["clip_fraction"] == 0.0
            assert row["rollout_seconds"] > 0  # generated
            assert row["old_logp_seconds"] == 0.0  # E form: update 0 keeps its own log-probs, no old pass
        else:
            assert row["max_abs_log_ratio"] > 0.0
            assert row["rollout_seconds"] == row["old_logp_seconds"] == 0.0  # replay: no generation
            assert row["reward_mean"] == rows[row["step"] - 2]["reward_mean"]  # same rollout


def test_metrics_rows_have_the_documented_keys(k4_run):
    _, rows = k4_run
    for row in rows:
        missing = [key for key in GRPO_RECORD_KEYS if key not in row]
        assert not missing, missing
        assert row["reward/text_reward_mean"] == pytest.approx(row["reward_mean"])
        assert row["grad_norm"] >= 0 and row["learning_rate"] == pytest.approx(5e-3)
        if row["update"] == 0:
            assert row["grad_norm"] > 0  # later updates may clip every token (zero gradient)
        assert 0.0 <= row["truncation_rate"] <= 1.0 and row["completion_tokens_max"] <= 12


def test_rollout_advantages_are_ours(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, num_iterations=2)
    trainer.train()
    batch = trainer._buffered_inputs[0]
    rewards = torch.tensor([float(sum(scripted_completion(f"Question {i}: what is {i} plus {2 * i}?", j)[0]) % 7) / 7.0
                            for i in range(16) for j in range(4)])
    # the advantages of the buffered rows are among those of the scripted rewards of their groups
    expected = set(torch.round(compute_advantages(rewards, 4, "zscore"), decimals=5).tolist())
    got = set(torch.round(batch["advantages"], decimals=5).tolist())
    assert got <= expected
    assert "old_per_token_logps" in batch  # frozen once per rollout when K > 1


def test_gradient_is_invariant_to_batch_split(tmp_path):
    grads, metrics = {}, {}
    for name, batch, accumulation in (("full", 8, 1), ("ga2", 4, 2)):
        grab = GradGrab()
        trainer = make_trainer(
            tmp_path / name, callbacks=[grab], per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation, max_grad_norm=0.0, max_steps=2, num_iterations=2,
        )
        trainer.train()
        grads[name], metrics[name] = grab.grads, read_metrics(tmp_path / name / "metrics.jsonl")
    for key, full in grads["full"].items():
        torch.testing.assert_close(grads["ga2"][key], full, rtol=1e-5, atol=1e-7)
    for a, b in zip(metrics["full"], metrics["ga2"]):
        for key in ("loss", "policy_loss", "grad_norm", "ratio_mean", "max_abs_log_ratio", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize(
    "objective",
    [{"objective": "grpo"}, {"objective": "gspo"}, {"objective": "dr_grpo", "fixed_length": 16},
     {"objective": "cispo", "reduction": "token_mean"}],
    ids=["grpo", "gspo", "dr_grpo", "cispo-token_mean"],
)
def test_uneven_micro_batches_sum_to_the_full_batch_gradient(tmp_path, objective):
    """A shorter last accumulation window: slices of 5 and 3 rows give the 8-row gradient (KL on)."""
    model = saved_tiny_model(tmp_path / "init")
    trainer = make_trainer(tmp_path / "run", model=model, max_steps=1, num_iterations=2, beta=0.1, **objective)
    trainer.train()  # one update: the rollout's old log-probs are frozen, the policy has moved
    rollout = dict(trainer._buffered_inputs[0])
    assert "ref_per_token_logps" in rollout

    def grad_of(slices):
        model.zero_grad()
        for rows in slices:
            part = {k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in rollout.items()}
            trainer.compute_loss(model, part).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full = grad_of([slice(0, 8)])
    uneven = grad_of([slice(0, 5), slice(5, 8)])
    assert any(g.abs().max() > 0 for g in full.values())
    for key in full:
        torch.testing.assert_close(uneven[key], full[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("prefix_sharing", [True, False], ids=["shared_pass", "plain_pass"])
@pytest.mark.parametrize("scripted", [True, False], ids=["scripted", "sampled"])
def test_update_zero_ratio_is_exactly_one_under_bf16_autocast(tmp_path, prefix_sharing, scripted):
    """Old log-probs come from the same micro-batches, padding and autocast as the update, with the
    prefix-shared and the plain pass; sampled rollouts decode with the bf16 copy of the weights
    (their sampler-vs-replay gap is bf16 rounding, not zero)."""
    settings = dict(max_steps=2, num_iterations=2, bf16=True, per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, prefix_sharing=prefix_sharing)
    trainer = make_trainer(tmp_path, **settings) if scripted else free_tool_trainer(tmp_path, **settings)
    trainer.train()
    assert trainer.accelerator.mixed_precision == "bf16"
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert first["max_abs_log_ratio"] == 0.0 and first["clip_fraction"] == 0.0 and first["ratio_ess"] == 1.0
    assert second["max_abs_log_ratio"] > 0.0
    if not scripted:
        assert 0.0 < first["onpolicy/logp_abs_diff_mean"] < 0.05
        decode_model = trainer._decode_model(trainer.model)
        assert next(decode_model.parameters()).dtype == torch.bfloat16
        assert next(trainer.model.parameters()).dtype == torch.float32  # fp32 master weights
        # The copy runs on its own bf16 weights: its logits are a plain bf16 model's, and they do not
        # follow the training model (a forward closure over the original would).
        ids = torch.tensor([[5, 17, 99, 4]])
        plain = tiny_model()
        plain.load_state_dict(trainer.model.state_dict())
        plain = plain.to(torch.bfloat16).eval()
        with torch.no_grad():
            expected = plain(ids).logits
            assert torch.equal(decode_model.eval()(ids).logits, expected)
            trainer.model.lm_head.weight.add_(1.0)
            assert torch.equal(decode_model(ids).logits, expected)


def test_eager_attention_keeps_update_zero_exact_under_bf16_autocast(tmp_path):
    """``model.config.attn_implementation: eager`` (the block attention's eager kernel in the shared
    pass): the old log-probs and update 0 still share their numerics, so its ratio is exactly 1."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(get_preset("tiny", attn_implementation="eager"))
    trainer = make_trainer(tmp_path, model=model, max_steps=2, num_iterations=2, bf16=True,
                           per_device_train_batch_size=4, gradient_accumulation_steps=2, prefix_sharing=True)
    trainer.train()
    assert trainer.model.config._attn_implementation == "eager"
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert first["max_abs_log_ratio"] == 0.0 and first["clip_fraction"] == 0.0 and first["ratio_ess"] == 1.0
    assert second["max_abs_log_ratio"] > 0.0


def test_fp32_decodes_with_the_model_itself(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, num_iterations=1)
    assert trainer._decode_model(trainer.model) is trainer.model


def test_moe_router_diagnostics(tmp_path):
    trainer = make_trainer(tmp_path, model=tiny_model(moe=True), max_steps=2, num_iterations=2)
    trainer.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    for row in rows:
        for layer in (0, 1):
            load = row[moe_layer_key(layer, MOE_LOAD)]
            assert len(load) == 4 and sum(load) == pytest.approx(1.0)
            assert row[moe_layer_key(layer, MOE_IMBALANCE)] >= 1.0
            assert row[moe_layer_key(layer, MOE_ROUTER_ENTROPY)] > 0
            assert row[moe_layer_key(layer, MOE_AUX_LOSS)] > 0
    assert rows[0][MOE_ALL_FLIP_RATE] == 0.0  # same weights in the old-log-prob and update passes
    assert 0.0 <= rows[1][MOE_ALL_FLIP_RATE] <= 1.0
    assert rows[0]["aux_loss"] > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"loss_type": "grpo"}, "loss_type"),
        ({"scale_rewards": "none"}, "advantage"),
        ({"epsilon": 0.3}, "epsilon_low"),
        ({"logging_steps": 5}, "logging_steps"),
        ({"steps_per_generation": 2}, "steps_per_generation"),
        ({"objective": "nope"}, "unknown preset"),
    ],
)
def test_config_rejects_options_it_would_ignore(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


def test_config_resolves_the_preset_and_overrides(tmp_path):
    config = make_config(tmp_path, objective="dr_grpo", advantage="zscore", fixed_length=64)
    assert (config.policy, config.advantage, config.reduction, config.fixed_length) == (
        "clip", "zscore", "fixed_length", 64
    )
    assert config.epsilon == config.epsilon_low == 0.2
    gspo = make_config(tmp_path, objective="gspo")
    assert (gspo.epsilon, gspo.epsilon_high, gspo.reduction) == (3e-4, 4e-4, "sequence")
    assert isinstance(gspo, MiniMindGRPOConfig) and gspo.num_iterations == 4


def test_tiny_tokenizer_and_model_fit():
    assert len(tiny_tokenizer()) <= tiny_model().config.vocab_size


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_prefix_sharing_gives_the_plain_pass_gradients_and_metrics(tmp_path, moe):
    """training.prefix_sharing on vs off: same gradients (1e-5 relative), losses, KL, aux and router
    figures; update 0's ratio exactly 1 in both. Tool gaps, a reference model; dense with GA=2
    (rows regrouped). MoE with GA=1: the aux loss is a statistic of each micro-batch, so regrouping
    rows changes it (README), while the plain pass keeps TRL's shuffled split."""
    batch, accumulation = (8, 1) if moe else (4, 2)
    grads, rows = {}, {}
    for sharing in (False, True):
        model = tiny_model(moe=moe)
        save_initial_model(model, tmp_path / f"init-{sharing}")
        grab = GradGrab()
        trainer = make_trainer(
            tmp_path / f"run-{sharing}", model=model, callbacks=[grab], max_grad_norm=0.0, max_steps=2,
            num_iterations=2, beta=0.1, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
            prefix_sharing=sharing,
        )
        trainer.train()
        grads[sharing], rows[sharing] = grab.grads, read_metrics(tmp_path / f"run-{sharing}" / "metrics.jsonl")
    assert grads[True].keys() == grads[False].keys()
    for key, plain in grads[False].items():
        scale = plain.abs().max().clamp(min=1e-6)
        assert (grads[True][key] - plain).abs().max() / scale < 1e-5, key
    assert rows[True][0]["max_abs_log_ratio"] == 0.0 == rows[False][0]["max_abs_log_ratio"]
    keys = ["loss", "policy_loss", "kl", "entropy", "ratio_mean", "clip_fraction", "num_action_tokens"]
    if moe:
        keys += ["aux_loss", "moe/layer0/imbalance", "moe/layer1/router_entropy", "moe/layer0/aux_loss",
                 "moe/flip_rate"]
    for shared, plain in zip(rows[True], rows[False]):
        for key in keys:
            assert shared[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key
        if moe:
            assert shared["moe/layer0/load"] == pytest.approx(plain["moe/layer0/load"], rel=1e-6)


def test_regroup_puts_each_group_in_one_micro_batch():
    prompts = torch.tensor([[0, 5], [7, 8], [0, 5], [7, 8], [1, 2], [0, 5], [1, 2], [7, 8], [1, 2]])  # 3 groups of 3
    batches = [{"prompt_ids": prompts[i:i + 3], "row": list(range(i, i + 3)), "scalar": torch.tensor(9.0)}
               for i in (0, 3, 6)]
    regrouped = _regroup_by_prompt(batches)
    assert [len(torch.unique(b["prompt_ids"], dim=0)) for b in regrouped] == [1, 1, 1]
    assert [b["row"] for b in regrouped] == [[0, 2, 5], [1, 3, 7], [4, 6, 8]]  # first appearance, then row order
    assert all(float(b["scalar"]) == 9.0 for b in regrouped)
