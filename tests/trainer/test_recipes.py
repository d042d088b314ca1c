"""The shipped recipes (recipes/**.yaml) and the dpo / distill kinds and the peft section.

Every recipe loads, validates and builds its training config; the experiment recipes follow the
protocol; unknown keys are errors that name them; LoRA (sft, grpo), pretraining, DPO and
distillation each run two steps of the tiny preset through ``minimind-trl train``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_tokenizer, tiny_tokenizer_path
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForSequenceClassification

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.modeling import MiniMindForCausalLM, get_preset, save_for_hub
from minimind_trl.rewards.reward_model import RewardModelScorer, reward_model_folder_problem
from minimind_trl.run_folder import ADAPTER, FINAL_MODEL
from minimind_trl.trainer import build, cli, kinds
from minimind_trl.trainer.kinds import distill, dpo, registry, reward
from minimind_trl.trainer.recipe import (
    LEFT_OUT_WHEN_UNSET,
    RecipeError,
    load_recipe,
    read_recipe_file,
    recipe_sha256,
    validate_recipe,
)
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import read_status, remove_draft_card

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ALL = sorted(RECIPES.rglob("*.yaml"))
CPU = ["training.bf16=false", "training.use_cpu=true"]
OBJECTIVES = ("grpo", "cispo", "dr_grpo", "gspo")
TASK_REWARD = [("success_reward", 1.0), ("coverage_reward", 0.5), ("format_reward", 0.5)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core host OpenMP's barrier makes
    each small matmul ~100x slower with two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel(path: Path) -> str:
    return str(path.relative_to(RECIPES))


def _config(recipe: dict, tmp_path: Path):
    return kinds.get_kind(recipe["kind"]).make_config(recipe, str(tmp_path / "run"), 1)


def test_the_recipe_folder_holds_every_condition():
    names = {rel(p) for p in ALL}
    expected = {"e0/pretrain.yaml", "e0/sft.yaml", "e4/grpo_reward_model.yaml", "e4/reward_model.yaml",
                "smoke_grpo.yaml", "smoke_sft.yaml",
                "e2/zscore_fixed_length.yaml", "e2/center_seq_mean.yaml",
                *(f"e{n}/{o}.yaml" for n in (1, 3) for o in OBJECTIVES),
                *(f"extra/{x}.yaml" for x in ("dpo", "sft_lora", "grpo_lora", "distill"))}
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_every_recipe_loads_validates_and_builds_its_config(path, tmp_path):
    recipe = load_recipe(path, CPU)
    config = _config(recipe, tmp_path)
    training = read_recipe_file(path)["training"]  # what the file (and its bases) set
    assert config.learning_rate == pytest.approx(float(training["learning_rate"]))  # set, not TRL's default
    assert config.activation_checkpointing is False and config.gradient_checkpointing is False
    assert config.seed == recipe["seed"]
    if recipe["kind"] == "grpo":
        minibatches = recipe["training"].get("minibatches", 1)  # M form of replay: M optimizer steps per rollout
        assert config.logging_steps == 1
        assert config.steps_per_generation == config.gradient_accumulation_steps * minibatches


@pytest.mark.parametrize("path", [p for p in ALL if "demo" not in p.relative_to(RECIPES).parts], ids=rel)
def test_every_recipe_says_what_it_is_and_sets_its_fields(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    header = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    assert header.startswith("# ") and len(header.splitlines()) >= 3
    if "smoke" not in path.name:
        assert "arXiv:" in header or "upstream MiniMind" in header, "name the objective's paper"
    training = read_recipe_file(path)["training"]  # set explicitly in the file or in its base
    for key in ("learning_rate", "lr_scheduler_type", "warmup_steps", "bf16", "activation_checkpointing",
                "logging_steps", "save_strategy", "report_to", "max_grad_norm", "weight_decay", "optim"):
        assert key in training, f"training.{key} not set explicitly"


def _protocol(recipe: dict) -> dict:
    """The recipe without what distinguishes the conditions of one experiment."""
    return {k: v for k, v in recipe.items() if k not in ("objective", "description")}


def test_e1_conditions_share_the_protocol():
    recipes = {o: load_recipe(RECIPES / "e1" / f"{o}.yaml") for o in OBJECTIVES}
    grpo = recipes["grpo"]
    for name, recipe in recipes.items():
        assert recipe["objective"]["preset"] == name and recipe["objective"]["beta"] == 0.0
        assert _protocol(recipe) == _protocol(grpo), name
    assert grpo["seed"] == 42 and grpo["model"]["path"] == f"runs/e0_sft/{FINAL_MODEL}"
    assert (grpo["rollout"]["prompts_per_rollout"], grpo["rollout"]["group_size"]) == (8, 4)
    assert grpo["training"]["num_iterations"] == 4 and grpo["training"]["max_steps"] == 500 * 4
    assert [(r["name"], r["weight"]) for r in grpo["rewards"]] == TASK_REWARD
    assert grpo["data"]["path"] == "data/splits" and grpo["data"]["split"] == "train"


def test_e2_fills_the_two_missing_cells_of_the_2x2(tmp_path):
    def cell(path):
        objective = _config(load_recipe(path, CPU), tmp_path).objective_config()
        return objective.policy, objective.advantage, objective.reduction

    assert cell(RECIPES / "e1/grpo.yaml") == ("clip", "zscore", "seq_mean")
    assert cell(RECIPES / "e1/dr_grpo.yaml") == ("clip", "center", "fixed_length")
    assert cell(RECIPES / "e2/zscore_fixed_length.yaml") == ("clip", "zscore", "fixed_length")
    assert cell(RECIPES / "e2/center_seq_mean.yaml") == ("clip", "center", "seq_mean")
    e1 = _protocol(load_recipe(RECIPES / "e1/grpo.yaml"))
    for name in ("zscore_fixed_length", "center_seq_mean"):
        assert _protocol(load_recipe(RECIPES / "e2" / f"{name}.yaml")) == e1


def test_e3_is_e1_on_the_moe_checkpoint_and_e4_uses_a_reward_model():
    for objective in OBJECTIVES:
        e1, e3 = (load_recipe(RECIPES / f"e{n}" / f"{objective}.yaml") for n in (1, 3))
        assert e3["model"]["path"] == f"runs/e0_sft_moe/{FINAL_MODEL}" and e3["training"]["moe_diagnostics"] is True
        assert e3["objective"] == e1["objective"] and e3["rollout"] == e1["rollout"] and e3["rewards"] == e1["rewards"]
        assert {k: v for k, v in e3["training"].items()} == e1["training"]
    e4 = load_recipe(RECIPES / "e4/grpo_reward_model.yaml")
    optimised = [r for r in e4["rewards"] if r["weight"] != 0]
    assert [r["name"] for r in optimised] == ["reward_model"] and optimised[0]["options"]["path"]


def test_e0_produces_the_start_checkpoint():
    pretrain, sft = load_recipe(RECIPES / "e0/pretrain.yaml"), load_recipe(RECIPES / "e0/sft.yaml")
    assert pretrain["kind"] == sft["kind"] == "sft"
    assert pretrain["sft"]["mode"] == "pretrain" and pretrain["model"]["preset"] == "minimind-3"
    assert sft["sft"]["mode"] == "sft" and sft["model"]["path"] == f"runs/e0_pretrain/{FINAL_MODEL}"


BASE = {"model": {"preset": "tiny"}, "data": {"path": "d"}, "training": {}}


@pytest.mark.parametrize(
    "recipe, message",
    [
        ({**BASE, "kind": "sft", "peft": {"rank": 4, "target_modules": ["q_proj"]}}, "unknown key peft.rank"),
        ({**BASE, "kind": "sft", "peft": {"r": 4}}, "peft.target_modules is required"),
        ({**BASE, "kind": "sft", "peft": {"r": 0, "target_modules": ["q_proj"]}}, "peft.r must be a positive int"),
        ({**BASE, "kind": "sft", "peft": {"target_modules": []}}, "peft.target_modules must be a non-empty list"),
        ({**BASE, "kind": "sft", "sft": {"mode": "pretraining"}}, "sft.mode must be one of"),
        ({**BASE, "kind": "sft", "sft": {"max_lenght": 8}}, "unknown key sft.max_lenght"),
        ({**BASE, "kind": "sft", "training": {"completion_only_loss": True}},
         "training.completion_only_loss is set elsewhere"),
        ({**BASE, "kind": "dpo", "dpo": {"betta": 0.1}}, "unknown key dpo.betta"),
        ({**BASE, "kind": "dpo", "training": {"beta": 0.2}}, "training.beta is set elsewhere: use dpo.beta"),
        ({**BASE, "kind": "dpo", "training": {"max_length": 9}}, "use dpo.max_length"),
        ({**BASE, "kind": "dpo", "training": {"num_generations": 4}}, "unknown key training.num_generations"),
        ({**BASE, "kind": "dpo", "rollout": {}}, "section 'rollout' is not used by kind 'dpo'"),
        ({**BASE, "kind": "distill", "distill": {}}, "distill.teacher_path is required"),
        ({**BASE, "kind": "distill", "distill": {"teacher_path": "t", "teacher": "t"}}, "unknown key distill.teacher"),
        ({**BASE, "kind": "distill", "distill": {"teacher_path": "t"}, "training": {"beta": 1.0}}, "use distill.beta"),
        ({**BASE, "kind": "distill", "distill": {"teacher_path": "t"}, "peft": {"target_modules": ["q_proj"]}},
         "section 'peft' is not used by kind 'distill'"),
        ({**BASE, "kind": "grpo", "rewards": ["success_reward"], "training": {"beta": 0.1}}, "use objective.beta"),
        ({**BASE, "kind": "grpo", "rewards": ["success_reward"],
          "peft": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"], "bias": "x"}},
         "unknown key peft.bias"),
    ],
)
def test_new_kinds_and_sections_name_the_offending_key(recipe, message):
    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        validate_recipe(recipe)


def test_unknown_keys_in_shipped_recipes_are_named(tmp_path):
    for path in (RECIPES / "extra/dpo.yaml", RECIPES / "e1/grpo.yaml", RECIPES / "extra/distill.yaml"):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["training"]["learning_rat"] = 1e-5
        bad = tmp_path / path.name
        bad.write_text(yaml.safe_dump(raw))
        with pytest.raises(RecipeError, match=r"unknown key training\.learning_rat"):
            load_recipe(bad)
        with pytest.raises(RecipeError, match=r"unknown key model\.pth"):
            load_recipe(path, ["model.pth=x"])


def test_peft_section_is_optional_and_leaves_older_hashes_alone():
    recipe = validate_recipe({**BASE, "kind": "sft"})
    assert "peft" not in recipe and recipe["sft"] == {"max_length": 1024, "mode": "sft"}
    lora = validate_recipe({**BASE, "kind": "sft", "peft": {"target_modules": ["q_proj"]}})
    assert lora["peft"] == {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj"]}
    config = registry.peft_config(lora)
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (16, 32, {"q_proj"})


# ----------------------------------------------------------------------------------- runs


TRAIN = {"use_cpu": True, "bf16": False, "report_to": [], "max_steps": 2, "logging_steps": 1,
         "per_device_train_batch_size": 2, "learning_rate": 1e-3, "save_strategy": "no", "disable_tqdm": True,
         "activation_checkpointing": False, "lr_scheduler_type": "constant"}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Task split rows, gold SFT rows, DPO rows and pretraining text, each in its own folder."""
    root = tmp_path_factory.mktemp("recipe_data")
    tasks = generate_tasks(6, seed=5)
    gold = [gold_trajectory(t, default_registry()) for t in tasks]
    write_jsonl_atomic(root / "tasks" / "train.jsonl", tasks)
    write_jsonl_atomic(root / "sft" / "train.jsonl", gold)
    dpo = []
    for row in gold[:4]:
        conversation = row["conversations"]
        prompt = conversation[: next(i for i, m in enumerate(conversation) if m["role"] == "user") + 1]
        dpo.append({"chosen": conversation, "rejected": [*prompt, {"role": "assistant", "content": "It is 7."}]})
    write_jsonl_atomic(root / "dpo" / "train.jsonl", dpo)
    texts = [{"text": "MiniMind learns to count. " * (i + 1)} for i in range(6)]
    write_jsonl_atomic(root / "text" / "train.jsonl", texts)
    return root


