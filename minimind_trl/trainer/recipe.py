"""Recipes: one YAML file per experimental condition, validated strictly (see docs/recipes.md).

``load_recipe(path, overrides)`` reads the YAML, merges its ``base:`` chain, applies ``--set
key=value`` overrides (dotted keys, values parsed as YAML), fills the defaults and validates: an
unknown key anywhere is an error that names it, and so is a key set in ``training`` that another
section owns. What it returns, the resolved recipe, is what the run manifest records and hashes.

``base: PATH`` (relative to the recipe file) names the recipe this one starts from; the file then
lists only what differs. Mappings merge key by key, at every depth; any other value (a list, a
scalar, ``null``) replaces the base's whole, so ``rewards: [...]`` replaces the base's list and
``peft: null`` turns its section off. A base may have a base (at most :data:`MAX_BASE_CHAIN` files
in one chain); a cycle, a missing file or a bad ``base`` value is one line naming the file.

Which sections a recipe has depends on its ``kind``: every kind has ``model``, ``tokenizer`` and
``data`` (here), its own sections and checks (:mod:`minimind_trl.trainer.kinds`: ``objective`` /
``rollout`` / ``rewards`` for grpo, ``sft``, ``dpo``, ``distill``), ``training`` (fields of the kind's
config class) and, where the kind takes it, the optional ``peft`` section (LoRA). An optional value
that is off (no ``peft``, no ``data.eval_split``, ``sft.pack: false``) is left out of the resolved
recipe, so recipes written before it keep their hash.
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
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

from minimind_trl.modeling import PRESETS as MODEL_PRESETS, get_preset
from minimind_trl.trainer.kinds import TrainingKind, get_kind, registered_kinds
from minimind_trl.trainer.precision import AUTO as AUTO_PRECISION
from minimind_trl.trainer.recipe_schema import (
    ATTN_IMPLEMENTATIONS,
    BOOLEAN,
    MAX_BATCH_ROWS,
    MODEL_DTYPES,
    NAME,
    PATH_MODEL_CONFIG_KEYS,
    REQUIRED,
    STRING,
    RecipeError,
    check_keys,
    check_values,
    int_at_least,
    located,
    number,
    one_line,
)

__all__ = [
    "MAX_BASE_CHAIN", "MAX_RECIPE_BYTES", "MAX_YAML_NODES", "SCHEDULERS_WITHOUT_WARMUP", "SCHEMA", "RecipeError",
    "apply_override", "load_recipe", "located", "merge_recipes", "one_line", "parse_override", "read_recipe_file",
    "recipe_sha256", "validate_recipe",
]

# top-level keys of every kind -> default (the kinds add theirs, e.g. grpo's `rewards`)
TOP_LEVEL = {"kind": "grpo", "seed": 42, "description": "", "training": {}}
# the sections every kind has: key -> default (REQUIRED: must be given)
COMMON_SECTIONS: dict[str, dict[str, Any]] = {
    "model": {"preset": None, "path": None, "native": None, "config": {}, "dtype": "float32"},
    "tokenizer": {"path": None, "allow_mismatch": False},
    "data": {"path": REQUIRED, "split": "train", "max_rows": None, "verify": True, "eval_split": None},
}
# optional, for the kinds that take it: absent or null = full fine-tuning
PEFT_SECTION = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": REQUIRED, "target_parameters": None}
NULL_TURNS_OFF = ("peft",)  # the optional sections: a child's null over its base's turns it off (not a slip)
# Ranges and types of the common sections' values ("section.key" -> (test, what it must be)); each
# kind checks its own sections' values (TrainingKind.values), the training fields below by _check_training.
VALUES = {
    "tokenizer.path": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a path or null"),
    "tokenizer.allow_mismatch": BOOLEAN,
    "data.path": NAME, "data.split": NAME, "data.max_rows": int_at_least(1, null=True), "data.verify": BOOLEAN,
    "data.eval_split": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a split name or null"),
}
# TrainingArguments fields that transformers does not range-check (every kind).
TRAINING_VALUES = {
    "per_device_train_batch_size": int_at_least(1, high=MAX_BATCH_ROWS),
    "per_device_eval_batch_size": int_at_least(1, high=MAX_BATCH_ROWS),
    "gradient_accumulation_steps": int_at_least(1), "num_iterations": int_at_least(1), "minibatches": int_at_least(1),
    "max_steps": (lambda v: type(v) is int and (v == -1 or v >= 1), "an int >= 1, or -1 (use num_train_epochs)"),
    "num_train_epochs": number(0, above=True), "learning_rate": number(0),
    "save_steps": number(0, above=True), "eval_steps": number(0, above=True, null=True),
    "save_total_limit": int_at_least(1, null=True), "warmup_steps": number(0),
    **{key: STRING for key in ("save_strategy", "eval_strategy", "logging_strategy", "lr_scheduler_type")},
    # true, false or auto (the default when unset): minimind_trl.trainer.precision
    "bf16": (lambda v: v is True or v is False or v == AUTO_PRECISION, "true, false or auto"),
}
# lr_scheduler_type values whose schedule has no warmup: transformers' get_scheduler does not pass
# num_warmup_steps to them, so a `training.warmup_steps` > 0 would be silently ignored. Value: the
# scheduler to use instead (None: no warmup variant of that schedule exists).
SCHEDULERS_WITHOUT_WARMUP = {"constant": "constant_with_warmup", "reduce_lr_on_plateau": None, "greedy": None}
# training keys that a section owns, for every kind: key -> where to set it instead (each kind adds its own)
OWNED_TRAINING_KEYS = {
    "output_dir": "the --output-dir option",
    "seed": "the top-level `seed`",
    "data_seed": "the top-level `seed`",
}


def _all_sections() -> dict[str, dict[str, Any]]:
    """Every section of the registered kinds: the common ones, each kind's, then ``peft``."""
    sections = dict(COMMON_SECTIONS)
    for kind in registered_kinds():
        sections.update(kind.sections)
    return {**sections, "peft": PEFT_SECTION}


