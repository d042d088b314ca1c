"""Issue 40.1: no command deletes or writes over a folder it did not make, nor over its own input.

Every writer checks its target through :mod:`minimind_trl.targets` (one rule): a non-empty folder
that is not an earlier output of the same kind, a folder holding a run, split, eval, sweep or demo
record, the command's input or a folder above it, a path under a file, the root and home folders,
and a target whose lock another process holds are refused with one line and exit 2, and the target
is left as it was. No model is trained here: folders on disk suffice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minimind_trl import demo, fsio, sweep
from minimind_trl.cli import main as cli_main
from minimind_trl.data.cli import main as data_main
from minimind_trl.data.generator import generate_tasks
from minimind_trl.eval.folder import EVAL_MANIFEST
from minimind_trl.fsio import lock_path, sha256_file, write_jsonl_atomic
from minimind_trl.modeling import save_for_hub
from minimind_trl.run_folder import MANIFEST
from minimind_trl.targets import MARKERS, OutputTargetError, TargetNotEmptyError, check_output_folder

HOLD = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("fsio", sys.argv[2])  # fsio alone: no torch to import
    fsio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fsio)
    fsio.lock_folder(sys.argv[1], "holder under test")
    print("locked", flush=True)
    time.sleep(600)
""")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(code: int, capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]  # progress bars of an earlier command may come before it
    assert last.startswith("minimind-trl "), err
    for needle in needles:
        assert needle in last, err
    return last


@pytest.fixture
def run(tmp_path, make_tiny_model, tokenizer) -> Path:
    """A run folder on disk: manifest, metrics, a checkpoint and final/ (nothing trained)."""
    folder = tmp_path / "run"
    save_for_hub(make_tiny_model(), tokenizer, folder / "final")
    (folder / "manifest.json").write_text(json.dumps({"kind": "grpo", "recipe_sha256": "0" * 64}))
    (folder / "status.json").write_text(json.dumps({"state": "running"}))
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "trainer_state.json").write_text("{}")
    return folder


@pytest.fixture
def holder(tmp_path):
    """Start a process holding a path's lock: ``holder(path)``; killed at the end."""
    procs = []

    def hold(path: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), fsio.__file__], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "locked"
        procs.append(proc)
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------- export


def test_export_into_its_own_run_or_an_ancestor_is_refused_and_the_run_kept(run, capsys):
    before = snapshot(run)
    refused(cli_main(["export", str(run / "final"), str(run)]), capsys, str(run))
    refused(cli_main(["export", str(run), str(run)]), capsys, str(run))
    refused(cli_main(["export", str(run), str(run.parent)]), capsys)
    assert snapshot(run) == before
    assert not lock_path(run).exists()


