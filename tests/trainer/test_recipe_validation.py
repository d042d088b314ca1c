"""Recipes are untrusted files: bounded YAML, and every invalid value is one line naming the file
and the key, exit 2, before any model is built (issue 17.2)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import transformers
import yaml
from helpers import tiny_tokenizer_path

import minimind_trl.modeling as modeling
from minimind_trl.trainer import cli
from minimind_trl.trainer.recipe import (
    MAX_YAML_NODES,
    SCHEDULERS_WITHOUT_WARMUP,
    RecipeError,
    load_recipe,
    validate_recipe,
)


def write_recipe(folder: Path, split_dir: Path) -> Path:
    recipe = {
        "kind": "grpo",
        "model": {"preset": "tiny"},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(split_dir)},
        "rollout": {"group_size": 2, "prompts_per_rollout": 2, "max_tool_turns": 1, "max_completion_length": 8},
        "rewards": ["success_reward"],
        "training": {"max_steps": 1, "num_iterations": 1, "bf16": False, "use_cpu": True, "report_to": [],
                     "save_strategy": "no", "gradient_checkpointing": False, "disable_tqdm": True},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


BAD = [
    (["rollout.group_size=four"], "rollout.group_size"),
    (["rollout.group_size=4.5"], "rollout.group_size"),
    (["rollout.group_size=0"], "rollout.group_size"),
    (["rollout.group_size=1"], "rollout.group_size"),
    (["training.gradient_accumulation_steps=0"], "training.gradient_accumulation_steps"),
    (["rollout.prompts_per_rollout=0"], "rollout.prompts_per_rollout"),
    (["rollout.prompts_per_rollout=-2"], "rollout.prompts_per_rollout"),
    (["training.per_device_train_batch_size=0"], "training.per_device_train_batch_size"),
    (["training.per_device_train_batch_size=-4"], "training.per_device_train_batch_size"),
    (["rollout.max_completion_length=0"], "rollout.max_completion_length"),
    (["rollout.temperature=-1"], "rollout.temperature"),
    (["rollout.max_tool_turns=-1"], "rollout.max_tool_turns"),
    (["rollout.prompts_per_rollout=null", "rollout.group_size=4", "training.per_device_train_batch_size=6"],
     "rollout.group_size=4 does not divide"),
    (["training.num_iterations=0"], "num_iterations"),
    (["training.logging_steps=2"], "logging_steps"),
    (["objective.preset=ppo"], "objective.preset"),
    (["objective.epsilon_low=-0.5"], "objective.epsilon_low"),
    (["objective.policy=ppo_clip"], "objective: unknown policy"),
    (["model.preset=tiny9"], "model.preset"),
    (["model.config={hiden_size: 64}"], "model.config"),
    (["model.preset=null", "model.path=/nonexistent/run/final"], "model.path"),
    (["model.native=/nonexistent/full_sft_768.pth"], "model.native"),
    (["tokenizer.path=/nonexistent/tokenizer"], "tokenizer.path"),
    (["rewards.0.name=no_such_reward"], "rewards.0.name"),
    (["rewards.0.name=/nonexistent/plugin.py:reward"], "rewards.0.name"),
    (["rollout.tools=[/nonexistent/tool.py]"], "rollout.tools"),
    (["training.max_steps=-5"], "training.max_steps"),
    (["data.max_rows=-1"], "data.max_rows"),
    (["data.split=nosuchsplit"], "data.split"),
    (["training.report_to=[tensorbaord]"], "training.report_to"),
    (["training.save_strategy=false"], "training.save_strategy"),
    (["training.lr_scheduler_type=cosine_typo"], "training:"),
    (["training.lr_scheduler_type=constant", "training.warmup_steps=8"], "training.warmup_steps=8 would be ignored"),
    (["training.warmup_steps=-1"], "training.warmup_steps"),
]


@pytest.mark.parametrize("overrides, key", BAD, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_invalid_values_exit_2_with_one_line_before_any_model(tmp_path, split_dir, capsys, monkeypatch, overrides,
                                                             key):
    built = []

    def record(*args, **kwargs):
        built.append(args)
        raise RuntimeError("a model was built")

    for owner, name in ((modeling, "MiniMindForCausalLM"), (modeling, "load_native_checkpoint"),
                        (transformers.AutoModelForCausalLM, "from_pretrained")):
        monkeypatch.setattr(owner, name, record)
    recipe = write_recipe(tmp_path, split_dir)
    args = [str(recipe), "--output-dir", str(tmp_path / "run")]
    for item in overrides:
        args += ["--set", item]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"minimind-trl train: {recipe}: "), err
    assert key in err, err
    assert built == []  # rejected before any model is built
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_yes_no_on_off_stay_strings(tmp_path, split_dir):
    path = write_recipe(tmp_path, split_dir)
    assert load_recipe(path, ["training.save_strategy=no"])["training"]["save_strategy"] == "no"
    path.write_text(path.read_text().replace("save_strategy: 'no'", "save_strategy: no").replace(
        "report_to: []", "report_to: []\n  logging_strategy: steps"))
    recipe = load_recipe(path, ["description=on", "training.bf16=false", "rollout.mask_truncated_completions=True"])
    assert recipe["training"]["save_strategy"] == "no" and recipe["description"] == "on"
    assert recipe["training"]["bf16"] is False and recipe["rollout"]["mask_truncated_completions"] is True


def _load_text(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return load_recipe(path)


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 "lol"'] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    text = "kind: grpo\nmodel: {preset: tiny}\ndata: {path: x}\nrewards: [success_reward]\n" \
           + "description: &bomb\n" + "\n".join("  " + line for line in lines) + "\n"
    started = time.perf_counter()
    with pytest.raises(RecipeError, match=f"more than {MAX_YAML_NODES} nodes"):
        _load_text(tmp_path, text)
    assert time.perf_counter() - started < 5


def test_small_anchors_still_work_and_recursion_is_refused(tmp_path):
    recipe = _load_text(tmp_path, "kind: grpo\nmodel: {preset: tiny}\ndata: {path: x}\nrewards: [success_reward]\n"
                                  "rollout: {group_size: &g 4, prompts_per_rollout: *g}\n")
    assert recipe["rollout"]["group_size"] == recipe["rollout"]["prompts_per_rollout"] == 4
    with pytest.raises(RecipeError, match="recursive alias"):
        _load_text(tmp_path, "kind: grpo\ndescription: &d [1, *d]\n")


@pytest.mark.parametrize("text, where", [
    ("kind: grpo\nseed: 1\nseed: 2\n", "duplicate key 'seed' (line 3)"),
    ("kind: grpo\nrollout:\n  group_size: 4\n  group_size: 8\n", "duplicate key 'group_size' (line 4)"),
])
def test_duplicate_keys_are_refused(tmp_path, text, where):
    with pytest.raises(RecipeError, match=where.replace("(", r"\(").replace(")", r"\)")):
        _load_text(tmp_path, text)


def test_merge_keys_are_not_duplicates(tmp_path):
    recipe = _load_text(tmp_path, "kind: grpo\nmodel: {preset: tiny}\ndata: {path: x}\n"
                                  "rewards: [&r {name: success_reward, weight: 1.0}, {<<: *r, weight: 0.5}]\n")
    assert recipe["rewards"][1] == {"name": "success_reward", "weight": 0.5, "options": {}}


@pytest.mark.parametrize("text", [
    "kind: !!python/object/apply:os.system ['true']\n",  # PyYAML's safe loader: guarded, not new
    "description: " + "[" * 5000 + "\n",
    "description: \"\\ud800\"\nkind: [\n",
])
def test_unsafe_or_broken_yaml_is_one_line(tmp_path, text):
    with pytest.raises(RecipeError, match="not valid YAML") as info:
        _load_text(tmp_path, text)
    assert "\n" not in str(info.value)


def test_a_lone_surrogate_is_named_not_a_traceback(tmp_path):
    text = 'kind: grpo\nmodel: {preset: tiny}\ndata: {path: x}\nrewards: [success_reward]\ndescription: "a\\ud800"\n'
    with pytest.raises(RecipeError, match="description: .* is not valid text"):
        _load_text(tmp_path, text)
    with pytest.raises(RecipeError, match="rollout.tool_names.0: .* is not valid text"):
        _load_text(tmp_path, text.replace('"a\\ud800"', "x") + 'rollout: {tool_names: ["\\udfff"]}\n')


@pytest.mark.parametrize("overrides, message", [
    (["rewards.0.weight=.nan"], "rewards.0.weight must be a finite number"),
    (["rewards.0.options=[1]"], "rewards.0.options must be a mapping"),
    (["data.path=3"], "data.path must be a non-empty string"),
    (["tokenizer.path=[a]"], "tokenizer.path must be a path or null"),
    (["rollout.thinking_ratio=1.5"], "rollout.thinking_ratio must be a finite number >= 0 and <= 1"),
])
def test_more_values_are_checked_at_load(tmp_path, split_dir, overrides, message):
    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        load_recipe(write_recipe(tmp_path, split_dir), overrides)


# A minimal valid recipe of each kind (validation only: nothing is built).
KIND_RECIPES = {
    "grpo": {"kind": "grpo", "model": {"preset": "tiny"}, "data": {"path": "x"}, "rewards": ["success_reward"]},
    "sft": {"kind": "sft", "model": {"preset": "tiny"}, "data": {"path": "x"}},
    "dpo": {"kind": "dpo", "model": {"preset": "tiny"}, "data": {"path": "x"}},
    "distill": {"kind": "distill", "model": {"preset": "tiny"}, "data": {"path": "x"},
                "distill": {"teacher_path": "t"}},
}


def _with_training(kind: str, **training) -> dict:
    return {**KIND_RECIPES[kind], "training": training}


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS_WITHOUT_WARMUP))
@pytest.mark.parametrize("kind", sorted(KIND_RECIPES))
def test_warmup_with_a_scheduler_that_ignores_it_is_refused(kind, scheduler):
    """transformers' get_scheduler passes no warmup to these schedulers: a warmup would be dropped silently."""
    with pytest.raises(RecipeError) as info:
        validate_recipe(_with_training(kind, lr_scheduler_type=scheduler, warmup_steps=8))
    text = str(info.value)
    assert text.startswith("recipe: training.warmup_steps=8 would be ignored") and "\n" not in text, text
    assert repr(scheduler) in text and "constant_with_warmup" in text, text
    with pytest.raises(RecipeError, match="training.warmup_steps=0.1 would be ignored"):  # a fraction of the steps
        validate_recipe(_with_training(kind, lr_scheduler_type=scheduler, warmup_steps=0.1))