SCHEMA: dict[str, dict[str, Any]] = _all_sections()
"""section -> key -> default, for the built-in kinds (documentation and tools; validation asks the kinds)."""


# A recipe is an untrusted file: its YAML graph may expand to at most this many nodes (aliases
# counted at every use), so an alias bomb is refused before anything walks the expanded data.
MAX_YAML_NODES = 10_000
# (section, key) -> the "unset" value that is left out of the resolved recipe: these keys came after
# recipes were first hashed, so leaving them out when unset keeps every older run's recipe_sha256.
LEFT_OUT_WHEN_UNSET: dict[tuple[str, str], Any] = {
    ("data", "eval_split"): None,
    ("peft", "target_parameters"): None,
    ("sft", "pack"): False,
    ("rollout", "sampling_streams"): "process",
}
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


MAX_BASE_CHAIN = 8  # files in one chain of bases (the recipe, its base, its base's base, ...)


def _read_file(path: Path) -> Any:
    """One YAML file, bounded (size, node budget, duplicate keys): its data, ``{}`` when empty."""
    if path.is_dir():
        raise RecipeError(f"{path}: is a folder; name a recipe file (e.g. {path}/grpo.yaml)")
    try:
        if path.is_file() and path.stat().st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"{path}: {path.stat().st_size} bytes; a recipe may have at most {MAX_RECIPE_BYTES}")
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink loop, no permission, ...
        raise RecipeError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    with handle:
        try:
            text = handle.read(MAX_RECIPE_BYTES + 1)  # bounded also where no size is known (/dev/stdin, a pipe)
            if len(text.encode("utf-8")) > MAX_RECIPE_BYTES:
                raise RecipeError(f"{path}: more than {MAX_RECIPE_BYTES} bytes; a recipe may have at most that")
            return _yaml(text) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise RecipeError(f"{path}: not valid YAML: {one_line(exc)}") from None
        except RecursionError:
            raise RecipeError(f"{path}: not valid YAML: nested too deeply") from None


