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
    """Records the calls push makes; ``fail`` is raised by create_commit, which keeps the committed
    files' bytes (path in the repository -> bytes) in ``committed``."""

    calls: list = []
    fail: Exception | None = None
    committed: dict[str, bytes] = {}

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, kwargs))

    def create_commit(self, repo_id, operations, **kwargs):
        FakeApi.calls.append(("create_commit", repo_id, kwargs))
        if FakeApi.fail is not None:
            raise FakeApi.fail
        for op in operations:
            source = op.path_or_fileobj
            FakeApi.committed[op.path_in_repo] = source if isinstance(source, bytes) else Path(source).read_bytes()
        return type("Commit", (), {"commit_url": f"https://hub/{repo_id}/commit/1"})()


@pytest.fixture
def api(monkeypatch):
    FakeApi.calls, FakeApi.fail, FakeApi.committed = [], None, {}
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
    (create, repo, options), (commit, repo_again, kwargs) = api.calls
    assert (create, repo, options["private"], options["exist_ok"]) == ("create_repo", "someone/minimind-grpo", True,
                                                                       True)
    assert (commit, repo_again, kwargs["commit_message"]) == ("create_commit", "someone/minimind-grpo", "Upload final")
    final = run_folder / "final"
    assert api.committed == {p.name: p.read_bytes() for p in final.iterdir() if not p.name.startswith(".")}
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
    before = (run_folder / "final" / "README.md").read_text()
    argv = [str(run_folder), "someone/minimind-grpo", "--eval", str(evaluation), "--base-model", "someone/sft"]
    assert push.main(argv) == 0
    card = api.committed["README.md"].decode()
    assert "base_model: someone/sft" in card and "| task_success | 0.74 |" in card and "| split | test |" in card
    assert 'from_pretrained("someone/minimind-grpo", trust_remote_code=True)' in card
    assert "model.safetensors" in api.committed and (run_folder / "final" / "README.md").read_text() == before
    assert push.main([*argv, "--dry-run"]) == 0 and "| task_success | 0.74 |" in capsys.readouterr().out
    (evaluation / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": "0" * 64}}))
    assert push.main(argv) == 2
    assert "evaluated other weights" in capsys.readouterr().err


# ---------------------------------------------- issue 40.7: the dry-run list is exactly what is uploaded


def _listed(out: str) -> set[str]:
    """The files a dry run says it would upload (the indented lines after "would upload")."""
    listed = []
    for line in out.split("would upload", 1)[1].splitlines()[1:]:
        if not line.startswith("  "):
            break
        listed.append(line.strip())
    return set(listed)


def test_dry_run_lists_exactly_what_is_uploaded_and_names_dot_files(api, run_folder, capsys):
    final = run_folder / "final"
    (final / ".env").write_text("HF_TOKEN=secret")
    (final / ".git").mkdir()
    (final / ".git" / "config").write_text("[core]")
    (final / "extra").mkdir()
    (final / "extra" / "notes.md").write_text("notes")
    (final / "card-link.md").symlink_to(final / "README.md")  # a link inside the folder is its file
    assert push.main([str(run_folder), "someone/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    listed = _listed(out)
    assert ".env" not in listed and not any(name.startswith(".") for name in listed)
    assert "extra/notes.md" in listed and "card-link.md" in listed and "config.json" in listed
    assert ".env" in out and ".git/" in out and "not uploaded" in out  # named, not silently dropped
    assert push.main([str(run_folder), "someone/x"]) == 0
    assert set(api.committed) == listed
    assert b"secret" not in b"".join(api.committed.values())


def test_a_symlink_leaving_the_folder_is_refused(api, run_folder, tmp_path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("private key")
    (run_folder / "final" / "weights-extra.bin").symlink_to(secret)
    for extra in (["--dry-run"], []):
        assert push.main([str(run_folder), "someone/x", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "weights-extra.bin" in err and "outside" in err
    assert api.committed == {} and [c[0] for c in api.calls] == []
