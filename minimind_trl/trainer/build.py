"""From a resolved recipe to the objects a run needs: tokenizer, model, datasets, rewards, trainer.

Kinds: ``grpo`` (our GRPOTrainer subclass with the tool environment), ``sft`` (``MiniMindSFTTrainer``:
assistant-only SFT, or ``sft.mode: pretrain`` on ``{"text"}`` rows), ``dpo`` (TRL ``DPOTrainer`` on
``{"chosen", "rejected"}`` conversation rows) and ``distill`` (TRL ``DistillationTrainer``: on-policy
generalized-JSD distillation from a teacher, tools included). A ``peft`` section wraps the model
in a LoRA adapter (``peft.LoraConfig``) for grpo, sft and dpo.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from minimind_trl.data.manifest import sha256_file, verify_manifest
from minimind_trl.data.validation import DataError, DataFormatError, iter_jsonl_objects
from minimind_trl.trainer.recipe import RecipeError, one_line

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # what from_pretrained may look up on the Hub


@contextlib.contextmanager
def recipe_key(key: str):
    """An error while building what recipe key ``key`` names becomes a one-line RecipeError naming it."""
    try:
        yield
    except RecipeError:
        raise
    except Exception as exc:
        raise RecipeError(f"recipe: {key}: {type(exc).__name__}: {one_line(exc)}") from exc


def check_plugins(recipe: dict) -> None:
    """Resolve the reward and tool plugins a GRPO recipe names (cheap: reward factories are not
    called), so that a typo fails before any model is built."""
    from minimind_trl.plugins import load_object, reward_function_names

    if recipe["kind"] != "grpo":
        return
    for i, spec in enumerate(recipe["rewards"]):
        name = spec["name"]
        if name in reward_function_names():
            continue
        if not isinstance(name, str) or (":" not in name and not name.endswith(".py")):
            raise RecipeError(f"recipe: rewards.{i}.name: unknown reward function {name!r} "
                              f"(registered: {', '.join(reward_function_names())}; or a 'path/file.py:function' spec)")
        with recipe_key(f"rewards.{i}.name"):
            load_object(name)
    with recipe_key("rollout.tools"):
        build_registry(recipe["rollout"])


def world_size() -> int:
    """Processes of this launch (``WORLD_SIZE`` from torchrun / accelerate, else 1)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def build_tokenizer(spec: dict):
    from minimind_trl.tokenization import load_tokenizer

    return load_tokenizer(spec["path"])


def build_model(spec: dict):
    """A MiniMind preset (random init, or an upstream ``.pth`` via ``native``) or a Hub folder."""
    from transformers import AutoModelForCausalLM

    from minimind_trl.modeling import MiniMindForCausalLM, get_preset, load_native_checkpoint

    dtype = _DTYPES[spec["dtype"]]
    if spec["path"] is not None:
        if not Path(spec["path"]).is_dir() and not _REPO_ID.fullmatch(spec["path"]):
            raise RecipeError(f"recipe: model.path: no such folder {spec['path']}")
        return AutoModelForCausalLM.from_pretrained(spec["path"], dtype=dtype)
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


def grpo_dataset(rows: list[dict], thinking_ratio: float, seed: int) -> Dataset:
    """Task rows -> TRL prompt rows: ``prompt`` (messages), ``gt`` (JSON list), ``id``, ``open_thinking``."""
    from minimind_trl.envs.environment import with_open_thinking

    out = []
    for i, row in enumerate(rows):
        if "conversations" not in row or "gt" not in row:
            raise RecipeError(f"data row {i} ({row.get('id')}): a GRPO task row needs 'conversations' and 'gt'")
        # The prompt keeps the system turn's `tools` JSON string: training renders exactly the tools
        # the task offers, as evaluation does (the environment falls back to all registry tools
        # only for a prompt without one).
        prompt = [{k: v for k, v in m.items() if v is not None} for m in row["conversations"]]
        if prompt and prompt[-1].get("role") == "assistant" and not prompt[-1].get("content"):
            prompt = prompt[:-1]
        out.append({"prompt": prompt, "gt": json.dumps(row["gt"], ensure_ascii=False), "id": str(row.get("id", i))})
    return Dataset.from_list(with_open_thinking(out, ratio=thinking_ratio, seed=seed))


def sft_dataset(rows: list[dict], tokenizer, max_length: int, mode: str = "sft", pack: bool = False) -> Dataset:
    """SFT rows (``conversations``) as ``input_ids`` + ``assistant_masks`` (see ``minimind_trl.sft``:
    the loss covers each assistant turn from after ``<|im_start|>assistant\\n`` through its
    ``<|im_end|>``; rows longer than ``max_length`` are dropped and counted, never truncated).
    ``mode="pretrain"``: ``{"text"}`` rows as ``<|im_start|>`` + text + ``<|im_end|>``, the text cut
    to fit, the loss on every token (upstream MiniMind pretraining); with ``pack`` the texts are
    concatenated and cut into ``max_length`` blocks instead."""
    from minimind_trl.sft import build_sft_dataset

    try:
        dataset, _ = build_sft_dataset(rows, tokenizer, max_length, mode=mode, pack=pack)
    except ValueError as exc:
        raise RecipeError(f"recipe: SFT data: {exc}") from exc
    return dataset