def merge_recipes(base: dict, override: dict) -> dict:
    """``override`` laid over ``base`` (a new dict): where both hold a mapping they merge key by key,
    recursively; any other value of ``override`` (a list, a scalar, null) replaces the base's whole."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_recipes(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read_recipe_file(path: str | Path) -> Any:
    """The data of a recipe file with its ``base:`` chain merged in (before overrides and validation).

    Raises ``FileNotFoundError`` when ``path`` itself is missing, and a one-line :class:`RecipeError`
    naming the file for a bad, missing or cyclic base or a chain longer than :data:`MAX_BASE_CHAIN`."""
    return _read_chain(Path(path), ())


def _read_chain(path: Path, below: tuple[Path, ...]) -> Any:
    """``path``'s data over its bases; ``below`` holds the (resolved) files that named this one."""
    raw = _read_file(path)
    if not isinstance(raw, dict) or "base" not in raw:
        return raw
    base = raw.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise RecipeError(f"{path}: base must be the path of a recipe file (relative to this one), got {base!r}")
    base_path = path.parent / base
    try:
        chain = (*below, path.resolve())
        resolved = base_path.resolve()
    except (RuntimeError, OSError):  # RuntimeError: a symlink loop (pathlib)
        raise RecipeError(f"{path}: base {base}: a symlink loop or an unreadable path ({base_path})") from None
    if resolved in chain:
        names = " -> ".join(str(p) for p in (*chain, resolved))
        raise RecipeError(f"{path}: base {base}: a cycle of bases ({names})")
    if len(chain) >= MAX_BASE_CHAIN:
        raise RecipeError(f"{path}: base {base}: more than {MAX_BASE_CHAIN} files in one chain of bases")
    if not base_path.is_file():
        raise RecipeError(f"{path}: base {base}: no such file {base_path}")
    parent = _read_chain(base_path, chain)
    if not isinstance(parent, dict):
        raise RecipeError(f"{base_path}: a base must hold a mapping of sections")
    nulled = next(_nulled_mappings(parent, raw), None)
    if nulled is not None:
        raise RecipeError(f"{path}: {nulled} is empty (null) and would drop every key its base {base} sets under "
                          f"{nulled}; remove the line, or list the keys to change under it")
    return merge_recipes(parent, raw)


def _nulled_mappings(parent: dict, child: dict, prefix: str = ""):
    """Dotted keys where ``child`` holds null over a non-empty mapping of ``parent``: a key left empty
    (``training:`` with every line under it commented out) would replace the base's whole section."""
    for key, value in child.items():
        where = f"{prefix}{key}"
        below = parent.get(key)
        if value is None and isinstance(below, dict) and below and where not in NULL_TURNS_OFF:
            yield where
        elif isinstance(value, dict) and isinstance(below, dict):
            yield from _nulled_mappings(below, value, f"{where}.")


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


def _owners(key: str) -> str:
    names = [kind.name for kind in registered_kinds() if key in kind.top_level]
    return f"kind {names[0]!r}" if len(names) == 1 else "kinds " + ", ".join(repr(name) for name in names)


