"""Learning test (issue item 5): every objective raises the mean training reward on a task whose
optimum is known, within a bounded number of updates; the same check fails when the advantage's
sign, the action mask, the advantage's rows or the sampler is broken.

The task: each prompt asks for the number 7; the reward (a reward plugin, named in the recipe like
any other) is the share of the answer's non-space characters that are "7", so its optimum is 1.0,
an answer made of sevens. A randomly initialised tiny model samples almost uniformly over its 6400
tokens, which would make any useful token rare; a short supervised warm-up (:func:`digit_writer`,
about 2 s) first teaches it to answer with random single digits, so the reward starts near 0.1
and every sampled 7 is signal.

Each run goes through the real training path: a recipe resolved by ``validate_recipe``, the config,
tokenizer, split, plugins, model and trainer built by :mod:`minimind_trl.trainer.build` as
``minimind-trl train`` builds them (the ``grpo`` kind: ``MiniMindToolGRPOTrainer`` with its tool
environment, here with no tools), the ``minimind`` rollout engine, K = 2 updates per rollout (so
update 1 goes through the ratio and its clipping), and the reward read back from ``metrics.jsonl``.

Measured on CPU over seeds 0-5 (rise = mean reward of the last two of 8 rollouts minus that of
the first two; the first rollout's reward is 0.08-0.12):

* every preset and both 2x2 cells: rise 0.51-0.72 (last rollout 0.66-0.88); GSPO is the slowest
  (0.51-0.57), CISPO the fastest (0.65-0.72);
* broken runs (grpo preset), seeds 0-2: a flipped sign falls, rise -0.09 to -0.06 (to about 0.01);
  a zero action mask (no gradient) and a sampler that keeps the starting weights (the updates never
  reach the answers) stay flat, rise -0.02 to +0.01;
* another group's advantages, seeds 0-12: no direction, but Adam turns the noise into lr-sized
  steps, so the reward random-walks: rise -0.08 to +0.22 (median -0.03).

The bar :data:`MIN_RISE` = 0.35 sits 0.16 below the smallest rise of a working objective and 0.13
above the largest of a broken one; the runs are deterministic for a seed on one platform, and the
rollout reward (a mean over 32 answers of 16 characters) has a sampling noise of about 0.015.
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_tokenizer, tiny_tokenizer_path
from transformers import AutoModelForCausalLM, set_seed

import minimind_trl.trainer.grpo_trainer as grpo_trainer
from minimind_trl.conversation import prompt_turns, task_prompt
from minimind_trl.engine.turns import generate_turns
from minimind_trl.envs import rollout
from minimind_trl.envs.protocol import prompt_ids_for
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.metric_names import REWARD_MEAN, ROLLOUT, UPDATE
from minimind_trl.modeling import MiniMindForCausalLM, get_preset
from minimind_trl.objectives import compute_advantages
from minimind_trl.run_folder import METRICS
from minimind_trl.trainer import build
from minimind_trl.trainer.recipe import validate_recipe
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import save_initial_model

SEED = 0
ROLLOUTS = 8  # 8 rollouts x K = 2 updates = 16 optimizer steps
UPDATES = 2  # K: training.num_iterations
GROUP, PROMPTS, LENGTH = 8, 4, 16  # 32 answers of 16 tokens per rollout
LEARNING_RATE = 2e-3
MIN_RISE = 0.35  # mean reward of the last two rollouts minus that of the first two (module docstring)
OBJECTIVES = {
    "grpo": {"preset": "grpo"},
    "cispo": {"preset": "cispo"},
    "dr_grpo": {"preset": "dr_grpo"},
    "gspo": {"preset": "gspo"},
    "center_seq_mean": {"preset": "grpo", "advantage": "center"},  # the 2x2 cells (recipes/e2)
    "zscore_fixed_length": {"preset": "dr_grpo", "advantage": "zscore"},
}

REWARD_PLUGIN = '''\
from minimind_trl.rewards.trajectory import view_completion


def sevens(prompts, completions, **kwargs):
    """The share of the answer's non-space characters that are "7" (1.0: an answer of sevens)."""
    shares = []
    for completion in completions:
        text = "".join("".join(view_completion(completion).turn_texts).split())
        shares.append(text.count("7") / len(text) if text else 0.0)
    return shares
