"""The README's main command: `minimind-trl demo` (here in its --quick size) runs the whole chain."""

import json
from pathlib import Path

import pytest

from minimind_trl import demo, sweep
from minimind_trl.run_folder import RunFolder
from minimind_trl.trainer.recipe import load_recipe, recipe_sha256


@pytest.mark.slow
def test_quick_demo_runs_every_stage_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--quick", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary" / "summary.json").read_text())
    text = (out / "summary" / "summary.md").read_text()
    seeds = demo.rl_seeds(42, demo.SIZES["quick"].rl_seeds)
    assert seeds == [42, 43]
    runs = [f"{name}-seed{seed}" for seed in seeds for name in demo.CONDITIONS]
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
        assert manifest["recipe"]["rollout"]["prompts_per_rollout"] == demo.SIZES["quick"].rl_prompts == 4
        rows = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == demo.rl_recipe().updates_per_rollout  # --quick: one rollout of K updates
        assert json.loads(rows[0])["max_abs_log_ratio"] == 0.0
    capsys.readouterr()
    # A rerun with --resume finds every stage done and trains nothing again.
    assert demo.main(["--quick", "--output-dir", str(out), "--resume"]) == 0
    log = capsys.readouterr().out
    assert "already trained with this recipe, skipping" in log and "$ minimind-trl train" not in log
    assert f"grpo-seed42: completed earlier ({out / 'runs' / 'grpo-seed42'})" in log  # the sweep's driver
    assert "grpo-seed42: evaluated earlier" in log and "$ minimind-trl eval" not in log
    timings = json.loads((out / demo.TIMINGS_FILE).read_text())
    assert {"pretrain", "sft", "grpo-seed42.train", "grpo-seed42.eval", "sft.eval", "summarize", "plot"} <= set(
        timings["stages"])
    assert timings["total_s"] >= round(sum(timings["stages"].values()), 1)  # kept the real total (0.1 s steps)


