"""Recipe loading and validation, the recipe -> config mapping, and an SFT run through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_model, tiny_tokenizer, tiny_tokenizer_path

from minimind_trl.conversation import task_prompt
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.trainer import cli
from minimind_trl.trainer.build import build_model
from minimind_trl.trainer.kinds.grpo import grpo_config, grpo_dataset
from minimind_trl.trainer.kinds.sft import sft_dataset
from minimind_trl.trainer.recipe import RecipeError, load_recipe, recipe_sha256, validate_recipe
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import read_status

BASE = {
    "kind": "grpo",
    "model": {"preset": "tiny"},
    "data": {"path": "splits"},
    "rewards": ["success_reward"],
    "training": {"use_cpu": True, "bf16": False, "report_to": []},
}


def write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_defaults_are_filled_and_the_hash_is_stable(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE))
    assert recipe["rollout"]["group_size"] == 8 and recipe["objective"]["preset"] == "grpo"
    assert recipe["rewards"] == [{"name": "success_reward", "weight": 1.0, "options": {}}]
    assert recipe["seed"] == 42 and recipe["data"]["split"] == "train"
    assert recipe_sha256(recipe) == recipe_sha256(validate_recipe(json.loads(json.dumps(BASE))))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rollout": {"group_sise": 4}}, "unknown key rollout.group_sise"),
        ({"trianing": {}}, "unknown key trianing"),
        ({"training": {"learning_rat": 1e-5}}, "unknown key training.learning_rat"),
        ({"training": {"num_generations": 4}}, "training.num_generations is set elsewhere: use rollout.group_size"),
        ({"training": {"beta": 0.1}}, "objective.beta"),
        ({"sft": {"max_length": 10}}, "section 'sft' is not used by kind 'grpo'"),
        ({"model": {"preset": "tiny", "path": "x"}}, "exactly one of model.preset or model.path"),
        ({"model": {"path": "x", "config": {"hidden_size": 64}}},
         "model.config with model.path takes only attn_implementation"),
        ({"model": {"path": "x", "config": {"attn_implementation": "flash_attention_2"}}},
         "model.config.attn_implementation must be one of sdpa, eager, got 'flash_attention_2'"),
        ({"rewards": []}, "rewards must be a non-empty list"),
        ({"rewards": [{"name": "a", "wieght": 1}]}, "unknown key rewards.0.wieght"),
        ({"data": {"split": "train"}}, "data.path is required"),
        ({"kind": "ppo"}, "kind must be one of"),
    ],
)
def test_invalid_recipes_name_the_key(tmp_path, change, message):
    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        load_recipe(write(tmp_path, {**BASE, **change}))


def test_a_model_folder_runs_with_the_attention_its_recipe_names(tmp_path):
    """model.config of a model.path recipe chooses the attention kernel only; the weights are the folder's."""
    folder = tmp_path / "start"
    saved = tiny_model()
    saved.save_pretrained(folder)
    spec = {**BASE["model"], "preset": None, "path": str(folder)}
    for attention in ("eager", "sdpa"):
        override = f"model.config.attn_implementation={attention}"
        recipe = load_recipe(write(tmp_path, {**BASE, "model": spec}), [override])
        assert recipe["model"]["config"] == {"attn_implementation": attention}
        model = build_model(recipe["model"])
        assert model.config._attn_implementation == attention
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    assert build_model({**recipe["model"], "config": {}}).config._attn_implementation == "sdpa"  # the default


