"""From a resolved recipe to the objects a run needs: tokenizer, model, data splits, config, trainer.

The pieces every kind shares live here (tokenizer, model, the split files and their manifest
entries); the kind-specific ones (config, dataset, trainer, plugins) are the recipe kind's, found
through :func:`minimind_trl.trainer.kinds.get_kind` (see that module for grpo, sft, dpo and
distill). ``minimind-trl train`` calls :func:`training_config`, :func:`check_plugins` and
:func:`build_trainer` through this module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from minimind_trl.data.manifest import verify_manifest
from minimind_trl.fsio import DataError, DataFormatError, iter_jsonl_objects, sha256_file
from minimind_trl.modeling import (
    MiniMindForCausalLM,
    MiniMindForSequenceClassification,
    get_preset,
    load_native_checkpoint,
)
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.tokenization.loading import TokenizerMismatchError, resolve_tokenizer_folder
from minimind_trl.trainer.kinds import get_kind
from minimind_trl.trainer.recipe_schema import MODEL_DTYPES, RecipeError, one_line
from minimind_trl.trainer.zero3 import init_deepspeed_comm_on_cpu

__all__ = [
    "build_model", "build_tokenizer", "build_trainer", "check_plugins", "load_eval_split", "load_split",
    "tokenizer_folder", "training_config", "world_size",
]

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # what from_pretrained may look up on the Hub


def world_size() -> int:
    """Processes of this launch (``WORLD_SIZE`` from torchrun / accelerate, else 1)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def tokenizer_folder(recipe: dict) -> Path | None:
    """The tokenizer folder a recipe trains with (None: the packaged one): ``tokenizer.path``, else
    the ``model.path`` folder's own tokenizer; a ``tokenizer.path`` that differs from the model
    folder's own is a RecipeError unless ``tokenizer.allow_mismatch``
    (:func:`~minimind_trl.tokenization.loading.resolve_tokenizer_folder`)."""
    spec = recipe["tokenizer"]
    try:
        return resolve_tokenizer_folder(recipe["model"]["path"], spec["path"], spec["allow_mismatch"])
    except TokenizerMismatchError as exc:
        raise RecipeError(f"recipe: tokenizer.path: {exc}") from None


def build_tokenizer(recipe: dict):
    """The tokenizer of :func:`tokenizer_folder`."""
    return load_tokenizer(tokenizer_folder(recipe))


def build_model(spec: dict, head: str = "causal_lm"):
    """A MiniMind preset (random init, or an upstream ``.pth`` via ``native``) or a Hub folder, as a
    causal LM or, with ``head="sequence_classification"``, a one-label sequence classifier (the
    backbone's weights, a new ``score`` head: a reward model to train)."""
    dtype = MODEL_DTYPES[spec["dtype"]]
    if head == "sequence_classification":
        if spec["native"] is not None:
            raise RecipeError("recipe: model.native: a reward model starts from a model folder or a preset")
        if spec["path"] is not None:
            if not Path(spec["path"]).is_dir():
                raise RecipeError(f"recipe: model.path: no such folder {spec['path']}")
            model = AutoModelForSequenceClassification.from_pretrained(spec["path"], num_labels=1, dtype=dtype,
                                                                       **spec["config"])
            model.config.auto_map = None  # the causal LM's remote-code entries name no classifier: drop them
            return model
        config = get_preset(spec["preset"], **spec["config"])
        config.num_labels = 1
        return MiniMindForSequenceClassification(config).to(dtype)
    if spec["path"] is not None:
        if not Path(spec["path"]).is_dir() and not _REPO_ID.fullmatch(spec["path"]):
            raise RecipeError(f"recipe: model.path: no such folder {spec['path']}")
        return AutoModelForCausalLM.from_pretrained(spec["path"], dtype=dtype, **spec["config"])  # attention only
    if spec["native"] is not None and not Path(spec["native"]).is_file():
        raise RecipeError(f"recipe: model.native: no such file {spec['native']}")
    config = get_preset(spec["preset"], **spec["config"])
    if spec["native"] is not None:
        return load_native_checkpoint(spec["native"], config, dtype=dtype).train()
    return MiniMindForCausalLM(config).to(dtype)


def load_eval_split(spec: dict) -> tuple[list[dict] | None, dict[str, Any] | None]:
    """Rows of ``data.path/<data.eval_split>.jsonl`` (every row) and their manifest entry, or Nones."""
    if spec.get("eval_split") is None:
        return None, None
    return load_split({**spec, "split": spec["eval_split"], "max_rows": None})


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
            try:
                verify_manifest(folder)
            except (DataError, ValueError) as exc:
                raise RecipeError(f"recipe: data.path: {exc}") from None
            info["verified"] = True
    elif spec["verify"]:
        raise RecipeError(f"recipe: {folder} has no manifest.json (set data.verify: false to train anyway)")
    try:
        rows = [row for _, row in iter_jsonl_objects(split_file)]
    except DataFormatError as exc:
        raise RecipeError(f"recipe: data.path: {exc}") from None
    if spec["max_rows"] is not None:
        rows = rows[: spec["max_rows"]]
    if not rows:
        raise RecipeError(f"recipe: {split_file} has no rows")
    info["rows"] = len(rows)
    return rows, info


def check_plugins(recipe: dict) -> None:
    """Resolve the plugins the recipe names (the kind's: GRPO's rewards and tools), so that a typo
    fails before any model is built."""
    get_kind(recipe["kind"]).check_plugins(recipe)


def training_config(recipe: dict, run_dir: str):
    """The kind's training config; building it also sets up the distributed state (process group)."""
    try:
        config = get_kind(recipe["kind"]).make_config(recipe, run_dir, world_size())
    except (ValueError, TypeError) as exc:  # the config classes' own checks (TRL, transformers, ours)
        if isinstance(exc, RecipeError):
            raise
        raise RecipeError(f"recipe: training: {one_line(exc)}") from None
    _ = config.world_size  # make sure accelerate's state exists before anything else uses it
    init_deepspeed_comm_on_cpu(bool(getattr(config, "use_cpu", False)))
    return config


def build_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """The trainer of the recipe's kind (GRPO with the tool environment, SFT, DPO, distillation);
    ``eval_rows`` (``data.eval_split``) for evaluation during training (``training.eval_strategy``)."""
    return get_kind(recipe["kind"]).make_trainer(recipe, config, model, tokenizer, rows, eval_rows)
