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
import math
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
    "data": {"path": _REQUIRED, "split": "train", "max_rows": None, "verify": True, "eval_split": None},
    "objective": {
        "preset": "grpo", "policy": None, "advantage": None, "reduction": None, "epsilon_low": None,
        "epsilon_high": None, "cispo_max": None, "fixed_length": None, "beta": 0.0,
    },
    "rollout": {
        "group_size": 8, "prompts_per_rollout": None, "max_tool_turns": 3, "thinking_ratio": 0.1,
        "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "tools": [], "tool_names": None,
        "mask_truncated_completions": False, "engine": "minimind",
    },
    "sft": {"max_length": 1024, "mode": "sft", "pack": False},
    "dpo": {"max_length": 1024, "beta": 0.1},
    "distill": {
        "teacher_path": _REQUIRED, "beta": 0.5, "max_completion_length": 256, "temperature": 1.0,
        "max_tool_turns": 3, "tool_names": None,
    },
    # optional: absent or null = full fine-tuning
    "peft": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": _REQUIRED, "target_parameters": None},
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
ROLLOUT_ENGINES = ("minimind", "trl")  # MiniMindGRPOConfig.rollout_engine
REWARD_KEYS = {"name": _REQUIRED, "weight": 1.0, "options": {}}


def _int(low: int, null: bool = False):
    return (lambda v: (null and v is None) or (type(v) is int and v >= low)), f"an int >= {low}" + " or null" * null


def _number(low: float | None = None, high: float | None = None, above: bool = False, null: bool = False):
    """A finite number >= low (> low with ``above``), <= high."""
    def ok(v):
        if null and v is None:
            return True
        return type(v) in (int, float) and math.isfinite(v) and (low is None or (v > low if above else v >= low)) \
            and (high is None or v <= high)
    span = "" if low is None else f" {'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")
    return ok, f"a finite number{span}" + " or null" * null


_BOOLEAN = (lambda v: type(v) is bool, "true or false")
_NAME = (lambda v: isinstance(v, str) and bool(v), "a non-empty string")
_MAPPING = (lambda v: isinstance(v, dict), "a mapping")
_NAMES = (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) and x for x in v)),
          "a list of names or null")
# Ranges and types of section values ("section.key" -> (test, what it must be)); the objective's
# fields are checked by ObjectiveConfig itself, the training fields below by _check_training.
VALUES = {
    "tokenizer.path": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a path or null"),
    "data.path": _NAME, "data.split": _NAME, "data.max_rows": _int(1, null=True), "data.verify": _BOOLEAN,
    "data.eval_split": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a split name or null"),
    "rollout.group_size": _int(2), "rollout.prompts_per_rollout": _int(1, null=True),
    "rollout.max_tool_turns": _int(0), "rollout.thinking_ratio": _number(0, 1),
    "rollout.max_completion_length": _int(1), "rollout.temperature": _number(0, above=True),
    "rollout.top_p": _number(0, 1, above=True), "rollout.top_k": _int(0),
    "rollout.tools": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v), "a list of specs"),
    "rollout.tool_names": _NAMES, "rollout.mask_truncated_completions": _BOOLEAN,
    "rollout.engine": (lambda v: v in ROLLOUT_ENGINES, f"one of {ROLLOUT_ENGINES}"),
    "sft.max_length": _int(1), "sft.mode": (lambda v: v in SFT_MODES, f"one of {SFT_MODES}"), "sft.pack": _BOOLEAN,
    "dpo.max_length": _int(1), "dpo.beta": _number(0, above=True),
    "distill.teacher_path": _NAME, "distill.beta": _number(0, 1), "distill.max_completion_length": _int(1),
    "distill.temperature": _number(0, above=True), "distill.max_tool_turns": _int(0), "distill.tool_names": _NAMES,
}
# TrainingArguments fields that transformers does not range-check (every kind).
TRAINING_VALUES = {
    "per_device_train_batch_size": _int(1), "per_device_eval_batch_size": _int(1),
    "gradient_accumulation_steps": _int(1), "num_iterations": _int(1),
    "max_steps": (lambda v: type(v) is int and (v == -1 or v >= 1), "an int >= 1, or -1 (use num_train_epochs)"),
    "num_train_epochs": _number(0, above=True), "learning_rate": _number(0),
    "save_steps": _number(0, above=True), "eval_steps": _number(0, above=True, null=True),
    "save_total_limit": _int(1, null=True),
    **{key: (lambda v: isinstance(v, str), "a string")
       for key in ("save_strategy", "eval_strategy", "logging_strategy", "lr_scheduler_type")},
}


