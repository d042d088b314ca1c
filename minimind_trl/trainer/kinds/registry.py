"""The training-kind registry: :class:`TrainingKind`, :func:`register_kind`, :func:`get_kind`, and
the helpers several kinds share (LoRA config, the run's tool registry, the metrics callbacks).

See :mod:`minimind_trl.trainer.kinds` for what a kind owns; each built-in kind lives in its own
module beside this one and registers itself when imported.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from peft import LoraConfig

from minimind_trl.envs.tools import run_registry
from minimind_trl.run_folder import METRICS
from minimind_trl.trainer.callbacks import EVAL_METRICS_FILE, EvalLogCallback, LogHistoryCallback
from minimind_trl.trainer.recipe_schema import (
    RecipeError,
    ValueTest,
)


def _nothing(*args: Any) -> None:
    return None


@dataclass(frozen=True)
class TrainingKind:
    """One recipe ``kind:``: its sections, checks, config class, and dataset and trainer builders.

    The builders take the resolved recipe (:func:`minimind_trl.trainer.recipe.validate_recipe`):

    * ``make_config(recipe, run_dir, processes) -> config`` (an instance of ``config_class``;
      ``processes`` is the launch's world size, over which GRPO splits its rollout);
    * ``make_dataset(recipe, rows, tokenizer) -> datasets.Dataset`` (one split's rows);
    * ``make_trainer(recipe, config, model, tokenizer, rows, eval_rows) -> trainer`` (``eval_rows``
      is None unless the kind takes ``data.eval_split``).
    """

    name: str
    config_class: type
    make_config: Callable[[dict, str, int], Any]
    make_dataset: Callable[[dict, list[dict], Any], Dataset]
    make_trainer: Callable[..., Any]
    # section -> key -> default (REQUIRED: must be given), in the order the resolved recipe lists them
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # "section.key" -> (test, what it must be)
    values: Mapping[str, ValueTest] = field(default_factory=dict)
    # training-config fields that a section sets instead: field -> where to set it
    owned_training_keys: Mapping[str, str] = field(default_factory=dict)
    # top-level keys (besides the sections) this kind owns; `check` resolves them into the recipe
    top_level: tuple[str, ...] = ()
    # check(resolved recipe, raw recipe): cross-key checks once the sections' values are checked;
    # fills the kind's top-level keys (keys left out when unset: recipe.LEFT_OUT_WHEN_UNSET)
    check: Callable[[dict, dict], None] = _nothing
    takes_peft: bool = False  # the optional `peft` section (LoRA) applies
    takes_eval_split: bool = False  # `data.eval_split`: evaluation during training
    # resolve the plugins the recipe names (cheap), so that a typo fails before any model is built
    check_plugins: Callable[[dict], None] = _nothing
    # what the run manifest records as `objective`, from the built training config
    manifest_objective: Callable[[Any], dict | None] = _nothing
    # what the run manifest records as `replay` (passes, minibatches, updates per rollout), or None
    manifest_replay: Callable[[Any], dict | None] = _nothing
    # the model the recipe's `model` section builds: "causal_lm" or "sequence_classification" (one
    # label: a reward model)
    model_head: str = "causal_lm"

    def training_fields(self) -> set[str]:
        """The fields of the kind's training config: the allowed ``training`` keys."""
        return {f.name for f in dataclasses.fields(self.config_class) if f.init}


_KINDS: dict[str, TrainingKind] = {}


def register_kind(kind: TrainingKind, *, replace: bool = False) -> TrainingKind:
    """Add ``kind`` to the registry (``replace=True`` to swap a registered one); returns it."""
    if kind.name in _KINDS and not replace:
        raise ValueError(f"training kind {kind.name!r} is already registered (pass replace=True)")
    _KINDS[kind.name] = kind
    return kind


def kind_names() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS)


def registered_kinds() -> tuple[TrainingKind, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS.values())


def get_kind(name: Any) -> TrainingKind:
    """The registered kind ``name``; a :class:`RecipeError` naming ``kind`` otherwise."""
    if not isinstance(name, str) or name not in _KINDS:
        raise RecipeError(f"recipe: kind must be one of {kind_names()}, got {name!r}")
    return _KINDS[name]



def peft_config(recipe: dict) -> LoraConfig | None:
    """A ``peft.LoraConfig`` from the recipe's ``peft`` section, or None (full fine-tuning)."""
    spec = recipe.get("peft")
    if spec is None:
        return None
    parameters = spec.get("target_parameters")
    return LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=float(spec["dropout"]),
                      target_modules=list(spec["target_modules"]), task_type="CAUSAL_LM",
                      target_parameters=list(parameters) if parameters else None)


def build_registry(rollout: dict):
    """The default tools plus ``rollout.tools`` plugins, restricted to ``rollout.tool_names`` if given."""
    try:
        return run_registry(rollout["tools"], rollout["tool_names"])
    except ValueError as error:
        raise RecipeError(f"recipe: rollout.tool_names: {error}") from None


def eval_log(config, eval_rows: list[dict] | None) -> list | None:
    """The callback that writes each evaluation during training to ``eval_metrics.jsonl``."""
    return None if eval_rows is None else [EvalLogCallback(os.path.join(config.output_dir, EVAL_METRICS_FILE))]


def log_history_callback(config) -> LogHistoryCallback:
    """``metrics.jsonl`` for TRL's trainers (the GRPO trainer writes its own)."""
    return LogHistoryCallback(os.path.join(config.output_dir, METRICS))


