"""The README's main command: `minimind-trl demo` (here in its --quick size) runs the whole chain."""

import json

import pytest

from minimind_trl import demo


@pytest.mark.slow
def test_quick_demo_runs_every_stage_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--quick", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary" / "summary.json").read_text())
    text = (out / "summary" / "summary.md").read_text()
    seeds = demo.rl_seeds(42, demo.SIZES["quick"].rl_seeds)
    assert seeds == [42, 43]
    runs = [demo.run_name(name, seed) for seed in seeds for name in demo.CONDITIONS]
    assert "| sft | 1 |" in text
    for name in demo.CONDITIONS:  # every objective: both seeds, each seed's mean, a two-level CI
        row = summary["metrics"]["task_success"][name]
        assert row["n_seeds"] == 2 and len(row["diff_ci_two_level"]) == 2
        assert f"| {name} | 2 |" in text
    for name in ("sft", *runs):
        records = (out / "eval" / name / "records.jsonl").read_text().splitlines()
        assert len(records) == demo.SIZES["quick"].test_size
    for name in ("pretrain", "sft", *runs):
        assert json.loads((out / "runs" / name / "status.json").read_text())["state"] == "completed"
    # Pretraining texts = one solution per training task + the copy drills; all tasks easy-tier.
    train_tasks = [json.loads(line) for line in (out / "data" / "splits" / "train.jsonl").read_text().splitlines()]
    pretrain = json.loads((out / "data" / "pretrain" / "manifest.json").read_text())
    assert pretrain["outputs"]["train.jsonl"]["rows"] == len(train_tasks) + demo.SIZES["quick"].drill_rows
    assert {task["meta"]["difficulty"] for task in train_tasks} == {"easy"}
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in (out / "plots").iterdir())
    # Every RL condition started from the same SFT weights and trained the same number of steps.
    for name in runs:
        manifest = json.loads((out / "runs" / name / "manifest.json").read_text())
        assert manifest["recipe"]["model"]["path"] == str(out / "runs" / "sft" / "final")
        assert manifest["recipe"]["seed"] == int(name.rsplit("seed", 1)[1])  # the run's RL seed
        assert manifest["training_args"]["prefix_sharing"] is True
        rows = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 4 and json.loads(rows[0])["max_abs_log_ratio"] == 0.0
    capsys.readouterr()
    # A rerun with --resume finds every stage done and trains nothing again.
    assert demo.main(["--quick", "--output-dir", str(out), "--resume"]) == 0
    log = capsys.readouterr().out
    assert "already trained, skipping" in log and "$ minimind-trl train" not in log


def test_demo_refuses_a_used_output_folder(tmp_path, capsys):
    out = tmp_path / "demo"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stray.txt").write_text("x")
    assert demo.main(["--quick", "--output-dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
