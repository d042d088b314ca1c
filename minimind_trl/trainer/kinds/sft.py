"""The training kind ``sft``: ``MiniMindSFTTrainer``, assistant-only SFT, or ``sft.mode:
pretrain`` on ``{"text"}`` rows."""

from __future__ import annotations

from datasets import Dataset
from trl import SFTConfig

from minimind_trl.trainer.kinds.registry import (
    TrainingKind,
    eval_log,
    log_history_callback,
    peft_config,
    register_kind,
)
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe_schema import (
    BOOLEAN,
    RecipeError,
    int_at_least,
    one_of,
)
from minimind_trl.trainer.sft import MODES as SFT_MODES, MiniMindSFTTrainer, build_sft_dataset


def sft_config(recipe: dict, run_dir: str) -> SFTConfig:
    """The ``trl.SFTConfig`` of a recipe; our tokenisation builds the assistant mask itself."""
    return SFTConfig(output_dir=run_dir, seed=recipe["seed"], max_length=recipe["sft"]["max_length"],
                     assistant_only_loss=False, completion_only_loss=False, **training_arguments(recipe)[0])


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
    trainer.add_callback(log_history_callback(config))
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