def test_export_into_a_foreign_folder_a_home_or_under_a_file_is_refused(run, tmp_path, monkeypatch, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    refused(cli_main(["export", str(run), str(foreign)]), capsys, "not empty", "earlier")
    assert (foreign / "notes.txt").read_text() == "keep me"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("keep me")
    monkeypatch.setenv("HOME", str(home))
    refused(cli_main(["export", str(run), str(home)]), capsys, "home folder")
    refused(cli_main(["export", str(run), "/"]), capsys, "root folder")
    assert (home / ".bashrc").read_text() == "keep me"
    refused(cli_main(["export", str(run), str(foreign / "notes.txt" / "out")]), capsys, "is a file")


def test_export_replaces_an_earlier_export_and_refuses_an_eval_folder(run, tmp_path, capsys):
    out = tmp_path / "export"
    assert cli_main(["export", str(run), str(out), "--format", "qwen3"]) == 0
    assert cli_main(["export", str(run), str(out)]) == 0  # an earlier Hub export: replaced
    assert (out / "modeling_minimind.py").is_file()
    (out / "eval_manifest.json").write_text("{}")
    refused(cli_main(["export", str(run), str(out)]), capsys, "eval_manifest.json")
    assert (out / "eval_manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "run"]  # no lock or staging left


def test_gguf_export_never_writes_over_a_run_file_or_another_file(run, tmp_path, capsys):
    before = snapshot(run)
    refused(cli_main(["export", str(run / "final"), str(run / "metrics.jsonl"), "--format", "gguf"]), capsys,
            "never written")
    refused(cli_main(["export", str(run), str(run / "final" / "model.gguf"), "--format", "gguf"]), capsys, "inside")
    assert snapshot(run) == before
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    refused(cli_main(["export", str(run), str(other), "--format", "gguf"]), capsys, "GGUF")
    assert other.read_text() == "keep me"


def test_export_into_a_locked_target_is_refused(run, tmp_path, holder, capsys):
    out = tmp_path / "export"
    proc = holder(out)
    refused(cli_main(["export", str(run), str(out)]), capsys, f"pid {proc.pid}")
    assert not out.exists()


# ------------------------------------------------------------------------------------------ eval


def test_eval_under_a_file_inside_its_split_or_into_a_locked_folder_is_one_line(run, split_dir, tmp_path, holder,
                                                                                 capsys):
    def eval_into(out) -> int:
        return cli_main(["eval", "--checkpoint", str(run / "final"), "--split-dir", str(split_dir), "--output-dir",
                         str(out), "--limit", "1", "--max-new-tokens", "2", "--device", "cpu"])

    afile = tmp_path / "afile"
    afile.write_text("x")
    refused(eval_into(afile / "eval"), capsys, "is a file")
    refused(eval_into(split_dir / "eval"), capsys, "inside")
    refused(eval_into(run), capsys, "input")
    out = tmp_path / "eval"
    proc = holder(out)
    refused(eval_into(out), capsys, f"pid {proc.pid}")
    assert not out.exists() and not (tmp_path / ".staging-eval").exists()


# ---------------------------------------------------------------------------- summarize and plot


def _eval_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    record = {"id": "q1", "success": True, "all_gt_covered": True, "gt_hits": [True], "n_tool_calls": 1,
              "answer_length": 3}
    (path / "records.jsonl").write_text(json.dumps(record) + "\n")
    (path / "metrics.json").write_text(json.dumps({"task_success": 1.0}))
    outputs = {name: sha256_file(path / name) for name in ("records.jsonl", "metrics.json")}
    (path / "eval_manifest.json").write_text(json.dumps({"split": {"name": "test", "manifest_sha256": "a" * 64,
                                                                   "evaluated": 1}, "outputs": outputs}))
    return path


def test_summarize_overwrites_only_an_earlier_summary(tmp_path, capsys):
    sft = _eval_folder(tmp_path / "sft")
    common = ["--n-resamples", "50"]
    before = snapshot(sft)
    refused(cli_main(["summarize", str(sft), "--output-dir", str(sft), "--overwrite", *common]), capsys, "input")
    other = _eval_folder(tmp_path / "other")
    refused(cli_main(["summarize", str(sft), "--output-dir", str(other), "--overwrite", *common]), capsys,
            "eval_manifest.json")
    assert snapshot(sft) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    refused(cli_main(["summarize", str(sft), "--output-dir", str(mine), "--overwrite", *common]), capsys,
            "not an earlier summary")
    out = tmp_path / "summary"
    assert cli_main(["summarize", str(sft), "--output-dir", str(out), *common]) == 0
    assert cli_main(["summarize", str(sft), "--output-dir", str(out), "--overwrite", *common]) == 0
    capsys.readouterr()
    refused(cli_main(["summarize", str(sft), "--output-dir", str(out), *common]), capsys, "--overwrite")


def test_plot_never_replaces_a_run_folder(run, tmp_path, capsys):
    before = snapshot(run)
    refused(cli_main(["plot", "--runs", str(run), "--output-dir", str(run)]), capsys, str(run))
    refused(cli_main(["plot", "--runs", str(run), "--output-dir", str(tmp_path)]), capsys)
    assert snapshot(run) == before
    figures = tmp_path / "figures"
    assert cli_main(["plot", "--runs", str(run), "--output-dir", str(figures)]) == 0
    assert cli_main(["plot", "--runs", str(run), "--output-dir", str(figures)]) == 0  # earlier figures: replaced
    (figures / "notes.txt").write_text("keep me")
    refused(cli_main(["plot", "--runs", str(run), "--output-dir", str(figures)]), capsys, "not an earlier")
    assert (figures / "notes.txt").read_text() == "keep me"


# ------------------------------------------------------------------------------------------ data


def test_data_commands_never_write_over_their_input_or_a_manifest(run, tmp_path, capsys):
    tasks = tmp_path / "t.jsonl"
    write_jsonl_atomic(tasks, generate_tasks(2, seed=1))
    before = tasks.read_bytes()
    refused(data_main(["gold", "--input", str(tasks), "--output", str(tasks)]), capsys, "input")
    assert tasks.read_bytes() == before
    manifest = (run / "manifest.json").read_bytes()
    refused(data_main(["generate", "--num-tasks", "2", "--seed", "1", "--output", str(run / "manifest.json")]), capsys,
            "manifest")
    refused(data_main(["generate", "--num-tasks", "2", "--seed", "1", "--output", str(run / "metrics.jsonl")]), capsys,
            "never written")
    assert (run / "manifest.json").read_bytes() == manifest
    both = str(tmp_path / "same.jsonl")
    refused(data_main(["generate", "--num-tasks", "2", "--seed", "1", "--output", both, "--gold-sft", both]), capsys,
            "same file")
    refused(data_main(["prepare", "--input", str(tasks), "--output-dir", str(tmp_path)]), capsys, "input")
    assert tasks.read_bytes() == before


# ------------------------------------------------------------------------------ train, sweep, demo


def test_train_sweep_and_demo_refuse_a_folder_under_a_file_or_of_another_kind(run, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    evaluation = _eval_folder(tmp_path / "evaluation")
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smoke_grpo.yaml"
    refused(cli_main(["train", str(recipe), "--output-dir", str(afile / "run")]), capsys, "is a file")
    refused(cli_main(["train", str(recipe), "--output-dir", str(evaluation), "--resume"]), capsys,
            "eval_manifest.json")
    assert not lock_path(evaluation).exists()
    refused(sweep.main(["e1", "--data", str(tmp_path), "--sft", str(run / "final"), "--output-dir", str(run)]), capsys,
            "never written over")
    refused(demo.main(["--output-dir", str(run), "--quick"]), capsys, "never written over")
    assert not (run / "data").exists() and not (run / "runs").exists()


def test_the_rule_itself(tmp_path, monkeypatch):
    assert {MANIFEST, EVAL_MANIFEST, demo.TIMINGS_FILE} <= set(MARKERS)  # the records the writers name
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for target in ("/", tmp_path / "home", tmp_path):
        with pytest.raises(OutputTargetError, match="root folder, the home folder"):
            check_output_folder(target)
    busy = tmp_path / "home" / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(TargetNotEmptyError):
        check_output_folder(busy)
    assert check_output_folder(busy, reuse=lambda folder: True) == busy
    (busy / "sweep-e1.json").write_text("{}")
    with pytest.raises(OutputTargetError, match="sweep"):
        check_output_folder(busy, reuse=lambda folder: True)
    assert check_output_folder(busy, own=("sweep-*.json",), reuse=lambda folder: True) == busy
    (tmp_path / "home" / "link").symlink_to(busy)
    with pytest.raises(OutputTargetError, match="symlink"):
        check_output_folder(tmp_path / "home" / "link")
    loop = tmp_path / "home" / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OutputTargetError, match="loop"):
        check_output_folder(loop / "out")


def test_data_prepare_into_a_locked_folder_is_refused(tmp_path, holder, capsys):
    tasks = tmp_path / "t.jsonl"
    write_jsonl_atomic(tasks, generate_tasks(8, seed=1))
    out = tmp_path / "splits"
    proc = holder(out)
    refused(data_main(["prepare", "--input", str(tasks), "--output-dir", str(out), "--sizes", "4,2,2"]), capsys,
            f"pid {proc.pid}")
    assert not out.exists() and not (tmp_path / ".staging-splits").exists()
