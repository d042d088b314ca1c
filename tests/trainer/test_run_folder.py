"""RunFolder / EvalFolder: layout names, states, tool set-up and recovery of killed commits."""

from __future__ import annotations

import json

import pytest

from minimind_trl.eval.folder import EVAL_MANIFEST, EvalFolder
from minimind_trl.fsio import DataFormatError, aside_path, staging_path
from minimind_trl.run_folder import (
    FINAL_MODEL,
    MANIFEST,
    START_LEFTOVERS,
    STATUS,
    RunFolder,
    RunFolderConflict,
    ToolSetup,
)


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_states(tmp_path):
    run = RunFolder(tmp_path / "run")
    assert run.state() == "new"
    run.path.mkdir()
    assert run.state() == "new"
    for name in START_LEFTOVERS:
        (run.path / name).mkdir()
    assert run.state() == "pre_manifest"
    (run.path / "other.txt").write_text("x")
    assert run.state() == "foreign"
    (run.path / "other.txt").unlink()
    _write(run.manifest_path, {"recipe_sha256": "abc"})
    assert run.state() == "interrupted" and run.recipe_sha256() == "abc"
    _write(run.status_path, {"state": "stopped"})
    assert run.state() == "stopped"
    _write(run.status_path, {"state": "completed"})
    assert run.state() == "interrupted"  # completed needs final/config.json
    _write(run.final_dir / "config.json", {})
    assert run.state() == "completed" and run.final_model() == run.final_dir
    run.status_path.write_text("{")  # unreadable status: not completed
    assert run.status() is None and run.state() == "interrupted"
    assert (run.path / STATUS) == run.status_path and (run.path / MANIFEST) == run.manifest_path
    file = tmp_path / "file"
    file.write_text("x")
    assert RunFolder(file).state() == "foreign"


def test_reuse_action_is_one_rule_keyed_by_the_recipe_hash(tmp_path):
    """Sweep and demo reuse a folder only for the same resolved recipe: completed -> skip,
    interrupted -> resume, stopped -> stopped; another recipe or a foreign folder is a conflict that
    names the fields that differ."""
    recipe = {"kind": "grpo", "seed": 42, "training": {"max_steps": 60}}
    run = RunFolder(tmp_path / "run")
    assert run.reuse_action(recipe, "h60") == "train"
    for name in START_LEFTOVERS:
        (run.path / name).mkdir(parents=True)
    assert run.reuse_action(recipe, "h60") == "train"
    _write(run.manifest_path, {"recipe_sha256": "h60", "recipe": recipe})
    assert run.reuse_action(recipe, "h60") == "resume"
    _write(run.status_path, {"state": "stopped"})
    assert run.reuse_action(recipe, "h60") == "stopped"
    _write(run.status_path, {"state": "completed"})
    _write(run.final_dir / "config.json", {})
    assert run.reuse_action(recipe, "h60") == "skip"
    shorter = {**recipe, "training": {"max_steps": 12}}
    with pytest.raises(RunFolderConflict, match=r"ran a different recipe \(differs in \['training'\]\)"):
        run.reuse_action(shorter, "h12")
    run.manifest_path.write_text("{not json")
    with pytest.raises(RunFolderConflict, match="unreadable"):
        run.reuse_action(recipe, "h60")
    stray = RunFolder(tmp_path / "stray")
    _write(stray.path / "notes.txt", "x")
    with pytest.raises(RunFolderConflict, match="not a run folder"):
        stray.reuse_action(recipe, "h60")


def test_checkpoints_and_of_checkpoint(tmp_path):
    run = RunFolder(tmp_path)
    for step in (10, 2):
        (run.path / f"checkpoint-{step}").mkdir()
    (tmp_path / ".staging-checkpoint-12").mkdir()
    (tmp_path / ".old-checkpoint-3").mkdir()
    assert [p.name for p in run.checkpoints()] == ["checkpoint-2", "checkpoint-10"]
    assert RunFolder.of_checkpoint(tmp_path / "final") is None  # no manifest
    _write(run.manifest_path, {})
    assert RunFolder.of_checkpoint(tmp_path / "final") == run
    assert RunFolder.of_checkpoint(tmp_path / "checkpoint-2") == run
    assert RunFolder.of_checkpoint(tmp_path / "some_export") is None


def test_tool_setup_from_the_manifest(tmp_path):
    run = RunFolder(tmp_path)
    assert run.tool_setup() is None
    _write(run.manifest_path, {"recipe": {"kind": "sft"}})
    assert run.tool_setup() is None
    _write(run.manifest_path, {"recipe": {"kind": "grpo", "rollout": {"tools": ["p.py"], "tool_names": ["a"]}}})
    assert run.tool_setup() == ToolSetup(("p.py",), ("a",))
    _write(run.manifest_path, {"recipe": {"kind": "grpo", "rollout": {}}})
    assert run.tool_setup() == ToolSetup((), None)
    run.manifest_path.write_text("[1")
    with pytest.raises(DataFormatError, match="manifest.json"):
        run.tool_setup()


@pytest.mark.parametrize("aside", [".old-final", "final.old", ".final.old-x1y2/final"])
def test_recover_moves_a_lone_aside_final_back(tmp_path, aside):
    """The current aside name and the two older layouts' ones."""
    run = RunFolder(tmp_path)
    _write(tmp_path / aside / "config.json", {"old": True})
    assert run.final_model() == run.final_dir
    assert json.loads((run.final_dir / "config.json").read_text()) == {"old": True}
    assert not (tmp_path / aside).exists()


def test_recover_drops_an_aside_whose_replacement_is_in(tmp_path):
    run = RunFolder(tmp_path)
    _write(run.final_dir / "config.json", {"new": True})
    _write(aside_path(run.final_dir) / "config.json", {"old": True})
    _write(aside_path(run.path / "checkpoint-4") / "x", {})
    run.recover()
    assert json.loads((run.final_dir / "config.json").read_text()) == {"new": True}
    assert not aside_path(run.final_dir).exists()
    assert (run.path / "checkpoint-4").is_dir() and not aside_path(run.path / "checkpoint-4").exists()
    assert staging_path(run.final_dir).name == f".staging-{FINAL_MODEL}"


def test_eval_folder(tmp_path):
    folder = EvalFolder(tmp_path / "eval")
    assert folder.is_empty() and not folder.is_complete() and folder.manifest() is None
    folder.path.mkdir()
    assert folder.is_empty()
    (folder.path / EVAL_MANIFEST).write_text("{")
    assert not folder.is_empty() and folder.is_complete() and folder.manifest() is None
    _write(folder.manifest_path, {"checkpoint": {"sha256": "abc"}})
    assert folder.checkpoint_sha256() == "abc"
    assert folder.records_path.name == "records.jsonl" and folder.metrics_path.name == "metrics.json"
