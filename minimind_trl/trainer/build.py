"""From a resolved recipe to the objects a run needs: tokenizer, model, datasets, rewards, trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from minimind_trl.data.manifest import sha256_file, verify_manifest
from minimind_trl.trainer.recipe import RecipeError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def world_size() -> int:
    """Processes of this launch (``WORLD_SIZE`` from torchrun / accelerate, else 1)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def build_tokenizer(spec: dict):
    from minimind_trl.tokenization import load_tokenizer

    return load_tokenizer(spec["path"])


def build_model(spec: dict):
    """A MiniMind preset (random init, or an upstream ``.pth`` via ``native``) or a Hub folder."""
    from transformers import AutoModelForCausalLM

    from minimind_trl.modeling import MiniMindForCausalLM, get_preset, load_native_checkpoint

    dtype = _DTYPES[spec["dtype"]]
    if spec["path"] is not None:
        return AutoModelForCausalLM.from_pretrained(spec["path"], dtype=dtype)
    config = get_preset(spec["preset"], **spec["config"])
    if spec["native"] is not None:
        return load_native_checkpoint(spec["native"], config, dtype=dtype).train()
    return MiniMindForCausalLM(config).to(dtype)


def load_split(spec: dict) -> tuple[list[dict], dict[str, Any]]:
    """Rows of ``data.path/<split>.jsonl`` and what the manifest records about them."""
    folder = Path(spec["path"])
    split_file = folder / f"{spec['split']}.jsonl"
    if not split_file.is_file():
        raise RecipeError(f"recipe: data.split {spec['split']!r}: {split_file} not found")
    info: dict[str, Any] = {"path": str(folder), "split": spec["split"], "file_sha256": sha256_file(split_file)}
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        info["manifest_sha256"] = sha256_file(manifest_path)
        if spec["verify"]:
            verify_manifest(folder)
            info["verified"] = True
    elif spec["verify"]:
        raise RecipeError(f"recipe: {folder} has no manifest.json (set data.verify: false to train anyway)")
    with open(split_file, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    if spec["max_rows"] is not None:
        rows = rows[: spec["max_rows"]]
    if not rows:
        raise RecipeError(f"recipe: {split_file} has no rows")
    info["rows"] = len(rows)
    return rows, info


def grpo_dataset(rows: list[dict], thinking_ratio: float, seed: int) -> Dataset:
    """Task rows -> TRL prompt rows: ``prompt`` (messages), ``gt`` (JSON list), ``id``, ``open_thinking``."""
    from minimind_trl.envs.environment import with_open_thinking

    out = []
    for i, row in enumerate(rows):
        if "conversations" not in row or "gt" not in row:
            raise RecipeError(f"data row {i} ({row.get('id')}): a GRPO task row needs 'conversations' and 'gt'")
        # The prompt keeps the system turn's `tools` JSON string: training renders exactly the tools
        # the task offers, as evaluation does (the environment falls back to all registry tools
        # only for a prompt without one).
        prompt = [{k: v for k, v in m.items() if v is not None} for m in row["conversations"]]
        if prompt and prompt[-1].get("role") == "assistant" and not prompt[-1].get("content"):
            prompt = prompt[:-1]
        out.append({"prompt": prompt, "gt": json.dumps(row["gt"], ensure_ascii=False), "id": str(row.get("id", i))})
    return Dataset.from_list(with_open_thinking(out, ratio=thinking_ratio, seed=seed))


def sft_dataset(rows: list[dict], tokenizer, max_length: int) -> Dataset:
    """SFT rows (``conversations``) as ``input_ids`` + ``assistant_masks`` (see ``minimind_trl.sft``:
    the loss covers each assistant turn from after ``<|im_start|>assistant\\n`` through its
    ``<|im_end|>``; rows longer than ``max_length`` are dropped and counted, never truncated)."""
    from minimind_trl.sft import build_sft_dataset

    try:
        dataset, _ = build_sft_dataset(rows, tokenizer, max_length, mode="sft")
    except ValueError as exc:
        raise RecipeError(f"recipe: SFT data: {exc}") from exc
    return dataset


def build_rewards(specs: list[dict]) -> tuple[list, list[float]]:
    from minimind_trl.plugins import get_reward_function

    funcs = [get_reward_function(spec["name"], **spec["options"]) for spec in specs]
    return funcs, [float(spec["weight"]) for spec in specs]


def grpo_config(recipe: dict, run_dir: str, processes: int):
    """The :class:`MiniMindGRPOConfig` of a recipe (rollout and objective sections mapped to fields)."""
    from minimind_trl.trainer.config import MiniMindGRPOConfig

    rollout, objective, training = recipe["rollout"], recipe["objective"], dict(recipe["training"])
    group = rollout["group_size"]
    accumulation = training.get("gradient_accumulation_steps", 1)
    per_device = training.get("per_device_train_batch_size")
    prompts = rollout["prompts_per_rollout"]
    if prompts is not None:
        rows, slots = prompts * group, processes * accumulation
        if rows % slots:
            raise RecipeError(
                f"recipe: rollout.prompts_per_rollout x group_size = {rows} completions do not split over "
                f"{processes} process(es) x {accumulation} accumulation steps"
            )
        if per_device is not None and per_device != rows // slots:
            raise RecipeError(
                f"recipe: training.per_device_train_batch_size={per_device} but rollout.prompts_per_rollout="
                f"{prompts} x group_size={group} over {slots} slots needs {rows // slots}"
            )
        training["per_device_train_batch_size"] = rows // slots
    fields = {
        "objective": objective["preset"],
        **{k: objective[k] for k in ("policy", "advantage", "reduction", "epsilon_low", "epsilon_high",
                                     "cispo_max", "fixed_length", "beta")},
        "num_generations": group,
        "max_completion_length": rollout["max_completion_length"],
        "temperature": rollout["temperature"],
        "top_p": rollout["top_p"],
        "top_k": rollout["top_k"],
        "max_tool_calling_iterations": rollout["max_tool_turns"],
        "mask_truncated_completions": rollout["mask_truncated_completions"],
        "reward_weights": [float(r["weight"]) for r in recipe["rewards"]],
    }
    return MiniMindGRPOConfig(output_dir=run_dir, seed=recipe["seed"], **fields, **training)


def build_registry(rollout: dict):
    """The default tools plus ``rollout.tools`` plugins, restricted to ``rollout.tool_names`` if given."""
    from minimind_trl.envs.tools import ToolRegistry, default_registry

    registry = default_registry(plugins=rollout["tools"])
    names = rollout["tool_names"]
    if names is None:
        return registry
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise RecipeError(f"recipe: rollout.tool_names: unknown tool(s) {unknown}; known: {registry.names()}")
    subset = ToolRegistry(timeout_s=registry.timeout_s)
    for name in names:
        subset.register(registry.spec(name).func, name=name)
    return subset


def sft_config(recipe: dict, run_dir: str):
    """The ``trl.SFTConfig`` of a recipe; our tokenisation builds the assistant mask itself."""
    from trl import SFTConfig

    return SFTConfig(output_dir=run_dir, seed=recipe["seed"], max_length=recipe["sft"]["max_length"],
                     assistant_only_loss=False, **recipe["training"])


def training_config(recipe: dict, run_dir: str):
    """The training config; building it also sets up the distributed state (process group)."""
    config = grpo_config(recipe, run_dir, world_size()) if recipe["kind"] == "grpo" else sft_config(recipe, run_dir)
    _ = config.world_size  # make sure accelerate's state exists before anything else uses it
    return config


def build_trainer(recipe: dict, config, model, tokenizer, rows: list[dict]):
    """The GRPO (tool environment) or SFT trainer of a recipe."""
    if recipe["kind"] == "grpo":
        return build_grpo_trainer(recipe, config, model, tokenizer, rows)
    return build_sft_trainer(recipe, config, model, tokenizer, rows)


def build_grpo_trainer(recipe: dict, config, model, tokenizer, rows: list[dict]):
    from minimind_trl.envs.environment import make_environment_class
    from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer

    rollout = recipe["rollout"]
    funcs, _ = build_rewards(recipe["rewards"])
    environment = make_environment_class(build_registry(rollout), rollout["max_tool_turns"])
    return MiniMindToolGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=grpo_dataset(rows, rollout["thinking_ratio"], recipe["seed"]),
        processing_class=tokenizer,
        environment_factory=environment,
    )


def build_sft_trainer(recipe: dict, config, model, tokenizer, rows: list[dict]):
    from trl import SFTTrainer

    from minimind_trl.trainer.callbacks import LogHistoryCallback

    trainer = SFTTrainer(
        model=model, args=config, train_dataset=sft_dataset(rows, tokenizer, recipe["sft"]["max_length"]),
        processing_class=tokenizer,
    )
    trainer.add_callback(LogHistoryCallback(os.path.join(config.output_dir, "metrics.jsonl")))
    return trainer
