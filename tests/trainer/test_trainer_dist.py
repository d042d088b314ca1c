"""Two processes (torchrun, gloo on CPU) give the gradients of one process on the full rollout.

Run as a script by torchrun (``__main__`` below): each rank trains 2 steps on half of every
rollout (per-device batch 4, world size 2); rank 0 saves the first step's gradients. The test
compares them, and the metrics, with an in-process run on the full batch (8 rows, 1 process).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import (  # tests/ is on sys.path (pytest's pythonpath; PYTHONPATH under torchrun)
    GradGrab,
    make_trainer,
    run_two_cpu_ranks,
)

from minimind_trl.trainer.recorder import read_metrics

STEPS = dict(max_steps=2, num_iterations=2, max_grad_norm=0.0)


def _train(run_dir, per_device: int):
    grab = GradGrab()
    trainer = make_trainer(run_dir, callbacks=[grab], per_device_train_batch_size=per_device, **STEPS)
    trainer.train()
    return trainer, grab.grads


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    done = run_two_cpu_ranks(str(Path(__file__)), tmp_path / "two", timeout=240)
    grads_file = tmp_path / "two" / "grads.pt"
    assert grads_file.is_file(), done.stdout[-3000:] + done.stderr[-3000:]

    _, full_grads = _train(tmp_path / "one", per_device=8)
    two_grads = torch.load(grads_file)
    assert two_grads["world_size"] == 2
    for key, full in full_grads.items():
        torch.testing.assert_close(two_grads["grads"][key], full, rtol=1e-5, atol=1e-7)
    one, two = read_metrics(tmp_path / "one" / "metrics.jsonl"), read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        for key in ("loss", "policy_loss", "grad_norm", "ratio_mean", "max_abs_log_ratio", "entropy",
                    "reward_mean", "rollout_valid_rows", "rollout_action_tokens", "num_action_tokens"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


def _main(run_dir: str) -> None:
    torch.set_num_threads(1)
    trainer, grads = _train(run_dir, per_device=4)
    if trainer.accelerator.is_main_process:
        torch.save({"world_size": trainer.accelerator.num_processes, "grads": grads}, Path(run_dir) / "grads.pt")
    trainer.accelerator.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)  # gloo sometimes aborts at interpreter exit after a finished run


if __name__ == "__main__":
    _main(sys.argv[1])