def build_rewards(specs: list[dict]) -> tuple[list, list[float]]:
    from minimind_trl.plugins import get_reward_function

    funcs = [get_reward_function(spec["name"], **spec["options"]) for spec in specs]
    return funcs, [float(spec["weight"]) for spec in specs]


def grpo_config(recipe: dict, run_dir: str, processes: int):
    """The :class:`MiniMindGRPOConfig` of a recipe (rollout and objective sections mapped to fields)."""
    from minimind_trl.trainer.config import MiniMindGRPOConfig

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
        **{k: objective[k] for k in ("policy", "advantage", "reduction", "epsilon_low", "epsilon_high",
                                     "cispo_max", "fixed_length", "beta")},
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


def build_registry(rollout: dict):
    """The default tools plus ``rollout.tools`` plugins, restricted to ``rollout.tool_names`` if given."""
    from minimind_trl.envs.tools import run_registry

    try:
        return run_registry(rollout["tools"], rollout["tool_names"])
    except ValueError as error:
        raise RecipeError(f"recipe: rollout.tool_names: {error}") from None


def sft_config(recipe: dict, run_dir: str):
    """The ``trl.SFTConfig`` of a recipe; our tokenisation builds the assistant mask itself."""
    from trl import SFTConfig

    return SFTConfig(output_dir=run_dir, seed=recipe["seed"], max_length=recipe["sft"]["max_length"],
                     assistant_only_loss=False, completion_only_loss=False, **recipe["training"])


def dpo_config(recipe: dict, run_dir: str):
    """The ``trl.DPOConfig`` of a recipe (``dpo.max_length``, ``dpo.beta``; the rest from ``training``)."""
    from trl import DPOConfig

    dpo = recipe["dpo"]
    return DPOConfig(output_dir=run_dir, seed=recipe["seed"], max_length=dpo["max_length"], beta=dpo["beta"],
                     **recipe["training"])


def distill_config(recipe: dict, run_dir: str):
    """The ``trl.DistillationConfig`` of a recipe (the ``distill`` section mapped to its fields)."""
    from trl import DistillationConfig

    distill = recipe["distill"]
    return DistillationConfig(
        output_dir=run_dir, seed=recipe["seed"], beta=distill["beta"],
        max_completion_length=distill["max_completion_length"], temperature=distill["temperature"],
        max_tool_calling_iterations=distill["max_tool_turns"] or None, **recipe["training"],
    )


def training_config(recipe: dict, run_dir: str):
    """The training config; building it also sets up the distributed state (process group)."""
    kind = recipe["kind"]
    try:
        if kind == "grpo":
            config = grpo_config(recipe, run_dir, world_size())
        else:
            config = {"sft": sft_config, "dpo": dpo_config, "distill": distill_config}[kind](recipe, run_dir)
    except (ValueError, TypeError) as exc:  # the config classes' own checks (TRL, transformers, ours)
        if isinstance(exc, RecipeError):
            raise
        raise RecipeError(f"recipe: training: {one_line(exc)}") from None
    _ = config.world_size  # make sure accelerate's state exists before anything else uses it
    return config


def peft_config(recipe: dict):
    """A ``peft.LoraConfig`` from the recipe's ``peft`` section, or None (full fine-tuning)."""
    spec = recipe.get("peft")
    if spec is None:
        return None
    from peft import LoraConfig

    parameters = spec.get("target_parameters")
    return LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=float(spec["dropout"]),
                      target_modules=list(spec["target_modules"]), task_type="CAUSAL_LM",
                      target_parameters=list(parameters) if parameters else None)


def _eval_log(config, eval_rows: list[dict] | None) -> list | None:
    """The callback that writes each evaluation during training to ``eval_metrics.jsonl``."""
    from minimind_trl.trainer.callbacks import EVAL_METRICS_FILE, EvalLogCallback

    return None if eval_rows is None else [EvalLogCallback(os.path.join(config.output_dir, EVAL_METRICS_FILE))]


def build_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    """The trainer of a recipe's kind (GRPO with the tool environment, SFT, DPO, distillation)."""
    builders = {"grpo": build_grpo_trainer, "sft": build_sft_trainer, "dpo": build_dpo_trainer,
                "distill": build_distill_trainer}
    if eval_rows is not None:  # data.eval_split: evaluation during training (training.eval_strategy)
        return builders[recipe["kind"]](recipe, config, model, tokenizer, rows, eval_rows=eval_rows)
    return builders[recipe["kind"]](recipe, config, model, tokenizer, rows)


