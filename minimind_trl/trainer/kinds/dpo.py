"""The training kind ``dpo``: TRL's ``DPOTrainer`` on ``{"chosen", "rejected"}`` conversation rows."""

from __future__ import annotations

from datasets import Dataset
from trl import DPOConfig, DPOTrainer

from minimind_trl.data.formats import row_messages
from minimind_trl.trainer.kinds.registry import (
    TrainingKind,
    log_history_callback,
    peft_config,
    register_kind,
)
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe_schema import (
    RecipeError,
    int_at_least,
    number,
)


def dpo_config(recipe: dict, run_dir: str) -> DPOConfig:
    """The ``trl.DPOConfig`` of a recipe (``dpo.max_length``, ``dpo.beta``; the rest from ``training``)."""
    dpo = recipe["dpo"]
    return DPOConfig(output_dir=run_dir, seed=recipe["seed"], max_length=dpo["max_length"], beta=dpo["beta"],
                     **training_arguments(recipe)[0])


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
    trainer.add_callback(log_history_callback(config))
    return trainer


DPO = register_kind(TrainingKind(
    name="dpo", config_class=DPOConfig, make_config=lambda recipe, run_dir, processes: dpo_config(recipe, run_dir),
    make_dataset=_dpo_data,
    make_trainer=build_dpo_trainer, sections={"dpo": {"max_length": 1024, "beta": 0.1}},
    values={"dpo.max_length": int_at_least(1), "dpo.beta": number(0, above=True)},
    owned_training_keys={"max_length": "dpo.max_length", "beta": "dpo.beta"}, takes_peft=True,
))


