"""The vocabulary recipes are checked with: the error type, one-line messages, section schemas and value tests.

A section schema maps each key to its default, or to :data:`REQUIRED` (the key must be given);
:func:`check_keys` resolves a section against it. A value test is a pair ``(test, what it must
be)``; :func:`check_values` applies a table of them (``"section.key" -> test``) to a resolved
recipe. Every failure is a :class:`RecipeError` whose message names the key (``recipe: KEY ...``);
:func:`located` puts the recipe file's name in place of ``recipe:``.

This module is the ground the recipe loader (:mod:`minimind_trl.trainer.recipe`), the training
kinds (:mod:`minimind_trl.trainer.kinds`) and the builders (:mod:`minimind_trl.trainer.build`)
stand on; it imports nothing of theirs.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

ValueTest = tuple[Callable[[Any], bool], str]  # (does the value pass?, what it must be, for the message)


class RecipeError(ValueError):
    """An invalid recipe; the message names the offending key."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Default of a section key that the recipe must set."""

MAX_BATCH_ROWS = 16_384
"""Upper bound of the rows one batch or rollout holds: ``training.per_device_train_batch_size`` /
``per_device_eval_batch_size`` and GRPO's ``prompts_per_rollout x group_size`` (the protocol: 8 x 4..16)."""

# model.dtype -> the torch dtype the weights are loaded in (mixed precision is training.bf16)
MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# model.config keys a model.path recipe may set: how the loaded model runs, not what it is
PATH_MODEL_CONFIG_KEYS = ("attn_implementation",)
# the attention kernels the prefix-shared policy pass implements (trainer/policy_pass.py)
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML and library errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def located(path: str | Path, exc: BaseException) -> str:
    """``"PATH: key ..."``: a recipe error with the file named in place of ``recipe:``."""
    text = one_line(exc)
    return text if text.startswith(f"{path}: ") else f"{path}: {text.removeprefix('recipe: ')}"


@contextlib.contextmanager
def recipe_key(key: str):
    """An error while building what recipe key ``key`` names becomes a one-line RecipeError naming it."""
    try:
        yield
    except RecipeError:
        raise
    except Exception as exc:
        raise RecipeError(f"recipe: {key}: {type(exc).__name__}: {one_line(exc)}") from exc


def int_at_least(low: int, null: bool = False, high: int | None = None) -> ValueTest:
    """An int (not a bool) >= ``low`` (and <= ``high``); with ``null`` also None."""
    what = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
    return ((lambda v: (null and v is None) or (type(v) is int and v >= low and (high is None or v <= high))),
            what + " or null" * null)


def number(low: float | None = None, high: float | None = None, above: bool = False, null: bool = False) -> ValueTest:
    """A finite int or float >= ``low`` (> ``low`` with ``above``), <= ``high``; with ``null`` also None."""
    def ok(v):
        if null and v is None:
            return True
        return type(v) in (int, float) and math.isfinite(v) and (low is None or (v > low if above else v >= low)) \
            and (high is None or v <= high)
    span = "" if low is None else f" {'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")
    return ok, f"a finite number{span}" + " or null" * null


def one_of(choices: tuple[str, ...]) -> ValueTest:
    return (lambda v: v in choices), f"one of {choices}"


BOOLEAN: ValueTest = (lambda v: type(v) is bool, "true or false")
NAME: ValueTest = (lambda v: isinstance(v, str) and bool(v), "a non-empty string")
MAPPING: ValueTest = (lambda v: isinstance(v, dict), "a mapping")
NAMES: ValueTest = (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) and x for x in v)),
                    "a list of names or null")
STRING: ValueTest = (lambda v: isinstance(v, str), "a string")


def check_keys(given: Any, allowed: Mapping[str, Any], where: str) -> dict:
    """``given`` resolved against the schema ``allowed``: unknown keys and missing required keys
    raise; absent keys take (a copy of) their default. Keys come out in the schema's order."""
    if not isinstance(given, dict):
        raise RecipeError(f"recipe: {where} must be a mapping, got {type(given).__name__}")
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise RecipeError(f"recipe: unknown key {where}.{unknown[0]} (known: {', '.join(sorted(allowed))})")
    resolved = {}
    for key, default in allowed.items():
        if key in given:
            resolved[key] = given[key]
        elif default is REQUIRED:
            raise RecipeError(f"recipe: {where}.{key} is required")
        else:
            resolved[key] = copy.deepcopy(default)
    return resolved


def check_values(recipe: Mapping[str, Any], tests: Mapping[str, ValueTest]) -> None:
    """Apply ``tests`` (``"section.key" -> (test, what)``) to the values present in ``recipe``."""
    for where, (ok, what) in tests.items():
        section, key = where.split(".")
        values = recipe.get(section) or {}
        if key in values and not ok(values[key]):
            raise RecipeError(f"recipe: {where} must be {what}, got {values[key]!r}")