def _kinds_with(flag: str) -> str:
    names = [kind.name for kind in registered_kinds() if getattr(kind, flag)]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def validate_recipe(raw: dict) -> dict:
    """Defaults filled in, every key checked; returns a new dict (the resolved recipe)."""
    if not isinstance(raw, dict):
        raise RecipeError("recipe: the file must hold a mapping of sections")
    _check_text(raw, "")
    kind = get_kind(raw.get("kind", TOP_LEVEL["kind"]))
    sections = {**COMMON_SECTIONS, **kind.sections}
    optional = {"peft": PEFT_SECTION} if kind.takes_peft else {}
    kinds_top_level = [key for other in registered_kinds() for key in other.top_level]
    allowed_top = {**TOP_LEVEL, **dict.fromkeys(kinds_top_level), **{name: {} for name in (*sections, *optional)}}
    unknown = sorted(set(raw) - set(allowed_top))
    if unknown:
        other = [s for s in _all_sections() if s not in sections and s not in optional]
        hint = f" (section {unknown[0]!r} is not used by kind {kind.name!r})" if unknown[0] in other else ""
        if unknown[0] == "base":
            hint = " (a recipe file's base is merged when load_recipe reads the file; --set cannot name one)"
        raise RecipeError(f"recipe: unknown key {unknown[0]}{hint} (known: {', '.join(sorted(allowed_top))})")
    recipe: dict[str, Any] = {"kind": kind.name, "seed": raw.get("seed", 42), "description": raw.get("description", "")}
    if not isinstance(recipe["seed"], int) or isinstance(recipe["seed"], bool) or not 0 <= recipe["seed"] < 2**32:
        raise RecipeError(f"recipe: seed must be an int in [0, 2**32 - 1] (numpy's seed range), got {recipe['seed']!r}")
    for name, schema in sections.items():
        recipe[name] = check_keys(raw.get(name) or {}, schema, name)
    for name, schema in optional.items():  # absent or null: the section is off (and left out, so older hashes hold)
        if raw.get(name) is not None:
            recipe[name] = check_keys(raw[name], schema, name)
    _check_model(recipe["model"])
    check_values(recipe, {**VALUES, **kind.values})
    for key in kinds_top_level:
        if key not in kind.top_level and raw.get(key) is not None:
            raise RecipeError(f"recipe: {key} is only used by {_owners(key)}")
    kind.check(recipe, raw)  # the kind's own checks; fills its top-level keys (grpo: rewards)
    if recipe["data"]["eval_split"] is not None and not kind.takes_eval_split:
        raise RecipeError(f"recipe: data.eval_split is for kinds {_kinds_with('takes_eval_split')}, not {kind.name!r}")
    if recipe.get("peft") is not None:
        _check_peft(recipe["peft"])
    recipe["training"] = _check_training(raw.get("training") or {}, kind)
    _leave_out_unset(recipe)
    return recipe


def _leave_out_unset(recipe: dict) -> None:
    """Drop every key of :data:`LEFT_OUT_WHEN_UNSET` that holds its unset value: the one place the
    resolved recipe (and so :func:`recipe_sha256`) is canonicalised."""
    for (section, key), unset in LEFT_OUT_WHEN_UNSET.items():
        part = recipe.get(section)
        if isinstance(part, dict) and key in part and part[key] is unset:
            del part[key]


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
    if model["path"] is not None and model["config"]:
        _check_path_model_config(model["config"])
    if not isinstance(model["dtype"], str) or model["dtype"] not in MODEL_DTYPES:
        raise RecipeError(f"recipe: model.dtype must be float32, bfloat16 or float16, got {model['dtype']!r}")
    for key in ("path", "native"):
        if model[key] is not None and (not isinstance(model[key], str) or not model[key]):
            raise RecipeError(f"recipe: model.{key} must be a path, got {model[key]!r}")
    if model["preset"] is None:
        return
    if model["preset"] not in MODEL_PRESETS:
        raise RecipeError(f"recipe: model.preset: unknown preset {model['preset']!r} "
                          f"(known: {', '.join(sorted(MODEL_PRESETS))})")
    if not isinstance(model["config"], dict):
        raise RecipeError(f"recipe: model.config must be a mapping of config fields, got {model['config']!r}")
    try:
        get_preset(model["preset"], **model["config"])
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"recipe: model.config: {one_line(exc).removeprefix('get_preset: ')}") from None


