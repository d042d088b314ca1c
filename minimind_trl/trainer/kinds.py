"""Training kinds: what each recipe ``kind:`` owns, in one registry (as the objectives have theirs).

A :class:`TrainingKind` holds everything that differs between kinds:

* its recipe sections (key -> default, :data:`REQUIRED` when the recipe must set it), the value
  tests of their keys, the top-level keys it owns (``rewards`` for grpo) and its cross-key checks;
* its training-config class (its fields are the allowed ``training`` keys), the ``training`` keys
  a section sets instead (``num_generations`` -> ``rollout.group_size``), and how a resolved recipe
  becomes that config;
* its dataset builder (rows of ``data.path/<split>.jsonl`` -> the trainer's dataset) and its
  trainer builder;
* whether the optional ``peft`` section and ``data.eval_split`` apply, the plugins it resolves
  before a model is built, and what the manifest records about its objective.

The loader (:mod:`minimind_trl.trainer.recipe`), the builders (:mod:`minimind_trl.trainer.build`)
and the CLI dispatch through :func:`get_kind`; none of them branches on the kind's name.

Kinds: ``grpo`` (our GRPOTrainer subclass with the tool environment; sections ``objective``,
``rollout``, top-level ``rewards``), ``sft`` (``MiniMindSFTTrainer``: assistant-only SFT, or
``sft.mode: pretrain`` on ``{"text"}`` rows), ``dpo`` (TRL ``DPOTrainer`` on ``{"chosen",
"rejected"}`` conversation rows) and ``distill`` (TRL ``DistillationTrainer``: on-policy
generalized-JSD distillation from a teacher, tools included). The objective section's keys are
``preset`` plus the fields of :class:`~minimind_trl.objectives.ObjectiveConfig` themselves.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import DistillationConfig, DistillationTrainer, DPOConfig, DPOTrainer, SFTConfig

from minimind_trl.conversation import prompt_turns, task_prompt
from minimind_trl.data.formats import row_messages
from minimind_trl.envs.environment import install_parse_guard, make_environment_class, tool_method, with_open_thinking
from minimind_trl.envs.tools import run_registry
from minimind_trl.objectives import PRESETS as OBJECTIVE_PRESETS, ObjectiveConfig
from minimind_trl.plugins import load_object
from minimind_trl.rewards.registry import build_reward_functions, reward_function_names
from minimind_trl.rewards.reward_model import reward_model_folder_problem
from minimind_trl.run_folder import METRICS
from minimind_trl.trainer.callbacks import EVAL_METRICS_FILE, EvalLogCallback, LogHistoryCallback
from minimind_trl.trainer.config import ROLLOUT_ENGINES, MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer
from minimind_trl.trainer.recipe_schema import (
    BOOLEAN,
    MAPPING,
    MODEL_DTYPES,
    NAME,
    NAMES,
    REQUIRED,
    RecipeError,
    ValueTest,
    check_keys,
    int_at_least,
    number,
    one_line,
    one_of,
    recipe_key,
)
from minimind_trl.trainer.sft import MODES as SFT_MODES, MiniMindSFTTrainer, build_sft_dataset

# ----------------------------------------------------------------------------------- the type


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


# ------------------------------------------------------------------------ shared by some kinds


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


def _log_history(config) -> LogHistoryCallback:
    """``metrics.jsonl`` for TRL's trainers (the GRPO trainer writes its own)."""
    return LogHistoryCallback(os.path.join(config.output_dir, METRICS))


# ------------------------------------------------------------------------------------- grpo

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


