"""The training kind ``grpo``: our GRPOTrainer subclass with the tool environment; sections
``objective`` and ``rollout``, top-level ``rewards``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from datasets import Dataset

from minimind_trl.conversation import prompt_turns
from minimind_trl.envs.environment import with_open_thinking
from minimind_trl.envs.protocol import MAX_TOOL_TURNS, MAX_TURN_TOKENS
from minimind_trl.objectives import PRESETS as OBJECTIVE_PRESETS, ObjectiveConfig
from minimind_trl.plugins import load_object
from minimind_trl.rewards.registry import build_reward_functions, reward_function_names
from minimind_trl.rewards.reward_model import reward_model_folder_problem
from minimind_trl.trainer.config import ROLLOUT_ENGINES, SAMPLING_STREAMS, MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer
from minimind_trl.trainer.kinds.registry import (
    TrainingKind,
    build_registry,
    eval_log,
    peft_config,
    register_kind,
)
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe_schema import (
    BOOLEAN,
    MAPPING,
    MAX_BATCH_ROWS,
    NAME,
    NAMES,
    REQUIRED,
    RecipeError,
    check_keys,
    int_at_least,
    number,
    one_line,
    one_of,
    recipe_key,
)

OBJECTIVE_FIELDS = tuple(f.name for f in dataclasses.fields(ObjectiveConfig))
REWARD_KEYS = {"name": REQUIRED, "weight": 1.0, "options": {}}


def objective_section() -> dict[str, Any]:
    """The ``objective`` section's schema: ``preset`` and every :class:`ObjectiveConfig` field.

    A field some preset sets defaults to None (= the preset's value); a field no preset sets
    (``beta``) to the dataclass default."""
    preset_fields = {name for values in OBJECTIVE_PRESETS.values() for name in values}
    section: dict[str, Any] = {"preset": "grpo"}
    for spec in dataclasses.fields(ObjectiveConfig):
        section[spec.name] = None if spec.name in preset_fields else spec.default
    return section


MAX_COMPLETION_TOKENS = MAX_TURN_TOKENS
"""Upper bound of ``rollout.max_completion_length``: MiniMind's context (max_position_embeddings)."""
MAX_GROUP_SIZE = 1024
"""Upper bound of ``rollout.group_size`` (the protocol uses 4 to 16)."""
MAX_ROLLOUT_COMPLETIONS = MAX_BATCH_ROWS
"""Upper bound of the completions of one rollout: ``prompts_per_rollout x group_size`` (the protocol:
8 x 4..16); without ``prompts_per_rollout``, each process's ``per_device_train_batch_size`` has it."""
GRPO_SECTIONS = {
    "objective": objective_section(),
    "rollout": {
        "group_size": 8, "prompts_per_rollout": None, "max_tool_turns": 3, "thinking_ratio": 0.1,
        "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "tools": [], "tool_names": None,
        "mask_truncated_completions": False, "engine": "minimind", "sampling_streams": "process",
    },
}
GRPO_VALUES = {
    "rollout.group_size": int_at_least(2, high=MAX_GROUP_SIZE),
    "rollout.prompts_per_rollout": int_at_least(1, null=True, high=MAX_ROLLOUT_COMPLETIONS),
    "rollout.max_tool_turns": int_at_least(0, high=MAX_TOOL_TURNS), "rollout.thinking_ratio": number(0, 1),
    "rollout.max_completion_length": int_at_least(1, high=MAX_COMPLETION_TOKENS),
    "rollout.temperature": number(0, above=True),
    "rollout.top_p": number(0, 1, above=True), "rollout.top_k": int_at_least(0),
    "rollout.tools": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v), "a list of specs"),
    "rollout.tool_names": NAMES, "rollout.mask_truncated_completions": BOOLEAN,
    "rollout.engine": one_of(ROLLOUT_ENGINES), "rollout.sampling_streams": one_of(SAMPLING_STREAMS),
}
GRPO_OWNED_TRAINING_KEYS = {
    "num_generations": "rollout.group_size",
    "generation_batch_size": "rollout.prompts_per_rollout",
    "steps_per_generation": "training.gradient_accumulation_steps x training.minibatches",
    "max_completion_length": "rollout.max_completion_length",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "max_tool_calling_iterations": "rollout.max_tool_turns",
    "mask_truncated_completions": "rollout.mask_truncated_completions",
    "rollout_engine": "rollout.engine",
    "sampling_streams": "rollout.sampling_streams",
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
}


