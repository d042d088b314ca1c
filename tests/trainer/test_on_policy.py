"""The on-policy check: the log-probs each engine sampled the action tokens under against the
replay's old log-probs (``onpolicy/*`` record keys), fp32 on a tiny model, through the tool
trainer's rollout (`MiniMindToolGRPOTrainer`, both engines)."""

from __future__ import annotations

import math
import os

import pytest
import torch
from datasets import Dataset
from helpers import free_tool_trainer, make_trainer, tiny_model
from rollout_helpers import scripted, scripted_rows

from minimind_trl.engine.decode import TurnCache
from minimind_trl.engine.sampling import Sampling
from minimind_trl.engine.turns import generate_turns
from minimind_trl.envs.tools import default_registry
from minimind_trl.metric_names import (
    ON_POLICY_KEYS,
    ONPOLICY_KL,
    ONPOLICY_LOGP_ABS_DIFF_MAX,
    ONPOLICY_LOGP_ABS_DIFF_MEAN,
)
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer, on_policy_gap
from minimind_trl.trainer.recorder import read_metrics

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ENGINES = ("minimind", "trl")


def test_on_policy_gap_on_hand_worked_tensors():
    nan = float("nan")
    sampling = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-3.0, -1.0, -1.0, nan]])
    old = torch.tensor([[-1.5, -2.0, -0.25, -5.0], [-7.0, -1.1, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # (0, 3), (1, 0) masked; (1, 3) not scored (NaN)
    mean_gap, max_gap, kl, tokens = on_policy_gap(sampling, old, mask)
    deltas = [0.5, 0.0, -0.25, 0.1, 0.0]
    assert tokens == 5
    assert mean_gap.item() == pytest.approx(0.85 / 5)
    assert max_gap.item() == pytest.approx(0.5)
    assert kl.item() == pytest.approx(sum(math.exp(-d) - 1 + d for d in deltas) / 5)
    assert kl.item() > 0
    assert on_policy_gap(sampling, old, torch.zeros_like(mask)) == (0.0, 0.0, 0.0, 0)


def test_generate_turns_log_probs_are_those_of_the_warped_distribution(make_tiny_model):
    """Across slices, joins and a resumed second turn: each id's log-prob is log_softmax of the
    top-k-filtered logits / temperature at that id, from one plain forward of the whole context."""
    model = make_tiny_model()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(21, 400, (n,), generator=g).tolist() for n in (5, 9, 9, 3)]
    sampling, cache = Sampling(do_sample=True, temperature=0.7, top_k=40, seed=1), TurnCache()
    with torch.no_grad():
        first, first_logps = generate_turns(model, prompts, [11, 7, 7, 9], [2], 0, sampling, stream="s", batch_size=2,
                                            decode_slice=3, cache=cache, return_logprobs=True)
        second = [p + f + [300, 301] for p, f in zip(prompts, first)]
        ids, logps = generate_turns(model, second, [6] * 4, [2], 0, sampling, stream="t", batch_size=3,
                                    decode_slice=4, cache=cache, return_logprobs=True)
        assert cache.hits == 4
        assert generate_turns(model, prompts, [11, 7, 7, 9], [2], 0, sampling, stream="s", batch_size=2,
                              decode_slice=3) == first  # the same ids without recording
        for context, new, got in [*zip(prompts, first, first_logps), *zip(second, ids, logps)]:
            assert len(got) == len(new) > 0
            logits = model(torch.tensor([context + new])).logits[0, len(context) - 1:-1] / 0.7
            logits[logits < logits.topk(40, dim=-1).values[:, -1:]] = float("-inf")
            expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(new)[:, None]).squeeze(1)
            torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=0)


def assert_on_policy(rows, bound=1e-4):
    for row in rows:
        assert row[ONPOLICY_LOGP_ABS_DIFF_MAX] < bound, row
        assert 0.0 <= row[ONPOLICY_LOGP_ABS_DIFF_MEAN] <= row[ONPOLICY_LOGP_ABS_DIFF_MAX]
        assert 0.0 <= row[ONPOLICY_KL] < bound**2


