"""The training kind ``reward``: a reward model for protocol E4, trained with TRL's ``RewardTrainer``
from the project's own data (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155: a pairwise loss
``-log sigmoid(r(x, y_chosen) - r(x, y_rejected))``).

Pairs come from task rows (``data.path/<split>.jsonl``, the training split by default): for each
question, ``reward.pairs_per_question`` pairs whose chosen answer states the ground truth (the
gold final answer of a generated task, ``data.gold.final_answer``; for rows without reference
calls, "The answer is V1, V2.") and whose rejected answer is the same text with every GT value
replaced by a near miss (scaled by 0.5, 0.9, 1.1, 1.5 or 2, or shifted by one unit, in the
value's own decimals). The model therefore learns a stand-in for the verifier on final answers;
E4 then measures how a policy trained on it drifts from the verified reward (reward hacking).

Both answers are rendered and tokenized exactly as the E4 reward scores policy answers
(`rewards.reward_model.render_for_reward_model`, no added special tokens, cut to
``reward.max_length`` from the left), and handed to TRL pre-tokenized. The model is
``AutoModelForSequenceClassification`` with one label built from ``model`` (a MiniMind folder or
preset: `MiniMindForSequenceClassification`, a new ``score`` head on the backbone).
"""

from __future__ import annotations

import math
import random

from datasets import Dataset
from trl import RewardConfig, RewardTrainer

from minimind_trl.conversation import task_prompt
from minimind_trl.data.formats import row_tool_calls
from minimind_trl.data.gold import final_answer
from minimind_trl.rewards.reward_model import prompt_question, render_for_reward_model
from minimind_trl.trainer.kinds.registry import TrainingKind, log_history_callback, register_kind
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe_schema import RecipeError, int_at_least

_SCALES = (0.5, 0.9, 1.1, 1.5, 2.0)


def near_miss(value: str, rng: random.Random) -> str:
    """A wrong value close to ``value`` in its own format (its decimals, its thousands commas); a
    value that is not a finite number gets a digit appended, so that it still differs."""
    text = value.strip()
    try:
        number = float(text.replace(",", ""))
    except ValueError:
        return f"{text}0"
    if not math.isfinite(number):
        return f"{text}0"
    grouping = "," if "," in text else ""
    decimals = len(text.split(".", 1)[1]) if "." in text else 0
    unit = 10.0 ** -decimals
    choice = rng.randrange(len(_SCALES) + 2)
    wrong = number * _SCALES[choice] if choice < len(_SCALES) else number + (unit if choice == len(_SCALES) else -unit)
    formatted = f"{wrong:{grouping}.{decimals}f}"
    if float(formatted.replace(",", "")) == number:  # too small to move at this precision
        formatted = f"{number + unit:{grouping}.{decimals}f}"
    return formatted


def answer_text(task: dict, values: list[str]) -> str:
    """The final answer stating ``values`` for ``task``: the gold wording for generated tasks."""
    meta = task.get("meta") or {}
    if meta.get("calls"):
        calls = row_tool_calls(meta["calls"], "meta.calls")
        if len(calls) == len(values):
            return final_answer(str(task.get("id") or ""), meta.get("lang", "en"), meta.get("op_type", ""), calls,
                                values)
    return f"The answer is {', '.join(values)}."


def reward_pairs(rows: list[dict], pairs_per_question: int, seed: int) -> list[dict]:
    """``{"question", "chosen", "rejected"}`` texts, ``pairs_per_question`` per task row (see module
    docstring); rows without a ``gt`` list are refused naming the row."""
    rng = random.Random(seed)
    pairs = []
    for i, task in enumerate(rows):
        gt = task.get("gt")
        if not isinstance(gt, list) or not gt:
            raise RecipeError(f"reward row {i + 1}: needs a non-empty 'gt' list (a task row), got {gt!r}")
        messages, _ = task_prompt(task)
        question = prompt_question(messages)
        values = [str(v) for v in gt]
        chosen = answer_text(task, values)
        for _ in range(pairs_per_question):
            rejected = answer_text(task, [near_miss(v, rng) for v in values])
            pairs.append({"question": question, "chosen": chosen, "rejected": rejected})
    return pairs


def reward_dataset(rows: list[dict], tokenizer, max_length: int, pairs_per_question: int, seed: int) -> Dataset:
    """TRL's pre-tokenized preference rows ``{"chosen_ids", "rejected_ids"}`` (left-truncated)."""
    def ids(question: str, answer: str) -> list[int]:
        tokens = tokenizer(render_for_reward_model(tokenizer, question, answer), add_special_tokens=False)["input_ids"]
        return tokens[-max_length:]

    pairs = reward_pairs(rows, pairs_per_question, seed)
    return Dataset.from_list([{"chosen_ids": ids(p["question"], p["chosen"]), "rejected_ids": ids(p["question"],
                                                                                                 p["rejected"])}
                              for p in pairs])


def reward_config(recipe: dict, run_dir: str) -> RewardConfig:
    """The ``trl.RewardConfig`` of a recipe (``reward.max_length``; the rest from ``training``)."""
    return RewardConfig(output_dir=run_dir, seed=recipe["seed"], max_length=recipe["reward"]["max_length"],
                        **training_arguments(recipe)[0])


def _reward_data(recipe: dict, rows: list[dict], tokenizer) -> Dataset:
    spec = recipe["reward"]
    return reward_dataset(rows, tokenizer, spec["max_length"], spec["pairs_per_question"], recipe["seed"])


def build_reward_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """TRL's ``RewardTrainer`` on the pairs of ``rows``; ``metrics.jsonl`` logged."""
    if tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id  # the head reads each row's last real token
    trainer = RewardTrainer(model=model, args=config, train_dataset=_reward_data(recipe, rows, tokenizer),
                            processing_class=tokenizer)
    trainer.add_callback(log_history_callback(config))
    return trainer


REWARD = register_kind(TrainingKind(
    name="reward", config_class=RewardConfig,
    make_config=lambda recipe, run_dir, processes: reward_config(recipe, run_dir),
    make_dataset=_reward_data, make_trainer=build_reward_trainer,
    sections={"reward": {"max_length": 512, "pairs_per_question": 1}},
    values={"reward.max_length": int_at_least(1), "reward.pairs_per_question": int_at_least(1)},
    owned_training_keys={"max_length": "reward.max_length"}, model_head="sequence_classification",
))
