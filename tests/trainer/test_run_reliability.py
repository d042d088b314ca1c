"""Run folders under faults (issues 17.2, 17.7, 16.1): a failed or killed start never blocks a
re-run or --resume; --resume never trains past max_steps and is a no-op on a completed run;
final/ is replaced by renames and leftovers are removed; modes follow the umask; trackers log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer, train, weights, write_recipe
from huggingface_hub.constants import HF_HOME
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minimind_trl.fsio import aside_path
from minimind_trl.run_folder import RunFolder
from minimind_trl.trainer import run
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import prepare_run_dir, read_status


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("bad, named", [
    ({"eval_strategy": "steps", "eval_steps": 1}, "eval_strategy"),  # no eval data
    ({"report_to": ["clearml"]}, "clearml"),  # a tracker that is not installed
])
def test_a_failed_trainer_build_exits_2_and_leaves_nothing_behind(tmp_path, split_dir, capsys, bad, named):
    recipe = write_recipe(tmp_path, split_dir, **bad)
    run_dir = tmp_path / "run"
    assert train(recipe, run_dir) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "minimind-trl" in line]
    assert len(errors) == 1 and errors[0].startswith(f"minimind-trl train: {recipe}: training:"), errors
    assert named in errors[0]
    assert run_dir.is_dir() and list(run_dir.iterdir()) == []  # no initial_model/ left behind
    assert train(recipe, run_dir, "--resume") == 2  # the same recipe fails the same way, still nothing left
    assert list(run_dir.iterdir()) == []
    assert train(write_recipe(tmp_path, split_dir), run_dir) == 0  # the fixed recipe runs in that folder


def test_a_killed_start_blocks_neither_a_rerun_nor_resume(tmp_path, split_dir):
    recipe = write_recipe(tmp_path, split_dir, max_steps=1, save_strategy="no")
    for extra in ((), ("--resume",)):
        run_dir = tmp_path / f"run{len(extra)}"
        (run_dir / "initial_model").mkdir(parents=True)  # what a kill before the manifest leaves
        (run_dir / ".staging-initial_model").mkdir()
        (run_dir / ".staging-initial_model" / "config.json").write_text("{")
        assert train(recipe, run_dir, *extra) == 0
        assert read_status(run_dir)["state"] == "completed"
        assert not (run_dir / ".staging-initial_model").exists()
        assert (run_dir / "initial_model" / "config.json").is_file()


def test_resume_after_a_kill_in_the_final_save_stops_at_max_steps(tmp_path, split_dir, monkeypatch, umask_022):
    recipe = write_recipe(tmp_path, split_dir)
    run_dir = tmp_path / "run"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while saving final/")

    monkeypatch.setattr(run, "save_final_model", killed)
    with pytest.raises(KeyboardInterrupt):
        train(recipe, run_dir)
    monkeypatch.undo()
    assert read_status(run_dir)["state"] == "running" and (run_dir / "checkpoint-2").is_dir()
    for leftover in (".final.abc.tmp", ".final.old-xyz", "final.old", ".staging-final", "..staging-final.q.tmp"):
        (run_dir / leftover).mkdir()
        (run_dir / leftover / "model.safetensors").write_bytes(b"partial")
    assert train(recipe, run_dir, "--resume") == 0
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]  # no step 3
    status = read_status(run_dir)
    assert status["state"] == "completed" and status["step"] == 2
    final = weights(run_dir / "final")
    for name, value in weights(run_dir / "checkpoint-2").items():
        assert torch.equal(final[name], value), name
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".") or p.name.endswith(".old")) == []
    assert (run_dir / "final").stat().st_mode & 0o777 == 0o755  # the umask's modes, not mkdtemp's 0700
    assert {(p.stat().st_mode & 0o777) for p in (run_dir / "final").iterdir()} == {0o644}


def test_resuming_a_completed_run_does_nothing_and_says_so(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    run_dir = tmp_path / "run"
    assert train(recipe, run_dir) == 0
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "final").iterdir()}
    metrics = (run_dir / "metrics.jsonl").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    capsys.readouterr()
    assert train(recipe, run_dir, "--resume") == 0
    assert "already completed (step 2); nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "final").iterdir()} == before
    assert (run_dir / "metrics.jsonl").read_text() == metrics
    assert json.loads((run_dir / "manifest.json").read_text())["resumes"] == manifest["resumes"] == []
    assert train(recipe, run_dir, "--resume", "--set", "training.max_steps=3") == 2  # another recipe: refused
    assert "differs" in capsys.readouterr().err


def test_final_is_replaced_by_renames_never_deleted_first(tmp_path, monkeypatch):
    model, tokenizer = tiny_model(), tiny_tokenizer()
    final = tmp_path / "final"
    run.save_final_model(model, tokenizer, final)
    old = {k: v.clone() for k, v in weights(final).items()}
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    real_replace = os.replace

    def killed_before_the_new_one_is_in(src, dst):
        if Path(dst) == final:
            raise KeyboardInterrupt("killed between the renames")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_before_the_new_one_is_in)
    with pytest.raises(KeyboardInterrupt):
        run.save_final_model(model, tokenizer, final)
    monkeypatch.undo()
    aside = aside_path(final)  # the previous final/ is still whole, moved aside
    assert not final.exists()
    for name, value in weights(aside).items():
        assert torch.equal(old[name], value), name
    (tmp_path / "manifest.json").write_text("{}")
    prepare_run_dir(tmp_path, resume=True)  # the resume moves it back: old or new, never none
    assert not aside.exists() and not (tmp_path / ".staging-final").exists()
    for name, value in weights(final).items():
        assert torch.equal(old[name], value), name


def test_a_kill_between_the_final_renames_leaves_a_readable_final(tmp_path):
    """A real kill (os._exit in a child process) right after final/ was moved aside: readers
    (RunFolder.final_model) and the next save find the old weights, never no final/."""
    final = tmp_path / "final"
    run.save_final_model(tiny_model(), tiny_tokenizer(), final)
    old = {k: v.clone() for k, v in weights(final).items()}
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import torch
        from helpers import tiny_model, tiny_tokenizer
        from minimind_trl.trainer import run
        model = tiny_model()
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        real = os.replace
        def replace(src, dst):
            real(src, dst)
            if os.path.basename(dst) == ".old-final":
                os._exit(9)
        os.replace = replace
        run.save_final_model(model, tiny_tokenizer(), {str(final)!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 9, result.stderr[-2000:]
    assert not final.exists() and aside_path(final).is_dir()
    (tmp_path / "manifest.json").write_text("{}")
    assert RunFolder(tmp_path).final_model() == final
    for name, value in weights(final).items():
        assert torch.equal(old[name], value), name
    assert not aside_path(final).exists()


def test_tensorboard_reporting_writes_event_files(tmp_path, split_dir):
    recipe = write_recipe(tmp_path, split_dir, report_to=["tensorboard"], save_strategy="no")
    assert train(recipe, tmp_path / "run") == 0
    events = list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events and all(p.stat().st_size > 0 for p in events)
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    assert "train/reward" in accumulator.Tags()["scalars"]


def test_trackio_reporting_logs_locally(tmp_path, split_dir):
    recipe = write_recipe(tmp_path, split_dir, report_to=["trackio"], save_strategy="no", project="mm-trl-test")
    assert train(recipe, tmp_path / "run") == 0
    assert list((Path(HF_HOME) / "trackio").glob("mm-trl-test*")), sorted((Path(HF_HOME) / "trackio").rglob("*"))