def _check_values(recipe: dict) -> None:
    for where, (ok, what) in VALUES.items():
        section, key = where.split(".")
        values = recipe.get(section) or {}
        if key in values and not ok(values[key]):
            raise RecipeError(f"recipe: {where} must be {what}, got {values[key]!r}")


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
        "rollout_engine": "rollout.engine",
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


# A recipe is an untrusted file: its YAML graph may expand to at most this many nodes (aliases
# counted at every use), so an alias bomb is refused before anything walks the expanded data.
MAX_YAML_NODES = 10_000
MAX_RECIPE_BYTES = 1_000_000
_BOOL = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """Safe YAML (no ``!!python`` tags) for untrusted recipes: reads ``1e-5`` as a float (YAML 1.1
    needs ``1.0e-5``), only true/false as booleans (``no`` / ``on`` stay strings, as in YAML 1.2),
    refuses duplicate keys and graphs larger than :data:`MAX_YAML_NODES` once aliases expand."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _count_nodes(node, {}, set())
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _count_nodes(node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes of the graph under ``node`` with every alias expanded; raises past the budget."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise yaml.YAMLError("a recursive alias (a node that contains itself) is not allowed in a recipe")
    open_nodes.add(id(node))
    children = node.value if isinstance(node.value, list) else []
    total = 1
    for child in children:
        for part in (child if isinstance(child, tuple) else (child,)):
            total += _count_nodes(part, sizes, open_nodes)
            if total > MAX_YAML_NODES:
                raise yaml.YAMLError(f"the YAML expands to more than {MAX_YAML_NODES} nodes (alias expansion budget)")
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total


def _yaml(text_or_stream) -> Any:
    return yaml.load(text_or_stream, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML and library errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def located(path: str | Path, exc: BaseException) -> str:
    """``"PATH: key ..."``: a recipe error with the file named in place of ``recipe:``."""
    text = one_line(exc)
    return text if text.startswith(f"{path}: ") else f"{path}: {text.removeprefix('recipe: ')}"


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
        raise RecipeError(f"--set {key}: cannot parse value {value!r}: {one_line(exc)}") from None
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
    _check_text(raw, "")
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
    _check_values(recipe)
    if kind == "grpo":
        _check_objective(recipe["objective"])
        recipe["rewards"] = _check_rewards(raw.get("rewards"))
    elif raw.get("rewards") is not None:
        raise RecipeError("recipe: rewards is only used by kind 'grpo'")
    if kind == "sft" and recipe["sft"]["pack"] and recipe["sft"]["mode"] != "pretrain":
        raise RecipeError("recipe: sft.pack is for sft.mode pretrain only (SFT rows keep their own loss masks)")
    if kind == "sft" and not recipe["sft"]["pack"]:
        del recipe["sft"]["pack"]  # off: left out, so older recipe hashes hold
    if recipe["data"]["eval_split"] is None:
        del recipe["data"]["eval_split"]  # unset: left out, so older recipe hashes hold
    elif kind not in ("sft", "grpo"):
        raise RecipeError(f"recipe: data.eval_split is for kinds sft and grpo, not {kind!r}")
    if recipe.get("peft") is not None:
        _check_peft(recipe["peft"])
        if recipe["peft"]["target_parameters"] is None:
            del recipe["peft"]["target_parameters"]  # unset: left out, so older recipe hashes hold
    recipe["training"] = _check_training(raw.get("training") or {}, kind)
    return recipe


def _check_text(value: Any, where: str) -> None:
    """Every string (keys too) must be encodable text: YAML's "\\ud800" escape makes a lone surrogate."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_text(key, where)
        _check_text(item, f"{where}.{key}".lstrip("."))
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RecipeError(f"recipe: {where or 'a key'}: {value!r} is not valid text (a lone surrogate)") from None