MAX_COMPLETION_TOKENS = 32_768
"""Upper bound of ``rollout.max_completion_length``: MiniMind's context (max_position_embeddings)."""
GRPO_SECTIONS = {
    "objective": objective_section(),
    "rollout": {
        "group_size": 8, "prompts_per_rollout": None, "max_tool_turns": 3, "thinking_ratio": 0.1,
        "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "tools": [], "tool_names": None,
        "mask_truncated_completions": False, "engine": "minimind",
    },
}
GRPO_VALUES = {
    "rollout.group_size": int_at_least(2), "rollout.prompts_per_rollout": int_at_least(1, null=True),
    "rollout.max_tool_turns": int_at_least(0), "rollout.thinking_ratio": number(0, 1),
    "rollout.max_completion_length": int_at_least(1, high=MAX_COMPLETION_TOKENS),
    "rollout.temperature": number(0, above=True),
    "rollout.top_p": number(0, 1, above=True), "rollout.top_k": int_at_least(0),
    "rollout.tools": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v), "a list of specs"),
    "rollout.tool_names": NAMES, "rollout.mask_truncated_completions": BOOLEAN,
    "rollout.engine": one_of(ROLLOUT_ENGINES),
}
GRPO_OWNED_TRAINING_KEYS = {
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


def _check_grpo(recipe: dict, raw: dict) -> None:
    check_objective(recipe["objective"])
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
    else:
        rows = training.get("per_device_train_batch_size", 8) * processes * accumulation  # 8: TRL's default
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
    """:class:`MiniMindToolGRPOTrainer` with the recipe's rewards and tool environment (one tool
    registry: the environment's, also given to the reward factories that judge tool calls)."""
    rollout = recipe["rollout"]
    registry = build_registry(rollout)  # the run's tools: the environment runs them, tool-aware rewards judge by them
    funcs, _ = build_reward_functions(recipe["rewards"], registry)
    environment = make_environment_class(registry, rollout["max_tool_turns"])
    return MiniMindToolGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=_grpo_data(recipe, rows, tokenizer),
        eval_dataset=None if eval_rows is None else _grpo_data(recipe, eval_rows, tokenizer),
        processing_class=tokenizer,
        environment_factory=environment,
        peft_config=peft_config(recipe),
        callbacks=eval_log(config, eval_rows),
    )


GRPO = register_kind(TrainingKind(
    name="grpo", config_class=MiniMindGRPOConfig, make_config=grpo_config, make_dataset=_grpo_data,
    make_trainer=build_grpo_trainer, sections=GRPO_SECTIONS, values=GRPO_VALUES,
    owned_training_keys=GRPO_OWNED_TRAINING_KEYS, top_level=("rewards",), check=_check_grpo, takes_peft=True,
    takes_eval_split=True, check_plugins=check_grpo_plugins, manifest_objective=lambda config: config.objective_dict(),
))


# -------------------------------------------------------------------------------------- sft


def sft_config(recipe: dict, run_dir: str) -> SFTConfig:
    """The ``trl.SFTConfig`` of a recipe; our tokenisation builds the assistant mask itself."""
    return SFTConfig(output_dir=run_dir, seed=recipe["seed"], max_length=recipe["sft"]["max_length"],
                     assistant_only_loss=False, completion_only_loss=False, **recipe["training"])


def sft_dataset(rows: list[dict], tokenizer, max_length: int, mode: str = "sft", pack: bool = False) -> Dataset:
    """SFT rows (``conversations``) as ``input_ids`` + ``assistant_masks`` (see ``minimind_trl.trainer.sft``:
    the loss covers each assistant turn from after ``<|im_start|>assistant\\n`` through its
    ``<|im_end|>``; rows longer than ``max_length`` are dropped and counted, never truncated).
    ``mode="pretrain"``: ``{"text"}`` rows as ``<|im_start|>`` + text + ``<|im_end|>``, the text cut
    to fit, the loss on every token (upstream MiniMind pretraining); with ``pack`` the texts are
    concatenated and cut into ``max_length`` blocks instead."""
    try:
        dataset, _ = build_sft_dataset(rows, tokenizer, max_length, mode=mode, pack=pack)
    except ValueError as exc:
        raise RecipeError(f"recipe: SFT data: {exc}") from exc
    return dataset


def _sft_data(recipe: dict, rows: list[dict], tokenizer) -> Dataset:
    sft = recipe["sft"]
    return sft_dataset(rows, tokenizer, sft["max_length"], sft["mode"], sft.get("pack", False))


def _check_sft(recipe: dict, raw: dict) -> None:
    if recipe["sft"]["pack"] and recipe["sft"]["mode"] != "pretrain":
        raise RecipeError("recipe: sft.pack is for sft.mode pretrain only (SFT rows keep their own loss masks)")


def build_sft_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """:class:`~minimind_trl.trainer.sft.MiniMindSFTTrainer` on the pre-tokenized rows, ``metrics.jsonl`` logged."""
    trainer = MiniMindSFTTrainer(
        model=model, args=config, train_dataset=_sft_data(recipe, rows, tokenizer),
        eval_dataset=None if eval_rows is None else _sft_data(recipe, eval_rows, tokenizer),
        processing_class=tokenizer, peft_config=peft_config(recipe), callbacks=eval_log(config, eval_rows),
    )
    trainer.add_callback(_log_history(config))
    return trainer


