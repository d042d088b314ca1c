"""`minimind-trl push`: what is uploaded, from where, and one-line errors (no network: HfApi faked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub.errors import OfflineModeIsEnabled

from minimind_trl import push
from minimind_trl.modeling import save_for_hub
from minimind_trl.modeling.checkpoints import resolve_checkpoint


class FakeApi:
    """Records the calls push makes; ``fail`` is raised by upload_folder."""

    calls: list = []
    fail: Exception | None = None

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        FakeApi.calls.append(("upload_folder", kwargs))
        if FakeApi.fail is not None:
            raise FakeApi.fail
        return type("Commit", (), {"commit_url": f"https://hub/{kwargs['repo_id']}/commit/1"})()


@pytest.fixture
def api(monkeypatch):
    FakeApi.calls, FakeApi.fail = [], None
    monkeypatch.setattr(push, "HfApi", FakeApi)
    return FakeApi


@pytest.fixture
def run_folder(tmp_path, make_tiny_model, tokenizer):
    run = tmp_path / "runs" / "grpo-seed42"
    save_for_hub(make_tiny_model(), tokenizer, run / "final")
    (run / "README.md").write_text("---\ntags:\n- generated_from_trainer\n---\n")  # TRL's draft card
    (run / "checkpoint-2").mkdir()
    (run / "final" / ".staging-x.tmp").write_text("left over")
    (run / "manifest.json").write_text(json.dumps({"kind": "grpo"}))
    return run


def test_a_run_folder_pushes_its_final_model_with_its_card(api, run_folder, capsys):
    assert push.main([str(run_folder), "someone/minimind-grpo", "--private"]) == 0
    (create, repo, options), (upload, kwargs) = api.calls
    assert (create, repo, options["private"], options["exist_ok"]) == ("create_repo", "someone/minimind-grpo", True,
                                                                       True)
    assert upload == "upload_folder" and kwargs["folder_path"] == str(run_folder / "final")
    assert kwargs["ignore_patterns"] == push.IGNORED and kwargs["commit_message"] == "Upload final"
    assert "https://hub/someone/minimind-grpo/commit/1" in capsys.readouterr().out


def test_dry_run_lists_the_files_and_uploads_nothing(api, run_folder, capsys):
    assert push.main([str(run_folder / "final"), "someone/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert api.calls == []
    for name in ("README.md", "config.json", "model.safetensors", "tokenizer.json"):
        assert f"  {name}\n" in out
    assert ".staging" not in out and "checkpoint" not in out


def test_bad_folders_and_hub_failures_are_one_line_errors(api, run_folder, tmp_path, capsys):
    assert push.main([str(tmp_path / "nothing"), "someone/x"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    (run_folder / "final" / "README.md").unlink()
    assert push.main([str(run_folder), "someone/x"]) == 2
    assert "no README.md model card" in capsys.readouterr().err
    save_for_hub_card = run_folder / "final" / "README.md"
    save_for_hub_card.write_text("card")
    api.fail = OfflineModeIsEnabled("offline")
    assert push.main([str(run_folder), "someone/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE" in err
    api.fail = OSError("no route to host\nsecond line")
    assert push.main([str(run_folder), "someone/x"]) == 2
    assert capsys.readouterr().err == "minimind-trl push: someone/x: no route to host\n"


def test_eval_metrics_and_base_model_go_into_a_fresh_card_of_the_upload(api, run_folder, tmp_path, capsys):
    evaluation = tmp_path / "eval" / "grpo-seed42"
    evaluation.mkdir(parents=True)
    sha = resolve_checkpoint(run_folder / "final").sha256
    (evaluation / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": sha},
                                                               "split": {"name": "test"}}))
    (evaluation / "metrics.json").write_text(json.dumps({"task_success": 0.74, "count": 150, "by_n_gt": {}}))
    uploaded = {}

    def upload_folder(self, **kwargs):
        uploaded["card"] = (Path(kwargs["folder_path"]) / "README.md").read_text()
        uploaded["files"] = sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())
        return None

    api.upload_folder = upload_folder
    before = (run_folder / "final" / "README.md").read_text()
    argv = [str(run_folder), "someone/minimind-grpo", "--eval", str(evaluation), "--base-model", "someone/sft"]
    assert push.main(argv) == 0
    card = uploaded["card"]
    assert "base_model: someone/sft" in card and "| task_success | 0.74 |" in card and "| split | test |" in card
    assert 'from_pretrained("someone/minimind-grpo", trust_remote_code=True)' in card
    assert "model.safetensors" in uploaded["files"] and (run_folder / "final" / "README.md").read_text() == before
    assert push.main([*argv, "--dry-run"]) == 0 and "| task_success | 0.74 |" in capsys.readouterr().out
    (evaluation / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": "0" * 64}}))
    assert push.main(argv) == 2
    assert "evaluated other weights" in capsys.readouterr().err