def _check_path_model_config(config: Any) -> None:
    """With ``model.path`` the folder's config.json fixes the architecture; ``model.config`` may only
    choose how attention runs (``PATH_MODEL_CONFIG_KEYS``), one of the two the prefix-shared pass
    implements (``ATTN_IMPLEMENTATIONS``)."""
    if not isinstance(config, dict):
        raise RecipeError(f"recipe: model.config must be a mapping of config fields, got {config!r}")
    other = sorted(set(config) - set(PATH_MODEL_CONFIG_KEYS))
    if other:
        raise RecipeError(f"recipe: model.config with model.path takes only {', '.join(PATH_MODEL_CONFIG_KEYS)} "
                          f"(the folder's config.json fixes the architecture), got {other}")
    value = config["attn_implementation"]
    if value not in ATTN_IMPLEMENTATIONS:
        raise RecipeError(f"recipe: model.config.attn_implementation must be one of "
                          f"{', '.join(ATTN_IMPLEMENTATIONS)}, got {value!r}")


def _check_training(training: dict, kind: TrainingKind) -> dict:
    if not isinstance(training, dict):
        raise RecipeError("recipe: training must be a mapping of TrainingArguments fields")
    fields = kind.training_fields()
    owned = {**OWNED_TRAINING_KEYS, **kind.owned_training_keys}
    for key in sorted(training):
        if key in owned:
            raise RecipeError(f"recipe: training.{key} is set elsewhere: use {owned[key]}")
        if key not in fields:
            raise RecipeError(f"recipe: unknown key training.{key} (not a field of the {kind.name} training config)")
        ok, what = TRAINING_VALUES.get(key, (None, None))
        if ok is not None and not ok(training[key]):
            raise RecipeError(f"recipe: training.{key} must be {what}, got {training[key]!r}")
    _check_report_to(training.get("report_to"))
    _check_warmup(training, kind)
    return dict(training)


def _training_default(kind: TrainingKind, key: str) -> Any:
    """The default of field ``key`` of the kind's training config (what an unset ``training.key``
    means); None when the config has no such field or no default."""
    spec = {f.name: f for f in dataclasses.fields(kind.config_class)}.get(key)
    if spec is None or spec.default is not dataclasses.MISSING:
        return None if spec is None else spec.default
    return None if spec.default_factory is dataclasses.MISSING else spec.default_factory()


def _check_warmup(training: dict, kind: TrainingKind) -> None:
    """``training.warmup_steps`` > 0 (a step count, or below 1 a fraction of the steps) with a scheduler
    that has no warmup (:data:`SCHEDULERS_WITHOUT_WARMUP`) would be ignored without a word: refused."""
    warmup = training.get("warmup_steps", _training_default(kind, "warmup_steps"))
    scheduler = training.get("lr_scheduler_type", _training_default(kind, "lr_scheduler_type"))
    scheduler = getattr(scheduler, "value", scheduler)  # a SchedulerType default
    if not warmup or scheduler not in SCHEDULERS_WITHOUT_WARMUP:
        return
    instead = SCHEDULERS_WITHOUT_WARMUP[scheduler]
    fix = f"use lr_scheduler_type: {instead}, or warmup_steps: 0" if instead else \
        "set warmup_steps: 0, or use a scheduler with a warmup (e.g. constant_with_warmup)"
    raise RecipeError(f"recipe: training.warmup_steps={warmup!r} would be ignored: lr_scheduler_type "
                      f"{scheduler!r} has no warmup; {fix}")


def _check_report_to(report_to: Any) -> None:
    """Tracker names (transformers' integrations), so a typo fails before any model is built."""
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
    """Read (bases merged), override, validate: the resolved recipe. Raises :class:`RecipeError`
    (or ``FileNotFoundError`` when ``path`` is missing)."""
    raw = read_recipe_file(path)
    if isinstance(raw, dict) and isinstance(raw.get("rewards"), list):  # "name" shorthand -> {name: ...}
        raw["rewards"] = [{"name": item} if isinstance(item, str) else item for item in raw["rewards"]]
    for text in overrides:
        apply_override(raw, text)
    return validate_recipe(raw)


def recipe_sha256(recipe: dict) -> str:
    """Hash of the resolved recipe (canonical JSON), recorded in the manifest."""
    text = json.dumps(recipe, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
