"""DeepSpeed on two CPU ranks (gloo), launched as a user launches it (issue 25).

``accelerate launch --config_file accelerate_configs/deepspeed_zero{3,2}.yaml --num_processes 2``
with ``training.use_cpu: true``:

* ZeRO-3 GRPO, MoE, ``beta > 0``, from a model folder, with the ranks forced apart
  (diverging_ranks_train.py: rank 0 runs a tool call and a second model turn, rank 1 stops each
  turn after 5 tokens). Before the fix it deadlocked in generation; a hang here is a timeout,
  and the whole process group is killed. ``initial_model/`` must hold the real weights (it held
  zero-element tensors), ``final/`` a Hub folder that ``minimind-trl eval`` accepts.
* ZeRO-3 GRPO with ``beta > 0`` from a preset: TRL's reference engine needs DeepSpeed's own
  process group, which accelerate does not set up on CPU ranks.
* ZeRO-3 DPO (its reference model a ZeRO-3 engine) equal to one process at step 1; ZeRO-3 SFT.
* ZeRO-3 GRPO killed after a checkpoint inside a rollout (K=2) and resumed: the uninterrupted
  run's final weights and figures.
* ZeRO-2 GRPO with LoRA: ``final/`` is the whole model (it held only the adapter), equal to the
  base weights with ``adapter/`` merged by PEFT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import tiny_model, tiny_tokenizer, tiny_tokenizer_path, weights
from peft import PeftModel

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.eval.cli import eval_main
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.trainer import cli, grpo_trainer
from minimind_trl.trainer.grpo_trainer import MiniMindGRPOTrainer
from minimind_trl.trainer.zero3 import full_weights, num_parameters

pytest.importorskip("deepspeed")

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 300  # a deadlock fails the test instead of hanging CI


def _recipe(folder: Path, split_dir: Path, start: Path, training: dict | None = None, **extra) -> Path:
    recipe = {
        "kind": "grpo", "seed": 3,
        "model": {"path": str(start)},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(split_dir)},
        "rollout": {"group_size": 2, "prompts_per_rollout": 4, "max_tool_turns": 2, "max_completion_length": 96,
                    "tool_names": ["calculate_math"], "temperature": 1.0},
        "rewards": ["success_reward"],
        "training": {"max_steps": 2, "num_iterations": 1, "learning_rate": 1e-3, "bf16": False, "use_cpu": True,
                     "report_to": [], "save_strategy": "steps", "save_steps": 2, "gradient_checkpointing": False,
                     "disable_tqdm": True, **(training or {})},
        **extra,
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _launch(config: str, script: list[str], recipe: Path, run_dir: Path, *extra: str,
            env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch`` on 2 CPU ranks in its own process group, killed whole on timeout."""
    accelerate = Path(sys.executable).with_name("accelerate")
    tests_dir = str(REPO / "tests")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p),
           "DIVERGE_TOKENIZER": tiny_tokenizer_path() or "", **(env_extra or {})}
    command = [str(accelerate), "launch", "--config_file", f"accelerate_configs/{config}", "--num_processes", "2",
               *script, str(recipe), "--output-dir", str(run_dir), *extra]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        pytest.fail(f"{config}: no result after {LAUNCH_TIMEOUT_S} s (deadlocked ranks?)\n{out[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, "")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _evaluates(final: Path, split_dir: Path, out: Path) -> None:
    code = eval_main(["--checkpoint", str(final), "--split-dir", str(split_dir), "--split", "test",
                      "--output-dir", str(out), "--limit", "1", "--max-new-tokens", "8"])
    assert code == 0 and (out / "metrics.json").is_file()


@pytest.mark.slow
def test_zero3_grpo_with_diverging_ranks_finishes_with_real_initial_weights(tmp_path, split_dir):
    tiny_tokenizer()
    start = tmp_path / "start"
    model = tiny_model(0, moe=True)
    model.save_pretrained(start)
    recipe = _recipe(tmp_path, split_dir, start, objective={"preset": "grpo", "beta": 0.04})
    run_dir = tmp_path / "run"
    done = _launch("deepspeed_zero3.yaml", [str(REPO / "tests" / "trainer" / "diverging_ranks_train.py")],
                   recipe, run_dir)
    assert done.returncode == 0, done.stdout[-4000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert manifest["initial_model"]["num_parameters"] == sum(p.numel() for p in model.parameters())
    start_weights, initial = weights(start), weights(run_dir / "initial_model")
    assert initial.keys() == start_weights.keys()
    for name, tensor in start_weights.items():
        assert torch.equal(initial[name], tensor), name  # was torch.Size([0]) under ZeRO-3

    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["tool_calls_per_trajectory"] > 0  # rank 0's second model turn happened
    assert rows[0]["completion_tokens_mean"] > 5  # ... while rank 1's turns stopped at 5 tokens
    assert rows[1]["kl"] > 0  # the ZeRO-3 reference model answered (world size 2) and differs

    final = run_dir / "final"
    assert (final / "modeling_minimind.py").is_file() and (final / "tokenizer.json").is_file()
    assert weights(final).keys() == start_weights.keys()
    _evaluates(final, split_dir, tmp_path / "eval")


@pytest.mark.slow
def test_zero3_reference_model_from_a_preset_sees_both_ranks(tmp_path, split_dir):
    """No ``from_pretrained`` (whose ``zero.Init`` would set it up): without DeepSpeed's own process
    group on CPU ranks, TRL's ZeRO-3 reference engine saw world size 1 and asserted (issue 25 E)."""
    tiny_tokenizer()
    recipe = _recipe(tmp_path, split_dir, tmp_path / "unused", objective={"preset": "grpo", "beta": 0.04})
    data = yaml.safe_load(recipe.read_text())
    data["model"] = {"preset": "tiny-moe"}
    recipe.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    done = _launch("deepspeed_zero3.yaml", ["-m", "minimind_trl.cli", "train"], recipe, run_dir)
    assert done.returncode == 0, done.stdout[-4000:]
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["kl"] > 0
    assert weights(run_dir / "initial_model").keys() == weights(run_dir / "final").keys()


@pytest.mark.slow
def test_zero2_lora_final_is_the_merged_whole_model(tmp_path, split_dir):
    tiny_tokenizer()
    start = tmp_path / "start"
    tiny_model(0).save_pretrained(start)
    peft = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    recipe = _recipe(tmp_path, split_dir, start, peft=peft, objective={"preset": "grpo"})
    run_dir = tmp_path / "run"
    done = _launch("deepspeed_zero2.yaml", ["-m", "minimind_trl.cli", "train"], recipe, run_dir)
    assert done.returncode == 0, done.stdout[-4000:]

    final = run_dir / "final"
    assert (final / "config.json").is_file() and (final / "modeling_minimind.py").is_file()
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    base = type(tiny_model(0)).from_pretrained(start)
    merged = PeftModel.from_pretrained(base, run_dir / "adapter").merge_and_unload().state_dict()
    saved = weights(final)
    assert saved.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=1e-6, msg=name)
    _evaluates(final, split_dir, tmp_path / "eval")


@pytest.mark.slow
def test_zero3_run_killed_mid_rollout_resumes_to_the_uninterrupted_result(tmp_path, split_dir):
    """K=2: every process exits right after step 1's checkpoint (inside rollout 1); ``--resume``
    replays the saved rollout and goes on. Final weights and every step's loss, KL and reward equal
    an uninterrupted ZeRO-3 run's."""
    tiny_tokenizer()
    start = tmp_path / "start"
    tiny_model(0).save_pretrained(start)
    recipe = _recipe(tmp_path, split_dir, start, objective={"preset": "grpo", "beta": 0.04},
                     training={"max_steps": 4, "num_iterations": 2, "save_steps": 1})
    train = ["-m", "minimind_trl.cli", "train"]
    whole = _launch("deepspeed_zero3.yaml", train, recipe, tmp_path / "whole")
    assert whole.returncode == 0, whole.stdout[-4000:]
    cut = tmp_path / "cut"
    killed = _launch("deepspeed_zero3.yaml", [str(REPO / "tests" / "trainer" / "exit_after_checkpoint_train.py")],
                     recipe, cut, env_extra={"EXIT_AFTER_STEP": "1"})
    assert killed.returncode != 0 and (cut / "checkpoint-1").is_dir() and not (cut / "final").exists()
    resumed = _launch("deepspeed_zero3.yaml", train, recipe, cut, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    expected, got = weights(tmp_path / "whole" / "final"), weights(cut / "final")
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    keys = ("step", "rollout", "update", "loss", "kl", "reward_mean", "max_abs_log_ratio", "grad_norm")
    def figures(run_dir: Path) -> list[dict]:
        return [{k: r[k] for k in keys} for r in _metrics(run_dir)]

    assert figures(cut) == figures(tmp_path / "whole")


def _preference_and_sft_data(root: Path) -> tuple[Path, Path]:
    """Gold trajectories (SFT rows) and, per row, the gold answer against "It is 7." (DPO rows)."""
    gold = [gold_trajectory(task, default_registry()) for task in generate_tasks(8, seed=5)]
    pairs = []
    for row in gold:
        conversation = row["conversations"]
        prompt = conversation[: next(i for i, m in enumerate(conversation) if m["role"] == "user") + 1]
        pairs.append({"chosen": conversation, "rejected": [*prompt, {"role": "assistant", "content": "It is 7."}]})
    write_jsonl_atomic(root / "dpo" / "train.jsonl", pairs)
    write_jsonl_atomic(root / "sft" / "train.jsonl", gold)
    return root / "dpo", root / "sft"


def _offline_recipe(path: Path, start: Path, per_device: int, **extra) -> Path:
    training = {"max_steps": 2, "per_device_train_batch_size": per_device, "gradient_accumulation_steps": 1,
                "learning_rate": 1e-3, "lr_scheduler_type": "constant", "bf16": False, "use_cpu": True,
                "report_to": [], "save_strategy": "no", "disable_tqdm": True, "logging_steps": 1}
    recipe = {"seed": 1, "model": {"path": str(start)}, "tokenizer": {"path": tiny_tokenizer_path()},
              "training": training, **extra}
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.slow
def test_zero3_dpo_on_two_ranks_matches_one_process_and_sft_finishes(tmp_path):
    """DPO's loss is a mean over pairs: 2 ranks x 2 pairs see the 4 pairs one process sees in one
    batch (same sampler order), so step 1 is the same number; its reference model is a ZeRO-3
    engine (issue 25 E). SFT (a token mean per rank, so no equality) finishes with real weights."""
    tiny_tokenizer()
    start = tmp_path / "start"
    model = tiny_model(0, moe=True)
    model.save_pretrained(start)
    dpo_data, sft_data = _preference_and_sft_data(tmp_path / "data")
    dpo = {"kind": "dpo", "data": {"path": str(dpo_data), "verify": False}, "dpo": {"max_length": 2048, "beta": 0.1}}
    one = _offline_recipe(tmp_path / "dpo_one.yaml", start, 4, **dpo)
    assert cli.main([str(one), "--output-dir", str(tmp_path / "dpo_one")]) == 0
    two = _offline_recipe(tmp_path / "dpo_two.yaml", start, 2, **dpo)
    done = _launch("deepspeed_zero3.yaml", ["-m", "minimind_trl.cli", "train"], two, tmp_path / "dpo_two")
    assert done.returncode == 0, done.stdout[-4000:]
    first_one, first_two = _metrics(tmp_path / "dpo_one")[0], _metrics(tmp_path / "dpo_two")[0]
    assert first_two["loss"] == pytest.approx(first_one["loss"], rel=1e-6)
    assert first_two["grad_norm"] == pytest.approx(first_one["grad_norm"], rel=1e-3)
    assert first_two["logps/chosen"] == pytest.approx(first_one["logps/chosen"], rel=1e-6)
    start_weights = weights(start)
    for name, tensor in weights(tmp_path / "dpo_two" / "initial_model").items():
        assert torch.equal(tensor, start_weights[name]), name

    sft = _offline_recipe(tmp_path / "sft.yaml", start, 2, kind="sft", sft={"max_length": 2048},
                          data={"path": str(sft_data), "verify": False})
    done = _launch("deepspeed_zero3.yaml", ["-m", "minimind_trl.cli", "train"], sft, tmp_path / "sft")
    assert done.returncode == 0, done.stdout[-4000:]
    rows = _metrics(tmp_path / "sft")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["loss"] < rows[0]["loss"]
    assert weights(tmp_path / "sft" / "final").keys() == start_weights.keys()


def _zero3_trainer(rollout_engine: str = "minimind", gather: bool = True, processes: int = 2):
    return SimpleNamespace(is_deepspeed_enabled=True, accelerator=SimpleNamespace(num_processes=processes),
                           args=SimpleNamespace(rollout_engine=rollout_engine, ds3_gather_for_generation=gather))


def test_zero3_on_several_processes_refuses_the_generation_paths_that_deadlock(monkeypatch):
    monkeypatch.setattr(grpo_trainer, "is_deepspeed_zero3_enabled", lambda: True)
    check = MiniMindGRPOTrainer._check_zero3_generation
    check(_zero3_trainer())  # the minimind engine on gathered weights: allowed
    check(_zero3_trainer("trl", processes=1))  # one process: no collective to miss
    with pytest.raises(ValueError, match="rollout.engine: trl under DeepSpeed ZeRO-3"):
        check(_zero3_trainer("trl"))
    with pytest.raises(ValueError, match="ds3_gather_for_generation: false"):
        check(_zero3_trainer(gather=False))
    monkeypatch.setattr(grpo_trainer, "is_deepspeed_zero3_enabled", lambda: False)
    check(_zero3_trainer("trl"))  # ZeRO-2 keeps whole weights on every rank


def test_full_weights_is_a_no_op_without_zero3_and_counts_partitioned_parameters():
    model = tiny_model(0)
    with full_weights(model) as inside:
        assert inside is model
    total = sum(p.numel() for p in model.parameters())
    assert num_parameters(model) == total
    first = next(model.parameters())
    first.ds_numel = first.numel() + 100  # a ZeRO-3 slice reports its whole size here
    assert num_parameters(model) == total + 100