def check_objective(objective: dict) -> None:
    """The objective section, checked by :class:`ObjectiveConfig` itself (preset, names, ranges)."""
    if objective["preset"] not in OBJECTIVE_PRESETS:
        raise RecipeError(f"recipe: objective.preset must be one of {', '.join(OBJECTIVE_PRESETS)}, "
                          f"got {objective['preset']!r}")
    overrides = {k: v for k, v in objective.items() if k != "preset" and v is not None}
    try:
        ObjectiveConfig.preset(objective["preset"], **overrides)
    except (ValueError, TypeError) as exc:
        text = one_line(exc)  # ObjectiveConfig's messages start with the field they reject
        raise RecipeError(f"recipe: objective.{text}" if text.split(" ")[0] in objective
                          else f"recipe: objective: {text}") from None


def check_rewards(rewards: Any) -> list[dict]:
    """``rewards``: a non-empty list of ``{name, weight, options}`` (a bare name is ``{name: ...}``)."""
    if not isinstance(rewards, list) or not rewards:
        raise RecipeError("recipe: rewards must be a non-empty list of {name, weight, options}")
    out = []
    for i, item in enumerate(rewards):
        item = {"name": item} if isinstance(item, str) else item
        entry = check_keys(item, REWARD_KEYS, f"rewards.{i}")
        for key, (ok, what) in {"name": NAME, "weight": number(), "options": MAPPING}.items():
            if not ok(entry[key]):
                raise RecipeError(f"recipe: rewards.{i}.{key} must be {what}, got {entry[key]!r}")
        out.append(entry)
    return out


def check_rollout_size(rollout: dict) -> None:
    """``prompts_per_rollout x group_size`` completions per rollout at most :data:`MAX_ROLLOUT_COMPLETIONS`."""
    prompts, group = rollout["prompts_per_rollout"], rollout["group_size"]
    if prompts is not None and prompts * group > MAX_ROLLOUT_COMPLETIONS:
        raise RecipeError(f"recipe: rollout.prompts_per_rollout x rollout.group_size = {prompts * group} completions "
                          f"per rollout; at most {MAX_ROLLOUT_COMPLETIONS}")


def _check_grpo(recipe: dict, raw: dict) -> None:
    check_objective(recipe["objective"])
    check_rollout_size(recipe["rollout"])
    recipe["rewards"] = check_rewards(raw.get("rewards"))


def check_grpo_plugins(recipe: dict) -> None:
    """Resolve the reward and tool plugins a GRPO recipe names (cheap: reward factories are not
    called), so that a typo fails before any model is built."""
    for i, spec in enumerate(recipe["rewards"]):
        name = spec["name"]
        if name == "reward_model":
            problem = reward_model_folder_problem((spec.get("options") or {}).get("path"))
            if problem is not None:
                raise RecipeError(f"recipe: rewards.{i}.options.path: {problem}")
        if name in reward_function_names():
            continue
        if not isinstance(name, str) or (":" not in name and not name.endswith(".py")):
            raise RecipeError(f"recipe: rewards.{i}.name: unknown reward function {name!r} "
                              f"(registered: {', '.join(reward_function_names())}; or a 'path/file.py:function' spec)")
        with recipe_key(f"rewards.{i}.name"):
            load_object(name)
    with recipe_key("rollout.tools"):
        build_registry(recipe["rollout"])


