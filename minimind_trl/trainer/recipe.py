"""Recipes: one YAML file per experimental condition, validated strictly (see docs/recipes.md).

``load_recipe(path, overrides)`` reads the YAML, applies ``--set key=value`` overrides (dotted
keys, values parsed as YAML), fills the defaults and validates: an unknown key anywhere is an
error that names it, and so is a key set in ``training`` that another section owns.

Kinds: ``grpo`` (sections model, tokenizer, data, objective, rollout, rewards), ``sft`` (model,
tokenizer, data, sft), ``dpo`` (model, tokenizer, data, dpo) and ``distill`` (model, tokenizer,
data, distill); ``training`` holds fields of the kind's config class (:func:`config_class`). The
optional ``peft`` section (LoRA) applies to grpo, sft and dpo; when absent it is left out of the
resolved recipe, so recipes written before it keep their hash.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

KINDS = ("grpo", "sft", "dpo", "distill")
_REQUIRED = object()

# section -> key -> default (_REQUIRED: must be given). `training` and `objective` are checked apart.
SCHEMA: dict[str, dict[str, Any]] = {
    "model": {"preset": None, "path": None, "native": None, "config": {}, "dtype": "float32"},
    "tokenizer": {"path": None},
    "data": {"path": _REQUIRED, "split": "train", "max_rows": None, "verify": True},
    "objective": {
        "preset": "grpo", "policy": None, "advantage": None, "reduction": None, "epsilon_low": None,
        "epsilon_high": None, "cispo_max": None, "fixed_length": None, "beta": 0.0,
    },
    "rollout": {
        "group_size": 8, "prompts_per_rollout": None, "max_tool_turns": 3, "thinking_ratio": 0.1,
        "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "tools": [], "tool_names": None,
        "mask_truncated_completions": False,
    },
    "sft": {"max_length": 1024, "mode": "sft", "pack": False},
    "dpo": {"max_length": 1024, "beta": 0.1},
    "distill": {
        "teacher_path": _REQUIRED, "beta": 0.5, "max_completion_length": 256, "temperature": 1.0,
        "max_tool_turns": 3, "tool_names": None,
    },
    # optional: absent or null = full fine-tuning
    "peft": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": _REQUIRED},
}
TOP_LEVEL = {"kind": "grpo", "seed": 42, "description": "", "rewards": None, "training": {}}
SECTIONS_BY_KIND = {
    "grpo": ("model", "tokenizer", "data", "objective", "rollout"),
    "sft": ("model", "tokenizer", "data", "sft"),
    "dpo": ("model", "tokenizer", "data", "dpo"),
    "distill": ("model", "tokenizer", "data", "distill"),
}
OPTIONAL_SECTIONS_BY_KIND = {"grpo": ("peft",), "sft": ("peft",), "dpo": ("peft",), "distill": ()}
SFT_MODES = ("sft", "pretrain")
REWARD_KEYS = {"name": _REQUIRED, "weight": 1.0, "options": {}}

# training keys that a section owns, for every kind: key -> where to set it instead
OWNED_TRAINING_KEYS = {
    "output_dir": "the --output-dir option",
    "seed": "the top-level `seed`",
    "data_seed": "the top-level `seed`",
}
OWNED_BY_KIND = {
    "grpo": {
        "num_generations": "rollout.group_size",
        "generation_batch_size": "rollout.prompts_per_rollout",
        "steps_per_generation": "training.gradient_accumulation_steps (they are equal)",
        "max_completion_length": "rollout.max_completion_length",
        "temperature": "rollout.temperature",
        "top_p": "rollout.top_p",
        "top_k": "rollout.top_k",
        "max_tool_calling_iterations": "rollout.max_tool_turns",
        "mask_truncated_completions": "rollout.mask_truncated_completions",
        "reward_weights": "rewards[].weight",
        "beta": "objective.beta",
        "epsilon": "objective.epsilon_low",
        "epsilon_high": "objective.epsilon_high",
        "objective": "objective.preset",
        "policy": "objective.policy",
        "advantage": "objective.advantage",
        "reduction": "objective.reduction",
        "epsilon_low": "objective.epsilon_low",
        "cispo_max": "objective.cispo_max",
        "fixed_length": "objective.fixed_length",
    },
    "sft": {
        "max_length": "sft.max_length",
        "assistant_only_loss": "nothing: SFT always trains on assistant tokens only",
        "completion_only_loss": "nothing: the dataset carries the loss mask",
    },
    "dpo": {"max_length": "dpo.max_length", "beta": "dpo.beta"},
    "distill": {
        "teacher_model_name_or_path": "distill.teacher_path",
        "beta": "distill.beta",
        "max_completion_length": "distill.max_completion_length",
        "temperature": "distill.temperature",
        "max_tool_calling_iterations": "distill.max_tool_turns",
    },
}
class RecipeError(ValueError):
    """An invalid recipe; the message names the offending key."""


class _Loader(yaml.SafeLoader):
    """Safe YAML that also reads ``1e-5`` as a float (YAML 1.1 needs ``1.0e-5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml(text_or_stream) -> Any:
    return yaml.load(text_or_stream, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def config_class(kind: str) -> type:
    """The training-config dataclass of a kind (its fields are the allowed ``training`` keys)."""
    if kind == "grpo":
        from minimind_trl.trainer.config import MiniMindGRPOConfig

        return MiniMindGRPOConfig
    import trl

    return {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "distill": trl.DistillationConfig}[kind]


def _config_fields(kind: str) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class(kind)) if f.init}


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (``["a", "b", "c"]``, value parsed as YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {text!r}: expected key=value (e.g. objective.preset=cispo)")
    parts = [part.strip() for part in key.split(".")]
    if any(not part for part in parts):
        raise RecipeError(f"--set {text!r}: empty part in key {key!r}")
    try:
        parsed = _yaml(value) if value.strip() else None
    except yaml.YAMLError as exc:
        raise RecipeError(f"--set {key}: cannot parse value {value!r}: {exc}") from None
    return parts, parsed


def apply_override(recipe: dict, text: str) -> None:
    """Set a dotted key (list items by index: ``rewards.0.weight=2``) in place."""
    parts, value = parse_override(text)
    node: Any = recipe
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            node = node[_index(part, len(node), where)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise RecipeError(f"--set {'.'.join(parts)}: {where!r} is not a section")
    last = parts[-1]
    if isinstance(node, list):
        node[_index(last, len(node), ".".join(parts))] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise RecipeError(f"--set {'.'.join(parts)}: {'.'.join(parts[:-1])!r} is not a section")


def _index(part: str, length: int, where: str) -> int:
    if not part.isdigit() or int(part) >= length:
        raise RecipeError(f"--set {where}: {part!r} is not an index of a list of {length}")
    return int(part)


def _check_keys(given: dict, allowed: dict, where: str) -> dict:
    if not isinstance(given, dict):
        raise RecipeError(f"recipe: {where} must be a mapping, got {type(given).__name__}")
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise RecipeError(f"recipe: unknown key {where}.{unknown[0]} (known: {', '.join(sorted(allowed))})")
    resolved = {}
    for key, default in allowed.items():
        if key in given:
            resolved[key] = given[key]
        elif default is _REQUIRED:
            raise RecipeError(f"recipe: {where}.{key} is required")
        else:
            resolved[key] = copy.deepcopy(default)
    return resolved


def validate_recipe(raw: dict) -> dict:
    """Defaults filled in, every key checked; returns a new dict (the resolved recipe)."""
    if not isinstance(raw, dict):
        raise RecipeError("recipe: the file must hold a mapping of sections")
    kind = raw.get("kind", TOP_LEVEL["kind"])
    if kind not in KINDS:
        raise RecipeError(f"recipe: kind must be one of {KINDS}, got {kind!r}")
    sections, optional = SECTIONS_BY_KIND[kind], OPTIONAL_SECTIONS_BY_KIND[kind]
    allowed_top = {**TOP_LEVEL, **{name: {} for name in (*sections, *optional)}}
    unknown = sorted(set(raw) - set(allowed_top))
    if unknown:
        other = [s for s in SCHEMA if s not in sections and s not in optional]
        hint = f" (section {unknown[0]!r} is not used by kind {kind!r})" if unknown[0] in other else ""
        raise RecipeError(f"recipe: unknown key {unknown[0]}{hint} (known: {', '.join(sorted(allowed_top))})")
    recipe: dict[str, Any] = {"kind": kind, "seed": raw.get("seed", 42), "description": raw.get("description", "")}
    if not isinstance(recipe["seed"], int) or isinstance(recipe["seed"], bool):
        raise RecipeError(f"recipe: seed must be an int, got {recipe['seed']!r}")
    for name in sections:
        recipe[name] = _check_keys(raw.get(name) or {}, SCHEMA[name], name)
    for name in optional:  # absent or null: the section is off (and left out, so older recipe hashes hold)
        if raw.get(name) is not None:
            recipe[name] = _check_keys(raw[name], SCHEMA[name], name)
    _check_model(recipe["model"])
    if kind == "grpo":
        recipe["rewards"] = _check_rewards(raw.get("rewards"))
    elif raw.get("rewards") is not None:
        raise RecipeError("recipe: rewards is only used by kind 'grpo'")
    if kind == "sft" and recipe["sft"]["mode"] not in SFT_MODES:
        raise RecipeError(f"recipe: sft.mode must be one of {SFT_MODES}, got {recipe['sft']['mode']!r}")
    if kind == "sft" and recipe["sft"]["pack"] not in (True, False):
        raise RecipeError(f"recipe: sft.pack must be true or false, got {recipe['sft']['pack']!r}")
    if kind == "sft" and recipe["sft"]["pack"] and recipe["sft"]["mode"] != "pretrain":
        raise RecipeError("recipe: sft.pack is for sft.mode pretrain only (SFT rows keep their own loss masks)")
    if kind == "sft" and not recipe["sft"]["pack"]:
        del recipe["sft"]["pack"]  # off: left out, so older recipe hashes hold
    if recipe.get("peft") is not None:
        _check_peft(recipe["peft"])
    recipe["training"] = _check_training(raw.get("training") or {}, kind)
    return recipe


def _check_peft(peft: dict) -> None:
    """LoRA settings: positive rank and alpha, dropout in [0, 1), a non-empty list of module names."""
    for key in ("r", "alpha"):
        if not isinstance(peft[key], int) or isinstance(peft[key], bool) or peft[key] < 1:
            raise RecipeError(f"recipe: peft.{key} must be a positive int, got {peft[key]!r}")
    if not isinstance(peft["dropout"], (int, float)) or isinstance(peft["dropout"], bool) \
            or not 0 <= peft["dropout"] < 1:
        raise RecipeError(f"recipe: peft.dropout must be a number in [0, 1), got {peft['dropout']!r}")
    modules = peft["target_modules"]
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
        raise RecipeError(f"recipe: peft.target_modules must be a non-empty list of module names, got {modules!r}")


def _check_model(model: dict) -> None:
    sources = [key for key in ("preset", "path") if model[key] is not None]
    if len(sources) != 1:
        raise RecipeError("recipe: model needs exactly one of model.preset or model.path "
                          "(model.native, an upstream .pth, takes its config from model.preset)")
    if model["native"] is not None and model["preset"] is None:
        raise RecipeError("recipe: model.native needs model.preset for the checkpoint's config")
    if model["config"] and model["path"] is not None:
        raise RecipeError("recipe: model.config overrides apply to model.preset only")
    if model["dtype"] not in ("float32", "bfloat16", "float16"):
        raise RecipeError(f"recipe: model.dtype must be float32, bfloat16 or float16, got {model['dtype']!r}")


def _check_rewards(rewards: Any) -> list[dict]:
    if not isinstance(rewards, list) or not rewards:
        raise RecipeError("recipe: rewards must be a non-empty list of {name, weight, options}")
    out = []
    for i, item in enumerate(rewards):
        item = {"name": item} if isinstance(item, str) else item
        entry = _check_keys(item, REWARD_KEYS, f"rewards.{i}")
        if not isinstance(entry["weight"], (int, float)) or isinstance(entry["weight"], bool):
            raise RecipeError(f"recipe: rewards.{i}.weight must be a number")
        out.append(entry)
    return out


def _check_training(training: dict, kind: str) -> dict:
    if not isinstance(training, dict):
        raise RecipeError("recipe: training must be a mapping of TrainingArguments fields")
    fields = _config_fields(kind)
    owned = {**OWNED_TRAINING_KEYS, **OWNED_BY_KIND[kind]}
    for key in sorted(training):
        if key in owned:
            raise RecipeError(f"recipe: training.{key} is set elsewhere: use {owned[key]}")
        if key not in fields:
            raise RecipeError(f"recipe: unknown key training.{key} (not a field of the {kind} training config)")
    return dict(training)


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Read, override, validate. Raises :class:`RecipeError` (or ``FileNotFoundError``)."""
    path = Path(path)
    with open(path, encoding="utf-8") as handle:
        try:
            raw = _yaml(handle) or {}
        except yaml.YAMLError as exc:
            raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(raw, dict) and isinstance(raw.get("rewards"), list):  # "name" shorthand -> {name: ...}
        raw["rewards"] = [{"name": item} if isinstance(item, str) else item for item in raw["rewards"]]
    for text in overrides:
        apply_override(raw, text)
    return validate_recipe(raw)


def recipe_sha256(recipe: dict) -> str:
    """Hash of the resolved recipe (canonical JSON), recorded in the manifest."""
    text = json.dumps(recipe, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
