"""The training kind ``distill``: TRL's ``DistillationTrainer``, on-policy generalized-JSD
distillation from a teacher, tools included."""

from __future__ import annotations

from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import DistillationConfig, DistillationTrainer

from minimind_trl.conversation import task_prompt
from minimind_trl.envs.environment import install_parse_guard, tool_method
from minimind_trl.envs.protocol import MAX_TOOL_TURNS
from minimind_trl.trainer.kinds.registry import (
    TrainingKind,
    build_registry,
    log_history_callback,
    register_kind,
)
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe_schema import (
    MODEL_DTYPES,
    NAME,
    NAMES,
    REQUIRED,
    RecipeError,
    int_at_least,
    number,
    recipe_key,
)


def distill_config(recipe: dict, run_dir: str) -> DistillationConfig:
    """The ``trl.DistillationConfig`` of a recipe (the ``distill`` section mapped to its fields)."""
    distill = recipe["distill"]
    return DistillationConfig(
        output_dir=run_dir, seed=recipe["seed"], beta=distill["beta"],
        max_completion_length=distill["max_completion_length"], temperature=distill["temperature"],
        max_tool_calling_iterations=distill["max_tool_turns"] or None, **training_arguments(recipe)[0],
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
    trainer.add_callback(log_history_callback(config))
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
        "distill.temperature": number(0, above=True), "distill.max_tool_turns": int_at_least(0, high=MAX_TOOL_TURNS),
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