@pytest.mark.parametrize("iterations", [1, 2], ids=["K1", "K2"])
@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_rollouts_are_on_policy(tmp_path, engine, iterations):
    """Two sampled rollouts: every record carries its rollout's figures, ~0 in fp32; the sampling
    log-probs are real ones (not zeros), aligned with the completion ids."""
    trainer = free_tool_trainer(tmp_path, engine, num_iterations=iterations, max_steps=2 * iterations,
                                temperature=0.8)
    trainer.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["rollout"] for r in rows] == [r for r in (0, 1) for _ in range(iterations)]
    assert_on_policy(rows)
    for a, b in zip(rows, rows[1:]):
        if a["rollout"] == b["rollout"]:
            assert all(a[key] == b[key] for key in ON_POLICY_KEYS)  # repeated by the later updates
    batch = trainer._buffered_inputs[0]
    sampling, mask = batch["sampling_per_token_logps"], batch["completion_mask"].bool()
    assert sampling.shape == batch["completion_ids"].shape
    assert (sampling[mask] < -1.0).all()  # near-uniform tiny model: about -log(6400)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_check_sees_off_policy_data(tmp_path, engine):
    """Sampled at temperature 1.0 but replayed at 0.5: the figures are far from 0."""
    trainer = free_tool_trainer(tmp_path, engine)
    trainer.temperature = 0.5  # the replay's temperature only; generation keeps its config
    trainer.train()
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row[ONPOLICY_LOGP_ABS_DIFF_MEAN] > 1e-2 and row[ONPOLICY_LOGP_ABS_DIFF_MAX] > 1e-1
    assert row[ONPOLICY_KL] > 1e-3


def test_scripted_rollouts_record_none(tmp_path):
    """A rollout_func without log-probs: the keys are there, with no value."""
    trainer = make_trainer(tmp_path, num_iterations=1, max_steps=1)
    trainer.train()
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert all(row[key] is None for key in ON_POLICY_KEYS)


# ------------------------------------------------------------------ tool turns inside the completion

KEYS = ("[call]", "[think]", "[loop]", "free")


class Recording(MiniMindToolGRPOTrainer):
    """Keeps the rollout and its log-probs under the policy that sampled it (before the update)."""

    def _generate_and_score_completions(self, inputs):
        self.last_batch = super()._generate_and_score_completions(inputs)
        with torch.no_grad():
            self.replay_logps = self._policy_forward(self.model, self.last_batch)[0]
        return self.last_batch


def tool_trainer(tmp_path, engine):
    tokenizer, registry = load_tokenizer(), default_registry()
    rows = scripted_rows(registry, KEYS)
    args = MiniMindGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=2, max_completion_length=96,
        max_tool_calling_iterations=2, max_steps=1, num_iterations=1, learning_rate=1e-4, bf16=False,
        gradient_checkpointing=False, use_cpu=True, report_to=[], save_strategy="no", seed=0, disable_tqdm=True,
        rollout_engine=engine, temperature=0.9)
    return Recording(model=scripted(tiny_model().train(), tokenizer), args=args, processing_class=tokenizer,
                     train_dataset=Dataset.from_list(rows),
                     reward_funcs=lambda completions, **kw: [0.0] * len(completions), tool_registry=registry)


@pytest.mark.parametrize("engine", ENGINES)
def test_tool_turns_carry_the_sampling_log_probs(tmp_path, engine):
    """Rows with tool turns inside the completion: the sampling log-probs are 0 on tool tokens and,
    on action tokens, the replay's. The minimind engine's sampler records before the scripted
    replies are forced, so its log-probs are the policy's at the forced tokens; TRL's ``generate``
    runs the recorder last, which sees the forced point mass (0.0): there only free rows compare."""
    trainer = tool_trainer(tmp_path, engine)
    trainer.train()
    batch = trainer.last_batch
    sampling, completion, tool = batch["sampling_per_token_logps"], batch["completion_mask"], batch["tool_mask"]
    action = (completion * tool).bool()
    assert sampling.shape == batch["completion_ids"].shape
    assert (completion.bool() & ~tool.bool()).any(dim=1).sum() >= 4  # rows with tool turns
    assert (sampling[~tool.bool()] == 0).all()
    free = torch.tensor(["free" in trainer._tokenizer.decode(p) for p in batch["prompt_ids"].tolist()])
    assert free.sum() == 2
    compared = torch.ones_like(free) if engine == "minimind" else free
    _, max_gap, kl, tokens = on_policy_gap(sampling[compared], trainer.replay_logps[compared], action[compared])
    assert tokens >= 40 and max_gap < 1e-4 and kl < 1e-8
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    if engine == "minimind":
        assert_on_policy([row])
    else:
        assert (sampling[~free][action[~free]] == 0).all() and row[ONPOLICY_LOGP_ABS_DIFF_MAX] > 1.0