def _train(tmp_path: Path, recipe: dict, name: str = "run") -> Path:
    recipe = {"seed": 1, "model": {"preset": "tiny"}, "tokenizer": {"path": tiny_tokenizer_path()}, **recipe}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / name
    assert cli.main([str(path), "--output-dir", str(run_dir)]) == 0
    assert read_status(run_dir)["state"] == "completed"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]
    assert not (run_dir / "README.md").exists()  # TRL's draft card removed; the model card is final/'s
    return run_dir


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(str(folder)).state_dict())


def test_lora_sft_saves_the_adapter_and_a_merged_final_model(tmp_path, data):
    run_dir = _train(tmp_path, {"kind": "sft", "data": {"path": str(data / "sft"), "verify": False},
                                "sft": {"max_length": 2048}, "peft": LORA, "training": TRAIN})
    assert (run_dir / ADAPTER / "adapter_config.json").is_file()
    assert json.loads((run_dir / ADAPTER / "adapter_config.json").read_text())["r"] == 4
    start, final = _weights(run_dir / "initial_model"), _weights(run_dir / FINAL_MODEL)
    assert not any("lora" in key for key in final)  # merged: a plain MiniMind checkpoint
    q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    assert not torch.equal(start[q], final[q])  # a targeted module moved
    assert torch.equal(start[k], final[k])  # an untargeted one did not