def test_set_overrides_parse_yaml_values_and_are_validated(tmp_path):
    path = write(tmp_path, BASE)
    recipe = load_recipe(path, ["objective.preset=dr_grpo", "objective.fixed_length=64", "rewards.0.weight=0.5",
                                "training.learning_rate=1e-5", "rollout.tool_names=[calculate_math]"])
    assert recipe["objective"]["preset"] == "dr_grpo" and recipe["objective"]["fixed_length"] == 64
    assert recipe["rewards"][0]["weight"] == 0.5 and recipe["training"]["learning_rate"] == 1e-5
    assert recipe["rollout"]["tool_names"] == ["calculate_math"]
    with pytest.raises(RecipeError, match="unknown key objective.presett"):
        load_recipe(path, ["objective.presett=cispo"])
    with pytest.raises(RecipeError, match="not an index"):
        load_recipe(path, ["rewards.3.weight=1"])
    with pytest.raises(RecipeError, match="expected key=value"):
        load_recipe(path, ["objective.preset"])


def test_rollout_section_maps_onto_the_grpo_config(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE), [
        "rollout.group_size=4", "rollout.prompts_per_rollout=6", "training.gradient_accumulation_steps=3",
        "objective.preset=gspo", "objective.beta=0.01", "rollout.max_tool_turns=2",
    ])
    config = grpo_config(recipe, str(tmp_path / "run"), processes=2)
    assert config.per_device_train_batch_size == 4  # 6 prompts x 4 / (2 processes x 3 steps)
    assert (config.num_generations, config.steps_per_generation, config.max_tool_calling_iterations) == (4, 3, 2)
    assert (config.objective, config.reduction, config.beta, config.seed) == ("gspo", "sequence", 0.01, 42)
    recipe["rollout"]["prompts_per_rollout"] = 5
    with pytest.raises(RecipeError, match="do not split"):
        grpo_config(recipe, str(tmp_path / "run"), processes=2)


def test_sft_rows_train_only_on_assistant_tokens():
    tokenizer = tiny_tokenizer()
    task = generate_tasks(1, seed=5)[0]
    dataset = sft_dataset([gold_trajectory(task, default_registry())], tokenizer, max_length=4096)
    ids, mask = dataset[0]["input_ids"], dataset[0]["assistant_masks"]
    assert len(ids) == len(mask) and 0 < sum(mask) < len(ids)
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "<tool_call>" in trained and "<tool_response>" not in trained
    assert ids[len(mask) - 1 - mask[::-1].index(1)] == tokenizer.eos_token_id  # <|im_end|> is trained


def test_sft_recipe_runs_through_the_cli(tmp_path):
    tasks = generate_tasks(6, seed=5)
    write_jsonl_atomic(tmp_path / "sft" / "train.jsonl", [gold_trajectory(t, default_registry()) for t in tasks])
    recipe = write(tmp_path, {
        "kind": "sft",
        "seed": 1,
        "model": {"preset": "tiny"},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(tmp_path / "sft"), "verify": False},
        "sft": {"max_length": 2048},
        "training": {"use_cpu": True, "bf16": False, "report_to": [], "max_steps": 2, "logging_steps": 1,
                     "per_device_train_batch_size": 3, "learning_rate": 1e-3, "save_strategy": "no",
                     "disable_tqdm": True, "gradient_checkpointing": False},
    })
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 for r in rows)
    assert read_status(tmp_path / "run")["state"] == "completed"
    assert (tmp_path / "run" / "final" / "tokenizer.json").is_file()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["kind"] == "sft" and manifest["objective"] is None and manifest["data"]["rows"] == 6


def test_grpo_prompts_offer_exactly_the_tools_of_each_task():
    """Training prompts keep the task's own tool list (as evaluation renders it), not the registry's."""
    tasks = generate_tasks(6, seed=3)
    dataset = grpo_dataset(tasks, thinking_ratio=0.0, seed=0)
    for task, row in zip(tasks, dataset):
        prompt = row["prompt"]
        assert [m["role"] for m in prompt] == ["system", "user"]  # placeholder assistant turn dropped
        _, tools = task_prompt({"conversations": prompt})
        expected = [t["function"]["name"] for t in json.loads(task["conversations"][0]["tools"])]
        assert [t["function"]["name"] for t in tools] == expected
        assert json.loads(row["gt"]) == task["gt"]