SFT = register_kind(TrainingKind(
    name="sft", config_class=SFTConfig, make_config=lambda recipe, run_dir, processes: sft_config(recipe, run_dir),
    make_dataset=_sft_data,
    make_trainer=build_sft_trainer, sections={"sft": {"max_length": 1024, "mode": "sft", "pack": False}},
    values={"sft.max_length": int_at_least(1), "sft.mode": one_of(SFT_MODES), "sft.pack": BOOLEAN},
    owned_training_keys={
        "max_length": "sft.max_length",
        "assistant_only_loss": "nothing: SFT always trains on assistant tokens only",
        "completion_only_loss": "nothing: the dataset carries the loss mask",
    },
    check=_check_sft, takes_peft=True, takes_eval_split=True,
))


# -------------------------------------------------------------------------------------- dpo


def dpo_config(recipe: dict, run_dir: str) -> DPOConfig:
    """The ``trl.DPOConfig`` of a recipe (``dpo.max_length``, ``dpo.beta``; the rest from ``training``)."""
    dpo = recipe["dpo"]
    return DPOConfig(output_dir=run_dir, seed=recipe["seed"], max_length=dpo["max_length"], beta=dpo["beta"],
                     **recipe["training"])


def _prompt_and_answer(prompt: list[dict], full: list[dict], tokenizer, tools) -> str:
    """The text ``full`` adds after the rendering of ``prompt`` with its generation prompt, ending
    at the last ``<|im_end|>`` (the eos token) as a trained turn does."""
    head = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    text = tokenizer.apply_chat_template(full, tools=tools, tokenize=False)
    if not text.startswith(head):
        raise RecipeError("DPO row: the chat template does not render the prompt as a prefix of the conversation")
    answer = text[len(head):]
    end = answer.rfind(tokenizer.eos_token)
    if end < 0:
        raise RecipeError("DPO row: the answer has no end-of-turn token")
    return answer[: end + len(tokenizer.eos_token)]


def dpo_dataset(rows: list[dict], tokenizer) -> Dataset:
    """``{"chosen": conversations, "rejected": conversations}`` rows (upstream schema) -> TRL's
    text preference rows ``{"prompt", "chosen", "rejected"}``, rendered by our chat template.

    The prompt is the longest common prefix of the two conversations (it must end before an
    assistant turn); the tools come from the system turn. Rendering here, rather than handing
    message lists to TRL, keeps tool-call arguments intact (a datasets column would merge the
    argument dicts of different tools into one struct padded with nulls).
    """
    out = []
    for i, row in enumerate(rows):
        if "chosen" not in row or "rejected" not in row:
            raise RecipeError(f"DPO row {i}: needs 'chosen' and 'rejected' conversations, got keys {sorted(row)}")
        chosen, tools = row_messages(row["chosen"], line=i + 1)
        rejected, _ = row_messages(row["rejected"], line=i + 1)
        if chosen == rejected:
            raise RecipeError(f"DPO row {i}: chosen and rejected are identical")
        common = 0
        while common < min(len(chosen), len(rejected)) and chosen[common] == rejected[common]:
            common += 1
        while common and chosen[common - 1]["role"] == "assistant":
            common -= 1
        if common == 0 or common == len(chosen) or common == len(rejected) \
                or chosen[common]["role"] != "assistant" or rejected[common]["role"] != "assistant":
            raise RecipeError(f"DPO row {i}: chosen and rejected must share a prompt and differ from an "
                              "assistant turn on")
        prompt = chosen[:common]
        out.append({
            "prompt": tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False),
            "chosen": _prompt_and_answer(prompt, chosen, tokenizer, tools),
            "rejected": _prompt_and_answer(prompt, rejected, tokenizer, tools),
        })
    return Dataset.from_list(out)


def _dpo_data(recipe: dict, rows: list[dict], tokenizer) -> Dataset:
    return dpo_dataset(rows, tokenizer)


def build_dpo_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """TRL's ``DPOTrainer``; the reference model is the initial model (loaded from the run's
    ``initial_model/``), or the adapter-free base model with a ``peft`` section. ``eval_rows``:
    always None (dpo takes no ``data.eval_split``)."""
    trainer = DPOTrainer(model=model, args=config, train_dataset=_dpo_data(recipe, rows, tokenizer),
                         processing_class=tokenizer, peft_config=peft_config(recipe))
    trainer.add_callback(_log_history(config))
    return trainer