def _check_peft(peft: dict) -> None:
    """LoRA settings: positive rank and alpha, dropout in [0, 1), a non-empty list of module names,
    optionally parameter names (PEFT's ``target_parameters``: LoRA on fused MoE expert tensors)."""
    for key in ("r", "alpha"):
        if not isinstance(peft[key], int) or isinstance(peft[key], bool) or peft[key] < 1:
            raise RecipeError(f"recipe: peft.{key} must be a positive int, got {peft[key]!r}")
    if not isinstance(peft["dropout"], (int, float)) or isinstance(peft["dropout"], bool) \
            or not 0 <= peft["dropout"] < 1:
        raise RecipeError(f"recipe: peft.dropout must be a number in [0, 1), got {peft['dropout']!r}")
    modules = peft["target_modules"]
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
        raise RecipeError(f"recipe: peft.target_modules must be a non-empty list of module names, got {modules!r}")
    parameters = peft["target_parameters"]
    if parameters is not None and (not isinstance(parameters, list) or not parameters
                                   or not all(isinstance(p, str) and p for p in parameters)):
        raise RecipeError("recipe: peft.target_parameters must be a non-empty list of parameter names "
                          f"(e.g. [mlp.experts.gate_up_proj, mlp.experts.down_proj]) or null, got {parameters!r}")


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
    for key in ("path", "native"):
        if model[key] is not None and (not isinstance(model[key], str) or not model[key]):
            raise RecipeError(f"recipe: model.{key} must be a path, got {model[key]!r}")
    if model["preset"] is None:
        return
    from minimind_trl.modeling import PRESETS, get_preset

    if model["preset"] not in PRESETS:
        raise RecipeError(f"recipe: model.preset: unknown preset {model['preset']!r} "
                          f"(known: {', '.join(sorted(PRESETS))})")
    if not isinstance(model["config"], dict):
        raise RecipeError(f"recipe: model.config must be a mapping of config fields, got {model['config']!r}")
    try:
        get_preset(model["preset"], **model["config"])
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"recipe: model.config: {one_line(exc).removeprefix('get_preset: ')}") from None


def _check_objective(objective: dict) -> None:
    """The objective section, checked by :class:`ObjectiveConfig` itself (preset, names, ranges)."""
    from minimind_trl.objectives import PRESETS, ObjectiveConfig

    if objective["preset"] not in PRESETS:
        raise RecipeError(f"recipe: objective.preset must be one of {', '.join(PRESETS)}, got {objective['preset']!r}")
    overrides = {k: v for k, v in objective.items() if k != "preset" and v is not None}
    try:
        ObjectiveConfig.preset(objective["preset"], **overrides)
    except (ValueError, TypeError) as exc:
        text = one_line(exc)  # ObjectiveConfig's messages start with the field they reject
        raise RecipeError(f"recipe: objective.{text}" if text.split(" ")[0] in objective
                          else f"recipe: objective: {text}") from None


def _check_rewards(rewards: Any) -> list[dict]:
    if not isinstance(rewards, list) or not rewards:
        raise RecipeError("recipe: rewards must be a non-empty list of {name, weight, options}")
    out = []
    for i, item in enumerate(rewards):
        item = {"name": item} if isinstance(item, str) else item
        entry = _check_keys(item, REWARD_KEYS, f"rewards.{i}")
        for key, (ok, what) in {"name": _NAME, "weight": _number(), "options": _MAPPING}.items():
            if not ok(entry[key]):
                raise RecipeError(f"recipe: rewards.{i}.{key} must be {what}, got {entry[key]!r}")
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
        ok, what = TRAINING_VALUES.get(key, (None, None))
        if ok is not None and not ok(training[key]):
            raise RecipeError(f"recipe: training.{key} must be {what}, got {training[key]!r}")
    _check_report_to(training.get("report_to"))
    return dict(training)


def _check_report_to(report_to: Any) -> None:
    """Tracker names (transformers' integrations), so a typo fails before any model is built."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    names = [report_to] if isinstance(report_to, str) else report_to
    if names is None:
        return
    known = ("all", "none", *sorted(INTEGRATION_TO_CALLBACK))
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise RecipeError(f"recipe: training.report_to must be a tracker name or a list of them, got {report_to!r}")
    for name in names:
        if name not in known:
            raise RecipeError(f"recipe: training.report_to: unknown tracker {name!r} (known: {', '.join(known)})")


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Read, override, validate. Raises :class:`RecipeError` (or ``FileNotFoundError``)."""
    path = Path(path)
    if path.is_file() and path.stat().st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: {path.stat().st_size} bytes; a recipe may have at most {MAX_RECIPE_BYTES}")
    with open(path, encoding="utf-8") as handle:
        try:
            raw = _yaml(handle) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise RecipeError(f"{path}: not valid YAML: {one_line(exc)}") from None
        except RecursionError:
            raise RecipeError(f"{path}: not valid YAML: nested too deeply") from None
    if isinstance(raw, dict) and isinstance(raw.get("rewards"), list):  # "name" shorthand -> {name: ...}
        raw["rewards"] = [{"name": item} if isinstance(item, str) else item for item in raw["rewards"]]
    for text in overrides:
        apply_override(raw, text)
    return validate_recipe(raw)


def recipe_sha256(recipe: dict) -> str:
    """Hash of the resolved recipe (canonical JSON), recorded in the manifest."""
    text = json.dumps(recipe, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