def test_pretrain_mode_trains_on_every_token(tmp_path, data):
    run_dir = _train(tmp_path, {"kind": "sft", "data": {"path": str(data / "text"), "verify": False},
                                "sft": {"max_length": 32, "mode": "pretrain"}, "training": TRAIN})
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["recipe"]["sft"]["mode"] == "pretrain"
    assert all(r["loss"] > 0 for r in read_metrics(run_dir / "metrics.jsonl"))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dpo_trains_against_the_initial_model(tmp_path, data, lora):
    recipe = {"kind": "dpo", "data": {"path": str(data / "dpo"), "verify": False},
              "dpo": {"max_length": 2048, "beta": 0.1}, "training": TRAIN}
    run_dir = _train(tmp_path, {**recipe, "peft": LORA} if lora else recipe)
    first, second = read_metrics(run_dir / "metrics.jsonl")
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    assert second["rewards/margins"] > 0  # and the chosen answers pull ahead after one
    assert json.loads((run_dir / "manifest.json").read_text())["kind"] == "dpo"
    assert (run_dir / ADAPTER).is_dir() == lora


def test_dpo_rows_are_rendered_with_the_chat_template(data):
    tokenizer = tiny_tokenizer()
    rows = [json.loads(line) for line in (data / "dpo" / "train.jsonl").read_text().splitlines()]
    dataset = dpo.dpo_dataset(rows, tokenizer)
    row = dataset[0]
    assert row["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "<tools>" in row["prompt"]
    assert row["chosen"].endswith("<|im_end|>") and "<tool_call>" in row["chosen"]
    assert row["rejected"] == "It is 7.<|im_end|>"
    with pytest.raises(RecipeError, match="identical"):
        dpo.dpo_dataset([{"chosen": rows[0]["chosen"], "rejected": rows[0]["chosen"]}], tokenizer)
    other_question = [rows[0]["chosen"][0], {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    with pytest.raises(RecipeError, match="share a prompt"):
        dpo.dpo_dataset([{"chosen": rows[0]["chosen"], "rejected": other_question}], tokenizer)
    with pytest.raises(RecipeError, match="needs 'chosen' and 'rejected'"):
        dpo.dpo_dataset([{"chosen": rows[0]["chosen"]}], tokenizer)


def test_distillation_from_a_teacher_folder(tmp_path, data, make_tiny_model):
    teacher = save_for_hub(make_tiny_model(seed=7).train(), tiny_tokenizer(), tmp_path / "teacher")
    run_dir = _train(tmp_path, {"kind": "distill", "data": {"path": str(data / "tasks"), "verify": False},
                                "distill": {"teacher_path": str(teacher), "max_completion_length": 12,
                                            "max_tool_turns": 1, "tool_names": ["calculate_math"]},
                                "training": TRAIN})
    records = read_metrics(run_dir / "metrics.jsonl")
    assert all(r["loss"] >= 0 and "completions/mean_length" in r for r in records)


def test_distill_tools_answer_like_the_environment():
    tools = distill.distill_tools({"max_tool_turns": 2, "tool_names": ["calculate_math", "unit_converter"]})
    assert [t.__name__ for t in tools] == ["calculate_math", "unit_converter"]
    assert json.loads(tools[0](expression="6*7")) == {"result": "42"}
    assert "error" in json.loads(tools[0](expression="import os"))
    assert distill.distill_tools({"max_tool_turns": 0, "tool_names": None}) == []


def test_lora_grpo_runs_and_merges(tmp_path, data):
    raw = yaml.safe_load((RECIPES / "smoke_grpo.yaml").read_text(encoding="utf-8"))
    raw["data"] = {"path": str(data / "tasks"), "verify": False}
    raw["rollout"]["max_completion_length"] = 12
    raw["training"].update(max_steps=2, save_strategy="no")
    raw["peft"] = LORA
    raw.pop("model")
    run_dir = _train(tmp_path, raw)
    assert (run_dir / ADAPTER / "adapter_model.safetensors").is_file()
    assert not any("lora" in key for key in _weights(run_dir / FINAL_MODEL))


def test_lora_grpo_on_moe_adapts_the_fused_experts_through_target_parameters(tmp_path, data):
    raw = yaml.safe_load((RECIPES / "smoke_grpo.yaml").read_text(encoding="utf-8"))
    raw["data"] = {"path": str(data / "tasks"), "verify": False}
    raw["rollout"]["max_completion_length"] = 12
    raw["training"].update(max_steps=2, save_strategy="no", learning_rate=1e-2)
    raw["peft"] = {**LORA, "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
    raw["model"] = {"preset": "tiny-moe"}
    run_dir = _train(tmp_path, raw)
    config = json.loads((run_dir / ADAPTER / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    start, final = _weights(run_dir / "initial_model"), _weights(run_dir / FINAL_MODEL)
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert not torch.equal(start[experts], final[experts])  # merged LoRA moved the fused expert tensor
    router = "model.layers.0.mlp.gate.weight"
    assert torch.equal(start[router], final[router])  # the router is not a target


def test_sft_evaluates_on_the_eval_split_during_training(tmp_path, data):
    folder = tmp_path / "sft"
    shutil.copytree(data / "sft", folder)
    shutil.copy(folder / "train.jsonl", folder / "val.jsonl")  # eval rows = train rows: eval_loss is the CE
    run_dir = _train(tmp_path, {"kind": "sft", "data": {"path": str(folder), "verify": False, "eval_split": "val"},
                                "sft": {"max_length": 2048},
                                "training": {**TRAIN, "eval_strategy": "steps", "eval_steps": 1}})
    rows = read_metrics(run_dir / "eval_metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["eval_loss"] > 0 for r in rows)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["data"]["eval"]["split"] == "val" and manifest["data"]["eval"]["rows"] == 6
    with pytest.raises(RecipeError, match="eval_split is for kinds grpo and sft, not 'dpo'"):
        validate_recipe({"kind": "dpo", "model": {"preset": "tiny"}, "data": {"path": "x", "eval_split": "val"}})


def test_peft_target_parameters_must_be_names():
    raw = {"kind": "sft", "model": {"preset": "tiny"}, "data": {"path": "x"}, "peft": {**LORA, "target_parameters": []}}
    with pytest.raises(RecipeError, match="peft.target_parameters"):
        validate_recipe(raw)
    assert "target_parameters" not in validate_recipe({**raw, "peft": LORA})["peft"]  # unset: hashes unchanged


def test_keys_added_after_the_first_hashes_are_left_out_when_unset_and_kept_when_set():
    """One canonicalisation (recipe.LEFT_OUT_WHEN_UNSET): an unset eval_split, target_parameters,
    sft.pack or rollout.sampling_streams is not in the resolved recipe, so a recipe written before
    the key existed hashes the same; a set value is kept (and changes the hash)."""
    sft = {"kind": "sft", "model": {"preset": "tiny"}, "data": {"path": "x"}, "peft": LORA}
    resolved = validate_recipe(sft)
    assert "eval_split" not in resolved["data"] and "target_parameters" not in resolved["peft"]
    assert "pack" not in resolved["sft"]
    assert set(LEFT_OUT_WHEN_UNSET) == {("data", "eval_split"), ("peft", "target_parameters"), ("sft", "pack"),
                                        ("rollout", "sampling_streams")}
    grpo = {"kind": "grpo", "model": {"preset": "tiny"}, "data": {"path": "x"},
            "rewards": [{"name": "success_reward", "weight": 1.0, "options": {}}]}
    assert "sampling_streams" not in validate_recipe(grpo)["rollout"]
    keyed = validate_recipe({**grpo, "rollout": {"sampling_streams": "global_row"}})
    assert keyed["rollout"]["sampling_streams"] == "global_row"
    assert recipe_sha256(keyed) != recipe_sha256(validate_recipe(grpo))
    pretrain = validate_recipe({**sft, "data": {"path": "x", "eval_split": "val"}, "sft": {"mode": "pretrain",
                                                                                        "pack": True}})
    assert pretrain["data"]["eval_split"] == "val" and pretrain["sft"]["pack"] is True
    assert recipe_sha256(pretrain) != recipe_sha256(validate_recipe({**sft, "sft": {"mode": "pretrain"}}))


def _reward_model(folder: Path) -> str:
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    Qwen3ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("name, preset, folder", [
    ("e0/pretrain.yaml", "tiny", "text"),
    ("e0/sft.yaml", "tiny", "sft"),
    ("e1/gspo.yaml", "tiny", "tasks"),
    ("e3/cispo.yaml", "tiny-moe", "tasks"),
    ("e4/grpo_reward_model.yaml", "tiny", "tasks"),
])
def test_experiment_recipes_run_two_steps_on_cpu_at_tiny_size(tmp_path, data, name, preset, folder):
    """The shipped recipe, only shrunk (tiny preset, CPU fp32, short rollouts, 2 steps)."""
    recipe = load_recipe(RECIPES / name)
    overrides = [*CPU, "training.max_steps=2", "training.dataloader_num_workers=0", "training.save_strategy='no'",
                 f"data.path={data / folder}", "data.verify=false", "model.path=null", f"model.preset={preset}"]
    if tiny_tokenizer_path():
        overrides.append(f"tokenizer.path={tiny_tokenizer_path()}")
    if recipe["kind"] == "grpo":
        overrides += ["rollout.prompts_per_rollout=2", "rollout.max_completion_length=12"]
    else:
        overrides += ["training.per_device_train_batch_size=2", "training.gradient_accumulation_steps=1",
                      "training.logging_steps=1"]
    if name.startswith("e4"):
        overrides.append(f"rewards.0.options.path={_reward_model(tmp_path / 'rm')}")
    args = [str(RECIPES / name), "--output-dir", str(tmp_path / "run")]
    for text in overrides:
        args += ["--set", text]
    assert cli.main(args) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    if name.startswith("e3"):
        assert "moe/layer0/load" in records[0] and "aux_loss" in records[0]
    if name.startswith("e4"):
        assert "reward/reward_model_reward_mean" in records[0] and "reward/success_reward_mean" in records[0]


def test_sft_pack_is_for_pretraining_only_and_off_leaves_hashes_alone():
    packed = validate_recipe({**BASE, "kind": "sft", "sft": {"mode": "pretrain", "max_length": 128, "pack": True}})
    assert packed["sft"] == {"max_length": 128, "mode": "pretrain", "pack": True}
    off = validate_recipe({**BASE, "kind": "sft", "sft": {"mode": "pretrain", "pack": False}})
    assert off["sft"] == {"max_length": 1024, "mode": "pretrain"}
    with pytest.raises(RecipeError, match="sft.pack is for sft.mode pretrain"):
        validate_recipe({**BASE, "kind": "sft", "sft": {"pack": True}})
    with pytest.raises(RecipeError, match="sft.pack must be true or false"):
        validate_recipe({**BASE, "kind": "sft", "sft": {"mode": "pretrain", "pack": "yes"}})


def test_only_trls_draft_card_is_removed_from_a_run_folder(tmp_path):
    (tmp_path / "README.md").write_text("---\ntags:\n- generated_from_trainer\n---\n# model\n")
    remove_draft_card(tmp_path)
    assert not (tmp_path / "README.md").exists()
    (tmp_path / "README.md").write_text("notes of my own")
    remove_draft_card(tmp_path)
    assert (tmp_path / "README.md").read_text() == "notes of my own"


def test_reward_pairs_state_the_gt_against_near_misses(data):
    """chosen states every GT value; rejected is the same answer with each value moved (a near miss
    in the value's own decimals); the rendering is the one the E4 reward scores answers with."""
    tasks = [json.loads(line) for line in (data / "tasks" / "train.jsonl").read_text().splitlines()]
    pairs = reward.reward_pairs(tasks, pairs_per_question=2, seed=3)
    assert len(pairs) == 2 * len(tasks)
    for task, pair in zip([t for t in tasks for _ in range(2)], pairs):
        assert all(str(v) in pair["chosen"] for v in task["gt"]) and pair["rejected"] != pair["chosen"]
        assert pair["question"] and pair["question"] in json.dumps(task["conversations"], ensure_ascii=False)
    rng = random.Random(0)
    assert reward.near_miss("inf", rng) != "inf" and reward.near_miss("1,234.5", rng).count(",") <= 1
    assert "," in reward.near_miss("12,345", rng)  # thousands commas kept: they must not mark the right answer
    for value in ("12", "0.75", "-3", "1000000", "2.5"):
        miss = reward.near_miss(value, rng)
        assert float(miss) != float(value)
        assert ("." in miss) == ("." in value) and len(miss.partition(".")[2]) == len(value.partition(".")[2])
    assert reward.answer_text({"gt": ["4"]}, ["4"]) == "The answer is 4."  # rows without reference calls
    with pytest.raises(RecipeError, match="reward row 1: needs a non-empty 'gt' list"):
        reward.reward_pairs([{"conversations": tasks[0]["conversations"]}], 1, 0)


def test_a_reward_model_trains_and_the_e4_reward_loads_it(tmp_path, data):
    """kind reward: a one-label MiniMindForSequenceClassification trained with TRL's RewardTrainer;
    its final/ is what recipes/e4 names as rewards.0.options.path, and the E4 scorer loads it."""
    run_dir = _train(tmp_path, {"kind": "reward", "data": {"path": str(data / "tasks"), "verify": False},
                                "reward": {"max_length": 256, "pairs_per_question": 1}, "training": TRAIN})
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all("loss" in r for r in rows)
    scorer = RewardModelScorer(str(run_dir / FINAL_MODEL), device="cpu")
    assert type(scorer.model).__name__ == "MiniMindForSequenceClassification"
    scores = scorer.score(["What is 3*7?", "What is 3*7?"], ["The answer is 21.", "The answer is 24."])
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)
    assert reward_model_folder_problem(str(run_dir / FINAL_MODEL)) is None
    assert "auto_map" not in json.loads((run_dir / FINAL_MODEL / "config.json").read_text())


def test_a_reward_model_from_a_minimind_folder_keeps_its_backbone_and_no_remote_code_map(tmp_path, tokenizer):
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(get_preset("tiny"))
    folder = save_for_hub(lm, tokenizer, tmp_path / "sft")
    assert json.loads((folder / "config.json").read_text())["auto_map"]  # the LM folder names its remote code
    spec = {"path": str(folder), "preset": None, "native": None, "config": {}, "dtype": "float32"}
    model = build.build_model(spec, head="sequence_classification")
    assert type(model).__name__ == "MiniMindForSequenceClassification" and model.config.num_labels == 1
    assert not model.config.auto_map
    assert torch.equal(model.model.embed_tokens.weight, lm.model.embed_tokens.weight)  # the backbone came along
