"""kill -9 loop (issue 17 acceptance): a tiny GRPO run under `minimind-trl train`, SIGKILLed at
moments drawn with a fixed seed (some while a ``.staging-checkpoint-*`` folder is being written),
then ``--resume`` until it completes. Every checkpoint present after every kill is complete and
equal to the uninterrupted run's; the final weights are bit-equal to it and so is every
metrics.jsonl field but the wall-clock timings."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import tiny_tokenizer_path
from safetensors.torch import load_file

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.trainer.recorder import read_metrics

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).resolve().parents[1] / "helpers.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
STEPS = 22
EPOCH = 8  # steps: 8 task rows, 2 prompts a rollout, K=2
KILLS = 6  # alternately at a random moment of a step and just after a checkpoint's staging folder appears
# wall-clock figures; everything else in a metrics record must be equal
TIMING = ("rollout_seconds", "old_logp_seconds", "update_seconds", "update_tokens_per_second",
          "generation_tokens_per_second")


def write_recipe(root: Path) -> Path:
    write_jsonl_atomic(root / "tasks.jsonl", generate_tasks(12, seed=3))
    prepare_splits([root / "tasks.jsonl"], root / "splits", seed=3, sizes=[8, 2, 2])
    recipe = {
        "kind": "grpo", "seed": 5, "model": {"preset": "tiny"}, "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(root / "splits")},
        "rollout": {"group_size": 2, "prompts_per_rollout": 2, "max_tool_turns": 1, "max_completion_length": 8,
                    "tool_names": ["calculate_math"]},
        "rewards": [{"name": "success_reward", "weight": 1.0}, {"name": f"{HELPERS}:text_reward", "weight": 1.0}],
        "training": {"max_steps": STEPS, "num_iterations": 2, "learning_rate": 1e-3, "lr_scheduler_type": "constant",
                     "bf16": False, "use_cpu": True, "report_to": [], "save_strategy": "steps", "save_steps": 1,
                     "gradient_checkpointing": False, "disable_tqdm": True},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def start(recipe: Path, run_dir: Path, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minimind_trl.cli", "train", str(recipe), "--output-dir",
                             str(run_dir), "--resume"], env=ENV, stdout=log, stderr=subprocess.STDOUT)


def checkpoints(run_dir: Path) -> dict[int, Path]:
    return {int(p.name.split("-")[1]): p for p in run_dir.glob("checkpoint-*")}


def training(run_dir: Path, pid: int) -> bool:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return status.get("state") == "running" and status.get("pid") == pid


def kill_once(proc: subprocess.Popen, run_dir: Path, mid_write: bool, rng: random.Random) -> bool:
    """SIGKILL ``proc`` once it trains (its resume has cleaned up the last kill's leftovers) and is
    2 or 3 steps further: at a random moment after that checkpoint, or (``mid_write``) just after
    its staging folder appears. Each kill advances the run by 1..4 steps, so 6 kills end between
    step 9 (a resume in the second epoch) and 21. False when the run ended first."""
    target = max(checkpoints(run_dir), default=0) + rng.randint(2, 3)
    delay = rng.uniform(0.0, 0.02) if mid_write else rng.uniform(0.0, 0.15)
    while proc.poll() is None:
        steps = [int(p.name.rsplit("-", 1)[1]) for p in run_dir.glob(".staging-checkpoint-*")] if mid_write \
            else list(checkpoints(run_dir))
        if training(run_dir, proc.pid) and max(steps, default=0) >= target:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return proc.returncode == -signal.SIGKILL
        time.sleep(0.002)
    return False


def assert_complete(run_dir: Path, reference: Path) -> None:
    """Every checkpoint on disk holds the reference's files and the reference's weights and step."""
    for step, folder in checkpoints(run_dir).items():
        expected = reference / folder.name
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in expected.iterdir()), folder
        assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step
        ours, theirs = load_file(folder / "model.safetensors"), load_file(expected / "model.safetensors")
        assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours), folder


def test_kill9_loop_resumes_to_the_uninterrupted_run(tmp_path):
    started = time.perf_counter()
    recipe = write_recipe(tmp_path)
    reference = tmp_path / "whole"
    with open(tmp_path / "whole.log", "wb") as log:
        assert subprocess.run([sys.executable, "-m", "minimind_trl.cli", "train", str(recipe), "--output-dir",
                               str(reference)], env=ENV, stdout=log, stderr=subprocess.STDOUT).returncode == 0
    run_dir = tmp_path / "killed"
    run_dir.mkdir()  # --resume on an empty folder starts the run
    rng = random.Random(17)
    kills, staging_left, reached = 0, 0, []
    with open(tmp_path / "killed.log", "wb") as log:
        for attempt in range(KILLS + 4):
            if kills == KILLS:
                break
            proc = start(recipe, run_dir, log)
            if not kill_once(proc, run_dir, mid_write=attempt % 2 == 1, rng=rng):
                assert proc.returncode == 0, (tmp_path / "killed.log").read_text()[-3000:]
                break
            kills += 1
            staging_left += any(run_dir.glob(".staging-checkpoint-*"))
            reached.append(max(checkpoints(run_dir), default=0))
            assert_complete(run_dir, reference)
        assert kills == KILLS and staging_left >= 1 and reached[-1] > EPOCH, (kills, staging_left, reached)
        proc = start(recipe, run_dir, log)
        assert proc.wait() == 0, (tmp_path / "killed.log").read_text()[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["step"] == STEPS
    assert_complete(run_dir, reference)
    assert not list(run_dir.glob(".staging-*"))  # leftovers of killed saves are gone
    final = load_file(run_dir / "final" / "model.safetensors")
    whole = load_file(reference / "final" / "model.safetensors")
    assert final.keys() == whole.keys() and all(final[k].equal(whole[k]) for k in final)
    ours, theirs = read_metrics(run_dir / "metrics.jsonl"), read_metrics(reference / "metrics.jsonl")
    assert [r["step"] for r in ours] == list(range(1, STEPS + 1))
    for a, b in zip(ours, theirs):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
    resumes = json.loads((run_dir / "manifest.json").read_text())["resumes"]
    assert len(resumes) == KILLS  # every kill came after the start wrote its manifest
    print(f"kill -9 loop: {kills} kills ({staging_left} mid-checkpoint), newest checkpoint after each {reached}, "
          f"{len(resumes)} resumes, "
          f"{time.perf_counter() - started:.0f} s")
