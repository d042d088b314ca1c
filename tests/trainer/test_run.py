"""Run discipline through `minimind-trl train`: manifest, refusal, resume equivalence, atomic
checkpoints, stop on non-finite values (tiny MiniMind, tool environment, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import make_trainer, tiny_tokenizer_path
from transformers import TrainerCallback

from minimind_trl.cli import main as top_main
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.modeling import MiniMindForCausalLM
from minimind_trl.trainer import build, cli
from minimind_trl.trainer.errors import NonFiniteError
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import prepare_run_dir, read_status, run_training

HELPERS = Path(__file__).resolve().parents[1] / "helpers.py"
TIMING = ("rollout_seconds", "old_logp_seconds", "update_seconds", "update_tokens_per_second",
          "generation_tokens_per_second")


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_jsonl_atomic(root / "tasks.jsonl", generate_tasks(24, seed=3))
    prepare_splits([root / "tasks.jsonl"], root / "splits", seed=3, sizes=[16, 4, 4])
    return root / "splits"


def write_recipe(folder: Path, split_dir: Path, **sections) -> Path:
    recipe = {
        "kind": "grpo",
        "seed": 7,
        "model": {"preset": "tiny"},
        "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(split_dir), "split": "train"},
        "objective": {"preset": "grpo"},
        "rollout": {"group_size": 2, "prompts_per_rollout": 2, "max_tool_turns": 1, "thinking_ratio": 0.5,
                    "max_completion_length": 16, "tool_names": ["calculate_math"]},
        "rewards": [{"name": "success_reward", "weight": 1.0}, {"name": f"{HELPERS}:text_reward", "weight": 0.5}],
        "training": {"learning_rate": 1e-3, "lr_scheduler_type": "constant", "max_steps": 6, "num_iterations": 4,
                     "bf16": False, "gradient_checkpointing": False, "report_to": [], "use_cpu": True,
                     "save_strategy": "steps", "save_steps": 2, "disable_tqdm": True},
    }
    for name, values in sections.items():
        recipe[name] = {**recipe[name], **values} if isinstance(values, dict) else values
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


class KillAt(TrainerCallback):
    """Simulates a kill right after step ``step`` was logged (before any save of that step)."""

    def __init__(self, step: int):
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt(f"killed at step {self.step}")


def test_resumed_run_reproduces_the_uninterrupted_one(tmp_path, split_dir, monkeypatch):
    recipe = write_recipe(tmp_path, split_dir, training={"max_steps": 5})
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "whole")]) == 0

    original = build.build_trainer

    def with_kill(*args, **kwargs):
        trainer = original(*args, **kwargs)
        trainer.add_callback(KillAt(3))  # step 3: mid-rollout (K=4), last checkpoint at step 2
        return trainer

    monkeypatch.setattr(build, "build_trainer", with_kill)
    with pytest.raises(KeyboardInterrupt):
        cli.main([str(recipe), "--output-dir", str(tmp_path / "split")])
    monkeypatch.setattr(build, "build_trainer", original)
    assert [r["step"] for r in read_metrics(tmp_path / "split" / "metrics.jsonl")] == [1, 2, 3]
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "split"), "--resume"]) == 0

    whole = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in split] == [1, 2, 3, 4, 5]  # the killed step 3 was cut and redone
    for a, b in zip(whole, split):
        for key, value in a.items():
            if key in TIMING:
                continue
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (a["step"], key)
            else:
                assert b[key] == value, (a["step"], key)
    assert whole[4]["update"] == 0 and whole[4]["rollout"] == 1  # resumed across a new rollout too
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert manifest["resumes"][0]["checkpoint"].endswith("checkpoint-2")
    assert read_status(tmp_path / "split")["state"] == "completed"
    final_whole = MiniMindForCausalLM.from_pretrained(tmp_path / "whole" / "final")
    final_split = MiniMindForCausalLM.from_pretrained(tmp_path / "split" / "final")
    for (name, a), (_, b) in zip(final_whole.state_dict().items(), final_split.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kill_at", [5, 6])  # resumes from checkpoint-4 (epoch boundary) / -5 (epoch 1, 1 batch in)
def test_a_resume_in_a_later_epoch_sees_the_uninterrupted_data_order(tmp_path, split_dir, monkeypatch, kill_at):
    """16 rows, 4 prompts a rollout, K=1: an epoch is 4 steps. TRL's sampler draws every epoch's
    order from one generator seeded once; a resumed run's fresh sampler replayed epoch 0's order
    in epoch 1 (rewards from step 5 on differed) until set_epoch replayed the earlier draws."""
    recipe = write_recipe(tmp_path, split_dir, rollout={"prompts_per_rollout": 4},
                          training={"max_steps": 7, "num_iterations": 1, "save_steps": 1})
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "whole")]) == 0
    original = build.build_trainer

    def with_kill(*args, **kwargs):
        trainer = original(*args, **kwargs)
        trainer.add_callback(KillAt(kill_at))  # logged, not yet saved: the resume starts at kill_at - 1
        return trainer

    monkeypatch.setattr(build, "build_trainer", with_kill)
    with pytest.raises(KeyboardInterrupt):
        cli.main([str(recipe), "--output-dir", str(tmp_path / "split")])
    monkeypatch.setattr(build, "build_trainer", original)
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "split"), "--resume"]) == 0
    whole = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in split] == list(range(1, 8))
    for a, b in zip(whole, split):
        same = {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
        assert same, a["step"]
    final_whole = MiniMindForCausalLM.from_pretrained(tmp_path / "whole" / "final").state_dict()
    final_split = MiniMindForCausalLM.from_pretrained(tmp_path / "split" / "final").state_dict()
    assert all(torch.equal(final_whole[name], value) for name, value in final_split.items())


def test_manifest_records_the_run(tmp_path, split_dir):
    recipe = write_recipe(tmp_path, split_dir, training={"max_steps": 1, "num_iterations": 1, "save_strategy": "no"})
    run_dir = tmp_path / "run"
    assert top_main(["train", str(recipe), "--output-dir", str(run_dir), "--set", "objective.preset=cispo",
                     "--set", "rewards.1.weight=2"]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["recipe"]["objective"]["preset"] == "cispo" and manifest["recipe"]["rewards"][1]["weight"] == 2
    assert manifest["objective"]["policy"] == "cispo" and manifest["training_args"]["reward_weights"] == [1.0, 2.0]
    assert manifest["training_args"]["prefix_sharing"] is True  # the default policy pass is recorded
    assert manifest["data"]["verified"] and len(manifest["data"]["file_sha256"]) == 64
    assert manifest["seed"] == 7 and manifest["world_size"] == 1
    assert manifest["torch_threads"] == torch.get_num_threads()
    assert manifest["replay"] == {"passes": 1, "minibatches": 1, "updates_per_rollout": 1}
    assert manifest["precision"] == {"requested": False, "bf16": False, "device": "cpu", "reason": "set in the recipe",
                                     "attention_fp32": False}
    assert manifest["versions"]["trl"] and manifest["versions"]["torch"] and "git" in manifest
    assert (run_dir / "initial_model" / "config.json").is_file() and (run_dir / "final" / "config.json").is_file()
    row = read_metrics(run_dir / "metrics.jsonl")[0]
    assert "reward/success_reward_mean" in row and "reward/text_reward_mean" in row
    assert "cispo_truncation_fraction" in row


def test_refuses_a_non_empty_run_folder(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "busy")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "busy"), "--resume"]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_killed_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3, num_iterations=2, save_strategy="steps", save_steps=1)
    real_save = trainer._save_optimizer_and_scheduler

    def dying_save(output_dir):
        if trainer.state.global_step == 2:
            (Path(output_dir) / "optimizer.pt").write_bytes(b"half a file")
            raise KeyboardInterrupt("killed while saving checkpoint-2")
        real_save(output_dir)

    trainer._save_optimizer_and_scheduler = dying_save
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert not (tmp_path / "checkpoint-2").exists()
    assert (tmp_path / ".staging-checkpoint-2").exists()
    last = tmp_path / "checkpoint-1"
    MiniMindForCausalLM.from_pretrained(last)
    torch.load(last / "optimizer.pt", weights_only=True)
    assert json.loads((last / "trainer_state.json").read_text())["global_step"] == 1
    (tmp_path / "manifest.json").write_text("{}")
    assert prepare_run_dir(tmp_path, resume=True) == str(last)
    assert not (tmp_path / ".staging-checkpoint-2").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_non_finite_loss_stops_before_the_optimizer_step(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3, num_iterations=2)
    real_forward = trainer._policy_forward  # the one forward of the replay and the updates

    def poisoned(model, *args, **kwargs):
        logps, entropies, aux, router = real_forward(model, *args, **kwargs)
        if trainer.state.global_step == 1 and torch.is_grad_enabled():
            logps = logps + float("nan")
        return logps, entropies, aux, router

    trainer._policy_forward = poisoned
    with pytest.raises(NonFiniteError, match="non-finite loss or gradient at step 2"):
        run_training(trainer, tmp_path, None)
    status = read_status(tmp_path)
    assert status["state"] == "stopped" and "loss=nan" in status["reason"] and status["step"] == 1
    saved = MiniMindForCausalLM.from_pretrained(Path(status["checkpoint"]))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(saved.state_dict()[name], value), name  # the bad step was not applied
        assert torch.isfinite(value).all()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_non_finite_reward_stops_the_cli_run(tmp_path, split_dir, capsys):
    plugin = tmp_path / "bad_reward.py"
    plugin.write_text(
        "def nan_after_step_one(prompts, completions, trainer_state=None, **kwargs):\n"
        "    bad = trainer_state is not None and trainer_state.global_step >= 1\n"
        "    return [float('nan') if bad else 0.5 for _ in completions]\n"
    )
    recipe = write_recipe(
        tmp_path, split_dir, rewards=[{"name": f"{plugin}:nan_after_step_one"}],
        training={"max_steps": 3, "num_iterations": 1, "save_strategy": "no"},
    )
    assert cli.main([str(recipe), "--output-dir", str(tmp_path / "run")]) == 3
    err = capsys.readouterr().err
    assert "non-finite reward" in err and "nan_after_step_one" in err
    status = read_status(tmp_path / "run")
    assert status["state"] == "stopped" and status["step"] == 1
    assert (tmp_path / "run" / "checkpoint-1" / "rollout_state_0.pt").is_file()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1]


def test_grpo_evaluates_on_the_val_split_during_training(tmp_path, split_dir):
    """data.eval_split + training.eval_strategy: TRL's evaluation loop runs rollouts on the val rows
    (their rewards logged as eval_*), the manifest names the eval file; unset, the key is left out."""
    recipe = write_recipe(tmp_path, split_dir, data={"eval_split": "val"},
                          training={"max_steps": 2, "num_iterations": 1, "save_strategy": "no",
                                    "eval_strategy": "steps", "eval_steps": 2, "per_device_eval_batch_size": 4})
    run_dir = tmp_path / "run"
    assert top_main(["train", str(recipe), "--output-dir", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["data"]["eval"]["split"] == "val" and manifest["data"]["eval"]["rows"] == 4
    assert read_status(run_dir)["state"] == "completed"
    (evaluation,) = read_metrics(run_dir / "eval_metrics.jsonl")  # eval_steps=2, max_steps=2: once
    assert evaluation["step"] == 2 and "eval_loss" in evaluation
    assert any(key.startswith("eval_reward") for key in evaluation), sorted(evaluation)
    assert all("eval_loss" not in row for row in read_metrics(run_dir / "metrics.jsonl"))  # step records apart


def test_eval_split_needs_a_known_split_and_a_supported_kind(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir, data={"eval_split": "nope"}, training={"max_steps": 1})
    assert top_main(["train", str(recipe), "--output-dir", str(tmp_path / "run")]) == 2
    assert "nope" in capsys.readouterr().err
