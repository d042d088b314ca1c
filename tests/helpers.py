"""Shared pieces of the trainer / run tests (no tests here): tiny model, tokenizer, scripted rollouts,
a gradient-grabbing callback, and a tiny GRPO recipe trained through the CLI.

The scripted rollout (TRL's ``rollout_func``) makes completions a pure function of (prompt, index
in its group), so runs that split the same rollout differently (batch size, accumulation,
processes) see identical data; it also marks some tokens as tool observations (``env_mask``) and
leaves one row per two groups without any action token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import torch
import yaml
from datasets import Dataset
from transformers import TrainerCallback

from minimind_trl.envs.tools import default_registry
from minimind_trl.modeling import MiniMindForCausalLM, get_preset
from minimind_trl.tokenization import build_tokenizer, load_tokenizer
from minimind_trl.trainer import cli
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import MiniMindGRPOTrainer, MiniMindToolGRPOTrainer
from minimind_trl.trainer.run import save_initial_model

EOS = 2
_TOKENIZER_CACHE = Path(os.environ.get("HF_HOME", "/tmp")) / "minimind-trl-test-tokenizer"


def tiny_tokenizer():
    """The shipped tokenizer, or (before it is built) a 512-token one trained on the bundled text."""
    try:
        return load_tokenizer()
    except FileNotFoundError:
        if (_TOKENIZER_CACHE / "tokenizer.json").is_file():
            return load_tokenizer(_TOKENIZER_CACHE)
        corpus = Path(__file__).resolve().parents[1] / "minimind_trl" / "tokenization" / "general_text.txt"
        build_tokenizer([str(corpus)], str(_TOKENIZER_CACHE), vocab_size=512, overwrite=True)
        return load_tokenizer(_TOKENIZER_CACHE)


def tiny_tokenizer_path() -> str | None:
    """For recipes: None (the shipped tokenizer) or the fallback tokenizer's folder."""
    try:
        load_tokenizer()
        return None
    except FileNotFoundError:
        tiny_tokenizer()
        return str(_TOKENIZER_CACHE)


def tiny_model(seed: int = 0, moe: bool = False) -> MiniMindForCausalLM:
    """conftest's ``make_tiny_model(moe, seed).train()`` as a plain function, for module-scoped
    fixtures and the subprocess scripts that import this file (no pytest fixtures there)."""
    torch.manual_seed(seed)
    return MiniMindForCausalLM(get_preset("tiny-moe" if moe else "tiny"))


def saved_tiny_model(folder, seed: int = 0) -> MiniMindForCausalLM:
    """A tiny model saved as a run's initial model (TRL builds the reference model from its path)."""
    model = tiny_model(seed)
    save_initial_model(model, folder)
    return model


def prompt_dataset(n: int = 16) -> Dataset:
    return Dataset.from_list([{"prompt": f"Question {i}: what is {i} plus {2 * i}?", "gt": [3 * i]} for i in range(n)])


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def scripted_completion(prompt: str, index: int) -> tuple[list[int], list[int]]:
    """(completion ids, env mask) for the ``index``-th completion of ``prompt``."""
    h = _crc(prompt)
    length = 4 + (h + 3 * index) % 9
    ids = [(h * 7 + 13 * index + 5 * t) % 270 + 30 for t in range(length)]
    if index % 3 != 2:
        ids.append(EOS)  # others are "truncated"
    mask = [1] * len(ids)
    if index == 1:
        mask[1:3] = [0, 0]  # a tool observation inside the completion
    if index == 3 and h % 2 == 0:
        mask = [0] * len(ids)  # a row without any action token
    return ids, mask


def scripted_rollout(prompts: list[str], trainer) -> dict:
    tokenizer = trainer.processing_class
    seen: dict[str, int] = {}
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": []}
    for prompt in prompts:
        index = seen.get(prompt, 0)
        seen[prompt] = index + 1
        ids, mask = scripted_completion(prompt, index)
        out["prompt_ids"].append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        out["completion_ids"].append(ids)
        out["env_mask"].append(mask)
    return out


def id_reward(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """A reward that varies within groups: a hash of the completion ids."""
    return [float(sum(ids) % 7) / 7.0 for ids in completion_ids]


def text_reward(prompts, completions, **kwargs) -> list[float]:
    """For sampled text: a hash of the characters (varies within a group)."""
    return [float(sum(map(ord, str(c))) % 7) / 7.0 for c in completions]


def make_config(run_dir, **overrides) -> MiniMindGRPOConfig:
    """CPU, fp32, no checkpointing; small rollouts (2 prompts x 4 completions)."""
    values = dict(
        output_dir=str(run_dir),
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_iterations=4,
        max_completion_length=12,
        max_steps=4,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    values.update(overrides)
    return MiniMindGRPOConfig(**values)


def make_trainer(run_dir, scripted: bool = True, model=None, reward=None, callbacks=None, **overrides):
    return MiniMindGRPOTrainer(
        model=model if model is not None else tiny_model(),
        reward_funcs=[reward or (id_reward if scripted else text_reward)],
        args=make_config(run_dir, **overrides),
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
        rollout_func=scripted_rollout if scripted else None,
        callbacks=callbacks,
    )


def free_tool_trainer(run_dir, engine: str = "minimind", **overrides) -> MiniMindToolGRPOTrainer:
    """The tool trainer on two unscripted tool-task prompts of the tiny random model (sampled text,
    rarely a tool call): 2 prompts x 4 completions of at most 12 tokens per rollout."""
    registry = default_registry()
    tools = json.dumps(registry.schemas(["calculate_math"]), ensure_ascii=False)
    rows = [{"prompt": [{"role": "system", "content": "You are a calculator.", "tools": tools},
                        {"role": "user", "content": question}], "gt": ["21"], "id": f"q{i}"}
            for i, question in enumerate(("What is 3*7?", "Compute 20+1."))]
    config = make_config(run_dir, **{"num_iterations": 1, "max_steps": 1, "max_tool_calling_iterations": 1,
                                     "rollout_engine": engine, **overrides})
    return MiniMindToolGRPOTrainer(model=tiny_model().train(), reward_funcs=[text_reward], args=config,
                                   train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer(),
                                   tool_registry=registry)


class GradGrab(TrainerCallback):
    """Copies the gradients seen before the first optimizer step (max_grad_norm=0: unclipped)."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def write_recipe(folder: Path, split_dir: Path, **training) -> Path:
    recipe = {
        "kind": "grpo",
        "seed": 3,
        "model": {"preset": "tiny"},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(split_dir)},
        "rollout": {"group_size": 2, "prompts_per_rollout": 2, "max_tool_turns": 1, "max_completion_length": 8,
                    "tool_names": ["calculate_math"]},
        "rewards": ["success_reward"],
        "training": {"max_steps": 2, "num_iterations": 1, "learning_rate": 1e-3, "bf16": False, "use_cpu": True,
                     "report_to": [], "save_strategy": "steps", "save_steps": 2, "gradient_checkpointing": False,
                     "disable_tqdm": True, **training},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def train(recipe: Path, run_dir: Path, *extra: str) -> int:
    return cli.main([str(recipe), "--output-dir", str(run_dir), *extra])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return MiniMindForCausalLM.from_pretrained(folder).state_dict()


def run_two_cpu_ranks(script: str, run_dir: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 SCRIPT RUN_DIR`` on CPU (gloo), one thread per
    rank, tests/ on the path (the script imports this file); the fallback tokenizer is built first
    so that the two ranks do not race for it."""
    tiny_tokenizer()
    tests_dir = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": path}
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", script, str(run_dir)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
