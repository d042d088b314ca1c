"""An update that overflows (learning rate 1e38) is the non-finite stop, exit 3, not a torch
traceback: non-finite weights after the optimizer step, torch's float overflow inside it and a
non-finite sampling distribution in the next rollout all stop with status "stopped", the broken
state unsaved and the newest complete checkpoint named as the last good state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import train, weights, write_recipe

from minimind_trl.trainer import run
from minimind_trl.trainer.errors import NonFiniteStateError
from minimind_trl.trainer.run import read_status


def stop_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minimind-trl train:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_lr_1e38_stops_after_the_last_good_step(tmp_path, split_dir, capsys):  # noqa: F811
    # step 1 warms up at lr 0 and is checkpointed; step 2 runs at 1e38 (fused AdamW: weights NaN)
    recipe = write_recipe(tmp_path, split_dir, learning_rate=1e38, max_steps=3, save_steps=1,
                          lr_scheduler_type="constant_with_warmup", warmup_steps=1)
    run_dir = tmp_path / "run"
    assert train(recipe, run_dir) == 3
    line = stop_line(capsys)
    assert "the weights are not finite after the optimizer step of step 2" in line and "Not saved" in line
    status = read_status(run_dir)
    assert status["state"] == "stopped" and status["step"] == 1
    assert status["checkpoint"] == str(run_dir / "checkpoint-1") and not (run_dir / "checkpoint-2").exists()
    assert "weights are not finite" in status["reason"]
    initial = weights(run_dir / "initial_model")
    for name, value in weights(run_dir / "checkpoint-1").items():  # lr 0: the last good state is the start
        assert torch.isfinite(value).all() and torch.equal(value, initial[name]), name


def test_an_optimizer_step_overflowing_float_is_the_same_stop(tmp_path, split_dir, capsys):  # noqa: F811
    # AdamW's for-loop step converts lr / (1 - beta1) = 1e39 to float32 and raises
    recipe = write_recipe(tmp_path, split_dir, learning_rate=1e38, optim="adamw_torch", max_steps=2, save_steps=1)
    run_dir = tmp_path / "run"
    assert train(recipe, run_dir) == 3
    line = stop_line(capsys)
    assert "cannot be converted to type float without overflow" in line and "Traceback" not in line
    status = read_status(run_dir)
    assert status["state"] == "stopped" and status["checkpoint"] is None and status["step"] == 0
    assert not list(run_dir.glob("checkpoint-*"))  # the half-updated weights were not saved


def fake_trainer(error: Exception, tmp_path):
    def fail(resume_from_checkpoint=None):
        raise error

    return SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True), add_callback=lambda callback: None,
                           train=fail, state=SimpleNamespace(global_step=4),
                           args=SimpleNamespace(output_dir=str(tmp_path)))


def test_sampling_from_a_non_finite_policy_is_the_same_stop(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    nan_policy = RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    with pytest.raises(NonFiniteStateError, match="after step 4: probability tensor"):
        run.run_training(fake_trainer(nan_policy, tmp_path), tmp_path, None)
    status = read_status(tmp_path)
    assert (status["state"], status["step"], status["checkpoint"]) == ("stopped", 4, str(tmp_path / "checkpoint-4"))
    with pytest.raises(RuntimeError, match="some other bug"):  # other errors are not a non-finite stop
        run.run_training(fake_trainer(RuntimeError("some other bug"), tmp_path), tmp_path, None)