def grpo_config(recipe: dict, run_dir: str, processes: int) -> MiniMindGRPOConfig:
    """The :class:`MiniMindGRPOConfig` of a recipe (rollout and objective sections mapped to fields)."""
    rollout, objective = recipe["rollout"], recipe["objective"]
    training, _ = training_arguments(recipe)
    group = rollout["group_size"]
    accumulation = training.get("gradient_accumulation_steps", 1)
    minibatches = training.get("minibatches", 1)
    per_device = training.get("per_device_train_batch_size")
    prompts = rollout["prompts_per_rollout"]
    if prompts is not None:
        rows, slots = prompts * group, processes * accumulation * minibatches
        if rows % slots:
            raise RecipeError(
                f"recipe: rollout.prompts_per_rollout x group_size = {rows} completions do not split over "
                f"{processes} process(es) x {accumulation} accumulation steps x {minibatches} minibatches"
            )
        if per_device is not None and per_device != rows // slots:
            raise RecipeError(
                f"recipe: training.per_device_train_batch_size={per_device} but rollout.prompts_per_rollout="
                f"{prompts} x group_size={group} over {slots} slots needs {rows // slots}"
            )
        training["per_device_train_batch_size"] = rows // slots
    else:
        rows = training.get("per_device_train_batch_size", 8) * processes * accumulation * minibatches  # 8: TRL's
        if rows % group:
            raise RecipeError(
                f"recipe: rollout.group_size={group} does not divide the rollout: per_device_train_batch_size x "
                f"{processes} process(es) x gradient_accumulation_steps = {rows} completions"
            )
    fields = {
        "objective": objective["preset"],
        **{name: objective[name] for name in OBJECTIVE_FIELDS},  # MiniMindGRPOConfig has a field of each name
        "num_generations": group,
        "max_completion_length": rollout["max_completion_length"],
        "temperature": rollout["temperature"],
        "top_p": rollout["top_p"],
        "top_k": rollout["top_k"],
        "max_tool_calling_iterations": rollout["max_tool_turns"],
        "mask_truncated_completions": rollout["mask_truncated_completions"],
        "rollout_engine": rollout["engine"],
        "sampling_streams": rollout.get("sampling_streams", "process"),  # left out of the recipe when unset
        "reward_weights": [float(r["weight"]) for r in recipe["rewards"]],
    }
    return MiniMindGRPOConfig(output_dir=run_dir, seed=recipe["seed"], **fields, **training)


def grpo_dataset(rows: list[dict], thinking_ratio: float, seed: int) -> Dataset:
    """Task rows -> TRL prompt rows: ``prompt`` (messages), ``gt`` (JSON list), ``id``, ``open_thinking``."""
    out = []
    for i, row in enumerate(rows):
        if "conversations" not in row or "gt" not in row:
            raise RecipeError(f"data row {i} ({row.get('id')}): a GRPO task row needs 'conversations' and 'gt'")
        # The prompt (the one task-prompt rule: trailing empty assistant placeholders dropped) keeps
        # the system turn's `tools` JSON string: training renders exactly the tools the task offers,
        # as evaluation does (the environment falls back to all registry tools only for a prompt without one).
        prompt = prompt_turns(row["conversations"])
        out.append({"prompt": prompt, "gt": json.dumps(row["gt"], ensure_ascii=False), "id": str(row.get("id", i))})
    return Dataset.from_list(with_open_thinking(out, ratio=thinking_ratio, seed=seed))


def _grpo_data(recipe: dict, rows: list[dict], tokenizer) -> Dataset:
    return grpo_dataset(rows, recipe["rollout"]["thinking_ratio"], recipe["seed"])


def build_grpo_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """:class:`MiniMindToolGRPOTrainer` with the recipe's rewards and tools (one tool registry: the
    rollout runs it, and the reward factories that judge tool calls get it)."""
    registry = build_registry(recipe["rollout"])  # the rollout runs these tools; tool-aware rewards judge by them
    funcs, _ = build_reward_functions(recipe["rewards"], registry)
    return MiniMindToolGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=_grpo_data(recipe, rows, tokenizer),
        eval_dataset=None if eval_rows is None else _grpo_data(recipe, eval_rows, tokenizer),
        processing_class=tokenizer,
        tool_registry=registry,
        peft_config=peft_config(recipe),
        callbacks=eval_log(config, eval_rows),
    )


GRPO = register_kind(TrainingKind(
    name="grpo", config_class=MiniMindGRPOConfig, make_config=grpo_config, make_dataset=_grpo_data,
    make_trainer=build_grpo_trainer, sections=GRPO_SECTIONS, values=GRPO_VALUES,
    owned_training_keys=GRPO_OWNED_TRAINING_KEYS, top_level=("rewards",), check=_check_grpo, takes_peft=True,
    takes_eval_split=True, check_plugins=check_grpo_plugins, manifest_objective=lambda config: config.objective_dict(),
    manifest_replay=lambda config: config.replay_dict(),
))