'''


def task_rows(n: int = 8) -> list[dict]:
    return [{"id": f"sevens-{i}", "gt": ["7"], "conversations": [
        {"role": "user", "content": f"Question {i}: write the number 7, as many times as you can."},
        {"role": "assistant", "content": ""},
    ]} for i in range(n)]


def digit_writer(rows: list[dict], tokenizer, seed: int = 0, steps: int = 40) -> MiniMindForCausalLM:
    """A tiny model taught to answer each prompt with random single digits (uniform over 0-9),
    with the prompt ids training renders (no tools, no think block)."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(get_preset("tiny")).train()
    prompts = [prompt_ids_for(tokenizer, *task_prompt({"conversations": prompt_turns(r["conversations"])}))
               for r in rows]
    width = max(map(len, prompts))
    prompt_ids = torch.zeros(len(prompts), width, dtype=torch.long)  # left-padded
    prompt_mask = torch.zeros_like(prompt_ids)
    for i, ids in enumerate(prompts):
        prompt_ids[i, width - len(ids):] = torch.tensor(ids)
        prompt_mask[i, width - len(ids):] = 1
    digits = torch.tensor(tokenizer.convert_tokens_to_ids(list("0123456789")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        answers = digits[torch.randint(len(digits), (len(prompts), LENGTH))]
        mask = torch.cat([prompt_mask, torch.ones_like(answers)], 1)
        logits = model(input_ids=torch.cat([prompt_ids, answers], 1), attention_mask=mask,
                       position_ids=(mask.cumsum(1) - 1).clamp(min=0), logits_to_keep=LENGTH + 1).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), answers.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 2.4  # ln 10 = 2.30: the answer is a uniform digit
    return model.eval()


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    """The split folder, the reward plugin and the warmed-up starting model (saved once)."""
    root = tmp_path_factory.mktemp("sevens")
    rows = task_rows()
    write_jsonl_atomic(root / "data" / "train.jsonl", rows)
    (root / "sevens_reward.py").write_text(REWARD_PLUGIN)
    save_initial_model(digit_writer(rows, tiny_tokenizer()), root / "model")
    return {"data": root / "data", "reward": f"{root / 'sevens_reward.py'}:sevens", "model": root / "model"}


def mean_rewards(task: dict, run_dir, objective: dict, seed: int = SEED) -> list[float]:
    """Train the recipe, as ``minimind-trl train`` builds it; the mean training reward of each rollout."""
    recipe = validate_recipe({
        "kind": "grpo",
        "seed": seed,
        "model": {"path": str(task["model"])},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(task["data"]), "verify": False},
        "objective": objective,
        "rollout": {"group_size": GROUP, "prompts_per_rollout": PROMPTS, "max_completion_length": LENGTH,
                    "max_tool_turns": 0, "tool_names": [], "thinking_ratio": 0.0, "temperature": 1.0,
                    "engine": "minimind"},
        "rewards": [task["reward"]],
        "training": {"max_steps": ROLLOUTS * UPDATES, "num_iterations": UPDATES, "learning_rate": LEARNING_RATE,
                     "lr_scheduler_type": "constant", "bf16": False, "use_cpu": True, "report_to": [],
                     "save_strategy": "no", "gradient_checkpointing": False, "disable_tqdm": True},
    })
    config = build.training_config(recipe, str(run_dir))
    set_seed(recipe["seed"])
    tokenizer = build.build_tokenizer(recipe)
    rows, _ = build.load_split(recipe["data"])
    build.check_plugins(recipe)
    model = build.build_model(recipe["model"])
    build.build_trainer(recipe, config, model, tokenizer, rows).train()
    records = read_metrics(run_dir / METRICS)
    assert [(r[ROLLOUT], r[UPDATE]) for r in records] == [(i, k) for i in range(ROLLOUTS) for k in range(UPDATES)]
    return [r[REWARD_MEAN] for r in records if r[UPDATE] == 0]


def rise(rewards: list[float]) -> float:
    """Mean reward of the last two rollouts minus that of the first two."""
    return (rewards[-2] + rewards[-1]) / 2 - (rewards[0] + rewards[1]) / 2


@pytest.mark.parametrize("objective", OBJECTIVES.values(), ids=OBJECTIVES.keys())
def test_every_objective_raises_the_training_reward(task, tmp_path, objective):
    rewards = mean_rewards(task, tmp_path, objective)
    assert rewards[0] < 0.2  # the task starts far from its optimum (1.0)
    assert rise(rewards) >= MIN_RISE, rewards


def _flipped_sign(monkeypatch, task):
    monkeypatch.setattr(grpo_trainer, "compute_advantages", lambda r, g, a: -compute_advantages(r, g, a))


def _no_action_tokens(monkeypatch, task):
    monkeypatch.setattr(grpo_trainer.MiniMindGRPOTrainer, "_action_mask",
                        staticmethod(lambda inputs: torch.zeros_like(inputs["completion_mask"])))


def _advantages_of_another_group(monkeypatch, task):
    monkeypatch.setattr(grpo_trainer, "compute_advantages",
                        lambda r, g, a: torch.roll(compute_advantages(r, g, a), g))


def _sampler_off_policy(monkeypatch, task):
    """Rollouts sampled from the starting weights whatever the policy has learned."""
    frozen = AutoModelForCausalLM.from_pretrained(task["model"]).eval()
    monkeypatch.setattr(rollout, "generate_turns", lambda model, *args, **kwargs: generate_turns(
        frozen, *args, **kwargs))


@pytest.mark.parametrize("fault", [_flipped_sign, _no_action_tokens, _advantages_of_another_group,
                                   _sampler_off_policy], ids=lambda f: f.__name__.strip("_"))
def test_a_broken_update_fails_the_learning_check(task, tmp_path, monkeypatch, fault):
    fault(monkeypatch, task)
    rewards = mean_rewards(task, tmp_path, OBJECTIVES["grpo"])
    assert rise(rewards) < MIN_RISE, rewards
    if fault is _flipped_sign:
        assert rise(rewards) < 0, rewards  # pushed away from the optimum