@pytest.mark.parametrize("kind", sorted(KIND_RECIPES))
@pytest.mark.parametrize("training", [
    {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 8},
    {"lr_scheduler_type": "constant", "warmup_steps": 0},
    {"lr_scheduler_type": "constant"},
    {"lr_scheduler_type": "cosine", "warmup_steps": 0.1},
    {"warmup_steps": 8},  # the configs' default scheduler (linear) has a warmup
], ids=lambda t: ",".join(f"{k}={v}" for k, v in t.items()))
def test_warmup_with_a_scheduler_that_uses_it_is_accepted(kind, training):
    assert validate_recipe(_with_training(kind, **training))["training"] == training


@pytest.mark.parametrize("overrides, message", [
    (["rollout.group_size=1000000000"], "rollout.group_size must be an int in [2, 1024]"),
    (["rollout.prompts_per_rollout=4096", "rollout.group_size=8"],
     "rollout.prompts_per_rollout x rollout.group_size = 32768 completions per rollout; at most 16384"),
    (["rollout.prompts_per_rollout=null", "training.per_device_train_batch_size=100000"],
     "training.per_device_train_batch_size must be an int in [1, 16384]"),
    (["rollout.max_tool_turns=100000"], "rollout.max_tool_turns must be an int in [0, 64]"),
])
def test_rollout_sizes_have_upper_bounds(tmp_path, split_dir, overrides, message):
    """Issue 40.3: group_size 10**9 used to pass validation and grow memory until the OOM killer."""
    started = time.perf_counter()
    with pytest.raises(RecipeError, match=message.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        load_recipe(write_recipe(tmp_path, split_dir), overrides)
    assert time.perf_counter() - started < 5


def test_distill_tool_turns_are_bounded():
    recipe = {**KIND_RECIPES["distill"], "distill": {"teacher_path": "t", "max_tool_turns": 100000}}
    with pytest.raises(RecipeError, match=r"distill\.max_tool_turns must be an int in \[0, 64\]"):
        validate_recipe(recipe)