def test_demo_refuses_a_used_output_folder(tmp_path, capsys):
    out = tmp_path / "demo"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stray.txt").write_text("x")
    assert demo.main(["--quick", "--output-dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_fit_plan_shortens_rollouts_then_seeds_to_meet_the_budget(monkeypatch):
    monkeypatch.setitem(demo.REFERENCE_SECONDS, "rl_rollout", 8.3)  # the hand-worked figures below
    monkeypatch.setitem(demo.REFERENCE_SECONDS, "eval_question", 0.1)  # 14 s for 140 questions
    wanted = demo.RLPlan(rl_rollouts=6, rl_seeds=3, eval_questions=140)
    full = demo.projected_rest_seconds(wanted, 4, 1.0)
    # 12 runs x (13 s + 6 rollouts x 8.3 s) + 13 evals x 14 s + 17 s, at the reference speed
    assert full == pytest.approx(952.6)
    assert demo.projected_rest_seconds(wanted, 4, 2.0) == pytest.approx(2 * full)
    assert demo.fit_plan(wanted, 4, 1.0, full) == wanted  # fits: unchanged
    four = demo.projected_rest_seconds(demo.RLPlan(4, 3, 140), 4, 1.0)
    assert demo.fit_plan(wanted, 4, 1.0, four + 1) == demo.RLPlan(4, 3, 140)  # the most rollouts that fit
    # Just under 2 rollouts x 3 seeds (554.2 s): 2 seeds cost 8 x (13 + 8.3 r) + 9 x 14 + 17 = 247 + 66.4 r,
    # so r = 4 (512.6 s) is the most that fits; seeds drop only once 2 rollouts x 3 seeds is over.
    two_by_three = demo.projected_rest_seconds(demo.RLPlan(2, 3, 140), 4, 1.0)
    assert two_by_three == pytest.approx(554.2)
    assert demo.fit_plan(wanted, 4, 1.0, two_by_three) == demo.RLPlan(2, 3, 140)
    assert demo.fit_plan(wanted, 4, 1.0, two_by_three - 1) == demo.RLPlan(4, 2, 140)
    assert demo.fit_plan(wanted, 4, 1.0, 1.0) == demo.RLPlan(2, 2, 140)  # nothing fits: the smallest plan
    # Evaluations cost per question: the whole 600-question split adds 13 x 460 x 0.1 s.
    assert demo.projected_rest_seconds(demo.RLPlan(6, 3, 600), 4, 1.0) == pytest.approx(full + 13 * 46.0)


def test_ablation_trains_the_two_cells_and_asks_for_the_interaction(tmp_path, monkeypatch):
    """The RL stage is the sweep's driver on a plan the demo names: with --ablation it holds the
    2x2's two extra cells for every seed, and asks the driver for the interaction."""
    trained, driven = [], []

    def fake_train(out, name, recipe, overrides, resume):
        trained.append(name)
        return out / "runs" / name / "final"

    def fake_drive(plan, settings, run, slots=None, after_job=None, n_resamples=None, interaction=None):
        driven.append((plan, settings, interaction))
        return False, {"summary": str(Path(plan.summary_dir) / "summary.md")}

    monkeypatch.setattr(demo, "stage_data", lambda out, size, seed, resume: out / "data" / "splits")
    monkeypatch.setattr(demo, "stage_tokenizer", lambda out, resume: out / "tokenizer")
    monkeypatch.setattr(demo, "stage_train", fake_train)
    monkeypatch.setattr(demo.sweep, "drive", fake_drive)
    out = tmp_path / "demo"
    assert demo.run_demo(out, demo.SIZES["quick"], seed=7, ablation=True) == out / "summary" / "summary.md"
    assert trained == ["pretrain", "sft"]
    [(plan, settings, interaction)] = driven
    cells = ("grpo", "cispo", "dr_grpo", "gspo", "zscore_fixedL", "center_seqmean")
    assert [c.label for c in plan.conditions] == [f"{c}-seed{s}" for s in (7, 8) for c in cells]
    assert {c.action for c in plan.conditions} == {"train"}
    by_label = {c.label: c for c in plan.conditions}
    assert {"objective.preset=dr_grpo", "objective.advantage=zscore"} <= set(by_label["zscore_fixedL-seed8"].overrides)
    assert {"objective.preset=grpo", "objective.advantage=center"} <= set(by_label["center_seqmean-seed7"].overrides)
    assert not any(o.startswith("objective.advantage") for o in by_label["grpo-seed7"].overrides)
    assert by_label["grpo-seed7"].run_dir == str(out / "runs" / "grpo-seed7")
    assert by_label["grpo-seed7"].eval_dir == str(out / "eval" / "grpo-seed7")
    assert (plan.sft, plan.data) == (str(out / "runs" / "sft" / "final"), str(out / "data" / "splits"))
    assert (plan.baseline_eval, plan.summary_dir, plan.plots_dir) == (
        str(out / "eval" / "sft"), str(out / "summary"), str(out / "plots"))
    cells = dict(item.split("=") for item in interaction.split(","))
    assert cells == {"zscore_seqmean": "grpo", "zscore_fixedL": "zscore_fixedL", "center_seqmean": "center_seqmean",
                     "center_fixedL": "dr_grpo"}
    assert settings["split"] == "test" and settings["max_new_tokens"] == 96
    timings = json.loads((out / demo.TIMINGS_FILE).read_text())
    assert timings["plan"]["chosen"] == {"rl_rollouts": 1, "rl_seeds": 2, "eval_questions": 20}
    assert "speed_factor" not in timings["plan"] and settings["limit"] is None  # --quick: the whole 20-question split


def test_budget_plan_is_projected_from_pretrain_and_sft_and_kept_on_resume(tmp_path, capsys):
    timings = demo.Timings(tmp_path)
    timings.record("pretrain", 2 * demo.REFERENCE_SECONDS["pretrain"])  # a machine half as fast
    timings.record("sft", 2 * demo.REFERENCE_SECONDS["sft"])
    elapsed = 2 * (demo.REFERENCE_SECONDS["pretrain"] + demo.REFERENCE_SECONDS["sft"])
    plan = demo._plan_rl(timings, demo.SIZES["full"], None, 4, 30.0, elapsed, full_size=True)
    wanted = demo.RLPlan(demo.rl_recipe().rollouts, 3, demo.SIZES["full"].budget_eval_questions)
    assert plan == demo.fit_plan(wanted, 4, 2.0, 30 * 60 - elapsed)
    assert plan != wanted and plan.eval_questions == 150  # a budget plan reads the first 150 test questions
    saved = json.loads((tmp_path / demo.TIMINGS_FILE).read_text())["plan"]
    assert saved["speed_factor"] == 2.0 and saved["budget_min"] == 30.0
    assert "--budget 30 min" in capsys.readouterr().out
    again = demo._plan_rl(demo.Timings(tmp_path), demo.SIZES["full"], None, 4, 30.0, 0.0, full_size=True)
    assert again == plan  # --resume keeps the plan the run started with
    # ... and refuses to mix it with another: --full-rl (no budget), another budget, more seeds
    for seeds, budget in ((None, None), (None, 45.0), (4, 30.0)):
        with pytest.raises(demo.DemoError, match="would mix two plans"):
            demo._plan_rl(demo.Timings(tmp_path), demo.SIZES["full"], seeds, 4, budget, 0.0, full_size=True)


def test_the_default_demo_keeps_three_seeds_on_the_reference_machine_and_full_rl_reads_every_question(tmp_path):
    """Issue 29 item 7: at the reference machine's speed the 30-minute demo keeps 3 RL seeds per
    objective (fewer rollouts, 150 test questions); --full-rl runs the recipe whole on all 600."""
    ref = demo.REFERENCE_SECONDS
    timings = demo.Timings(tmp_path / "budget")
    timings.record("pretrain", ref["pretrain"])
    timings.record("sft", ref["sft"])
    plan = demo._plan_rl(timings, demo.SIZES["full"], None, 4, demo.DEFAULT_BUDGET_MIN, ref["pretrain"] + ref["sft"],
                         full_size=True)
    assert plan.rl_seeds == 3 and plan.eval_questions == 150 and 2 <= plan.rl_rollouts < demo.rl_recipe().rollouts
    assert demo.eval_settings(demo.SIZES["full"], plan.eval_questions)["limit"] == 150
    full = demo._plan_rl(demo.Timings(tmp_path / "full"), demo.SIZES["full"], None, 4, None, 0.0, full_size=True)
    assert full == demo.RLPlan(demo.rl_recipe().rollouts, 3, 600)
    assert demo.eval_settings(demo.SIZES["full"], full.eval_questions)["limit"] is None


def test_a_resumed_budget_counts_the_stages_already_done(tmp_path):
    """Resumed after SFT with --budget and no plan yet: the budget left is 30 min minus the recorded
    pretrain + SFT seconds, not minus this process's (near zero) wall time."""
    timings = demo.Timings(tmp_path)
    timings.record("pretrain", 1.5 * demo.REFERENCE_SECONDS["pretrain"])
    timings.record("sft", 1.5 * demo.REFERENCE_SECONDS["sft"])
    recorded = 1.5 * (demo.REFERENCE_SECONDS["pretrain"] + demo.REFERENCE_SECONDS["sft"])
    plan = demo._plan_rl(timings, demo.SIZES["full"], None, 4, 30.0, 5.0, full_size=True)
    wanted = demo.RLPlan(demo.rl_recipe().rollouts, 3, 150)
    assert plan == demo.fit_plan(wanted, 4, 1.5, 30 * 60 - recorded)
    assert plan != demo.fit_plan(wanted, 4, 1.5, 30 * 60 - 5.0)


def test_the_full_demo_sets_only_start_data_tokenizer_objective_and_seed(tmp_path):
    """The demo's RL training settings live in recipes/demo/rl.yaml alone: a full-size run's train
    command resolves to the same recipe (and hash) as the recipe with only model.path, data.path,
    tokenizer.path, objective.preset and seed set; fewer rollouts (--budget) add max_steps =
    rollouts x K, and --quick's prompts per rollout the matching batch size."""
    recipe_file = demo.RECIPE_DIR / "rl.yaml"
    recipe = load_recipe(recipe_file)
    shape = demo.rl_recipe()
    assert shape.rollouts * shape.updates_per_rollout == recipe["training"]["max_steps"]
    assert shape.updates_per_rollout == recipe["training"]["num_iterations"]
    sft, splits, tok = tmp_path / "sft", tmp_path / "splits", tmp_path / "tok"
    plan = demo.rl_plan(tmp_path / "demo", sft, splits, tok, {"dr_grpo": ("objective.preset=dr_grpo",)}, [43],
                        shape.rollouts)
    [cond] = plan.conditions
    assert cond.overrides == ["objective.preset=dr_grpo"]
    five = [f"model.path={sft}", f"data.path={splits}", f"tokenizer.path={tok}", "objective.preset=dr_grpo", "seed=43"]
    assert cond.recipe_sha256 == recipe_sha256(load_recipe(recipe_file, five))
    assert load_recipe(recipe_file, sweep.condition_overrides(plan, cond)) == load_recipe(recipe_file, five)
    shorter = demo.rl_condition_overrides(("objective.preset=grpo",), shape.rollouts - 1, prompts=4)
    assert f"training.max_steps={(shape.rollouts - 1) * shape.updates_per_rollout}" in shorter
    assert f"training.per_device_train_batch_size={4 * shape.group_size}" in shorter
    resolved = load_recipe(recipe_file, shorter)  # the overrides resolve as a recipe
    assert resolved["rollout"]["prompts_per_rollout"] == 4


def test_the_full_demo_fits_its_default_budget_unless_full_rl_is_asked(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, size, seed, resume, seeds, ablation, budget: seen.append(budget)
                        or (tmp_path / "summary.md"))
    (tmp_path / "summary.md").write_text("table")
    for argv in ([], ["--budget", "45"], ["--full-rl"], ["--quick"]):
        assert demo.main(["--output-dir", str(tmp_path / "d"), *argv]) == 0
    assert seen == [demo.DEFAULT_BUDGET_MIN, 45.0, None, None]
    with pytest.raises(SystemExit):
        demo.main(["--output-dir", str(tmp_path / "d"), "--budget", "20", "--full-rl"])


def test_a_resumed_demo_reuses_a_finished_run_only_for_the_same_recipe(tmp_path):
    """A completed RL run of another recipe (here: a budget plan's shorter max_steps) is refused on
    --resume, naming the field, instead of being reused as if it were this call's run (the sweep's
    rule, RunFolder.reuse_action)."""
    out, sft, splits, tok = tmp_path / "demo", tmp_path / "sft", tmp_path / "splits", tmp_path / "tok"
    table = {"grpo": ("objective.preset=grpo",)}
    shorter = demo.rl_plan(out, sft, splits, tok, table, [42], rollouts=3)
    [cond] = shorter.conditions
    run = RunFolder(cond.run_dir)
    resolved = load_recipe(cond.recipe, sweep.condition_overrides(shorter, cond))
    run.final_dir.mkdir(parents=True)
    (run.final_dir / "config.json").write_text("{}")
    run.manifest_path.write_text(json.dumps({"recipe_sha256": recipe_sha256(resolved), "recipe": resolved}))
    run.status_path.write_text(json.dumps({"state": "completed"}))
    again = demo.rl_plan(out, sft, splits, tok, table, [42], rollouts=3, resume=True)
    assert [c.action for c in again.conditions] == ["skip"]
    with pytest.raises(demo.DemoError, match=r"ran a different recipe \(differs in \['training'\]\)"):
        demo.rl_plan(out, sft, splits, tok, table, [42], resume=True)
    with pytest.raises(demo.DemoError, match="use --resume"):
        demo.rl_plan(out, sft, splits, tok, table, [42], rollouts=3, resume=False)