DPO = register_kind(TrainingKind(
    name="dpo", config_class=DPOConfig, make_config=lambda recipe, run_dir, processes: dpo_config(recipe, run_dir),
    make_dataset=_dpo_data,
    make_trainer=build_dpo_trainer, sections={"dpo": {"max_length": 1024, "beta": 0.1}},
    values={"dpo.max_length": int_at_least(1), "dpo.beta": number(0, above=True)},
    owned_training_keys={"max_length": "dpo.max_length", "beta": "dpo.beta"}, takes_peft=True,
))


# ---------------------------------------------------------------------------------- distill


def distill_config(recipe: dict, run_dir: str) -> DistillationConfig:
    """The ``trl.DistillationConfig`` of a recipe (the ``distill`` section mapped to its fields)."""
    distill = recipe["distill"]
    return DistillationConfig(
        output_dir=run_dir, seed=recipe["seed"], beta=distill["beta"],
        max_completion_length=distill["max_completion_length"], temperature=distill["temperature"],
        max_tool_calling_iterations=distill["max_tool_turns"] or None, **recipe["training"],
    )


def distill_tools(distill: dict) -> list:
    """The registry's tools (``distill.tool_names``, null = all) as plain callables for TRL's
    ``tools=``: the same schemas and JSON observations as the GRPO environment."""
    if not distill["max_tool_turns"]:
        return []
    registry = build_registry({"tools": [], "tool_names": distill["tool_names"]})

    class _Runner:  # what the environment methods call, without the per-rollout call log
        def _call_tool(self, name: str, arguments: dict) -> str:
            return registry.call(name, arguments)

    runner = _Runner()
    return [tool_method(registry.spec(name)).__get__(runner) for name in registry.names()]


def distill_dataset(rows: list[dict]) -> Dataset:
    """Task rows -> ``{"prompt": messages}`` (system and user turns; the trainer renders the tools)."""
    out = []
    for i, row in enumerate(rows):
        if "conversations" not in row:
            raise RecipeError(f"data row {i} ({row.get('id')}): a distillation prompt row needs 'conversations'")
        out.append({"prompt": task_prompt(row)[0]})
    return Dataset.from_list(out)


def _distill_data(recipe: dict, rows: list[dict], tokenizer) -> Dataset:
    return distill_dataset(rows)


def build_distill_trainer(recipe: dict, config, model, tokenizer, rows: list[dict],
                          eval_rows: list[dict] | None = None):
    """TRL's ``DistillationTrainer`` (on-policy, generalized JSD) with the teacher of
    ``distill.teacher_path``. ``eval_rows``: always None (distill takes no ``data.eval_split``)."""
    distill = recipe["distill"]
    with recipe_key("distill.teacher_path"):
        teacher = AutoModelForCausalLM.from_pretrained(distill["teacher_path"],
                                                       dtype=MODEL_DTYPES[recipe["model"]["dtype"]])
    if teacher.config.vocab_size != model.config.vocab_size:
        raise RecipeError(f"recipe: distill.teacher_path has vocab {teacher.config.vocab_size}, "
                          f"the student {model.config.vocab_size}: they must share the vocabulary")
    trainer = DistillationTrainer(
        model=model, teacher_model=teacher, args=config, train_dataset=_distill_data(recipe, rows, tokenizer),
        processing_class=tokenizer, tools=distill_tools(distill) or None,
    )
    install_parse_guard(trainer._tokenizer)  # an unparsable call (JSON ~1000 deep) is plain text, as in GRPO
    trainer.add_callback(_log_history(config))
    return trainer


DISTILL = register_kind(TrainingKind(
    name="distill", config_class=DistillationConfig,
    make_config=lambda recipe, run_dir, processes: distill_config(recipe, run_dir), make_dataset=_distill_data,
    make_trainer=build_distill_trainer,
    sections={"distill": {
        "teacher_path": REQUIRED, "beta": 0.5, "max_completion_length": 256, "temperature": 1.0,
        "max_tool_turns": 3, "tool_names": None,
    }},
    values={
        "distill.teacher_path": NAME, "distill.beta": number(0, 1), "distill.max_completion_length": int_at_least(1),
        "distill.temperature": number(0, above=True), "distill.max_tool_turns": int_at_least(0),
        "distill.tool_names": NAMES,
    },
    owned_training_keys={
        "teacher_model_name_or_path": "distill.teacher_path",
        "beta": "distill.beta",
        "max_completion_length": "distill.max_completion_length",
        "temperature": "distill.temperature",
        "max_tool_calling_iterations": "distill.max_tool_turns",
    },
))