def build_grpo_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    from minimind_trl.envs.environment import make_environment_class
    from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer

    rollout = recipe["rollout"]
    funcs, _ = build_rewards(recipe["rewards"])
    environment = make_environment_class(build_registry(rollout), rollout["max_tool_turns"])
    return MiniMindToolGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=grpo_dataset(rows, rollout["thinking_ratio"], recipe["seed"]),
        eval_dataset=None if eval_rows is None else grpo_dataset(eval_rows, rollout["thinking_ratio"], recipe["seed"]),
        processing_class=tokenizer,
        environment_factory=environment,
        peft_config=peft_config(recipe),
        callbacks=_eval_log(config, eval_rows),
    )


def build_sft_trainer(recipe: dict, config, model, tokenizer, rows: list[dict], eval_rows: list[dict] | None = None):
    from minimind_trl.sft import MiniMindSFTTrainer
    from minimind_trl.trainer.callbacks import LogHistoryCallback

    sft = recipe["sft"]
    trainer = MiniMindSFTTrainer(
        model=model, args=config, train_dataset=sft_dataset(rows, tokenizer, sft["max_length"], sft["mode"], sft.get("pack", False)),
        eval_dataset=None if eval_rows is None else sft_dataset(eval_rows, tokenizer, sft["max_length"], sft["mode"],
                                                               sft.get("pack", False)),
        processing_class=tokenizer, peft_config=peft_config(recipe), callbacks=_eval_log(config, eval_rows),
    )
    trainer.add_callback(LogHistoryCallback(os.path.join(config.output_dir, "metrics.jsonl")))
    return trainer


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
    from minimind_trl.data.formats import conversations_to_messages

    out = []
    for i, row in enumerate(rows):
        if "chosen" not in row or "rejected" not in row:
            raise RecipeError(f"DPO row {i}: needs 'chosen' and 'rejected' conversations, got keys {sorted(row)}")
        chosen, tools = conversations_to_messages(row["chosen"], line=i + 1)
        rejected, _ = conversations_to_messages(row["rejected"], line=i + 1)
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


def build_dpo_trainer(recipe: dict, config, model, tokenizer, rows: list[dict]):
    """TRL's ``DPOTrainer``; the reference model is the initial model (loaded from the run's
    ``initial_model/``), or the adapter-free base model with a ``peft`` section."""
    from trl import DPOTrainer

    from minimind_trl.trainer.callbacks import LogHistoryCallback

    trainer = DPOTrainer(model=model, args=config, train_dataset=dpo_dataset(rows, tokenizer),
                         processing_class=tokenizer, peft_config=peft_config(recipe))
    trainer.add_callback(LogHistoryCallback(os.path.join(config.output_dir, "metrics.jsonl")))
    return trainer


def distill_tools(distill: dict) -> list:
    """The registry's tools (``distill.tool_names``, null = all) as plain callables for TRL's
    ``tools=``: the same schemas and JSON observations as the GRPO environment."""
    from minimind_trl.envs.environment import _tool_method

    if not distill["max_tool_turns"]:
        return []
    registry = build_registry({"tools": [], "tool_names": distill["tool_names"]})

    class _Runner:  # what the environment methods call, without the per-rollout call log
        def _call_tool(self, name: str, arguments: dict) -> str:
            return registry.call(name, arguments)

    runner = _Runner()
    return [_tool_method(registry.spec(name)).__get__(runner) for name in registry.names()]


def distill_dataset(rows: list[dict]) -> Dataset:
    """Task rows -> ``{"prompt": messages}`` (system and user turns; the trainer renders the tools)."""
    from minimind_trl.envs.rollout import task_messages

    out = []
    for i, row in enumerate(rows):
        if "conversations" not in row:
            raise RecipeError(f"data row {i} ({row.get('id')}): a distillation prompt row needs 'conversations'")
        out.append({"prompt": task_messages(row)[0]})
    return Dataset.from_list(out)


def build_distill_trainer(recipe: dict, config, model, tokenizer, rows: list[dict]):
    """TRL's ``DistillationTrainer`` (on-policy, generalized JSD) with the teacher of ``distill.teacher_path``."""
    from transformers import AutoModelForCausalLM
    from trl import DistillationTrainer

    from minimind_trl.envs.environment import install_parse_guard
    from minimind_trl.trainer.callbacks import LogHistoryCallback

    distill = recipe["distill"]
    with recipe_key("distill.teacher_path"):
        teacher = AutoModelForCausalLM.from_pretrained(distill["teacher_path"], dtype=_DTYPES[recipe["model"]["dtype"]])
    if teacher.config.vocab_size != model.config.vocab_size:
        raise RecipeError(f"recipe: distill.teacher_path has vocab {teacher.config.vocab_size}, "
                          f"the student {model.config.vocab_size}: they must share the vocabulary")
    trainer = DistillationTrainer(
        model=model, teacher_model=teacher, args=config, train_dataset=distill_dataset(rows),
        processing_class=tokenizer, tools=distill_tools(distill) or None,
    )
    install_parse_guard(trainer._tokenizer)  # an unparsable call (JSON ~1000 deep) is plain text, as in GRPO
    trainer.add_callback(LogHistoryCallback(os.path.join(config.output_dir, "metrics.jsonl")))
    return trainer
