"""The README's main command: `minimind-trl demo` (here in its --quick size) runs the whole chain."""

import dataclasses
import json
import shutil
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
    seeds = demo.rl_seeds(42, demo.QUICK_SEEDS)
    assert seeds == [42, 43]
    runs = [f"{name}-seed{seed}" for seed in seeds for name in demo.OBJECTIVES]
    assert "| sft | 1 |" in text
    for name in demo.OBJECTIVES:  # every objective: both seeds, each seed's mean, a two-level CI
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
        assert manifest["torch_threads"] == 1  # --jobs 2: one thread each, whatever the machine has
        assert manifest["recipe"]["rollout"]["prompts_per_rollout"] == demo.SIZES["quick"].rl_prompts == 4
        rows = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
        k = demo.rl_recipe("rl_replay.yaml").updates_per_rollout
        assert k == 4 and len(rows) == k  # --quick: one rollout of the default's K = 4 updates (4 minibatches)
        updates = [json.loads(row) for row in rows]
        assert [(u["update"], u["replay_minibatch"]) for u in updates] == [(k, k) for k in range(4)]
        assert updates[0]["max_abs_log_ratio"] == 0.0 and manifest["recipe"]["training"]["minibatches"] == 4
    capsys.readouterr()
    # A rerun with --resume finds every stage done and trains nothing again.
    assert demo.main(["--quick", "--output-dir", str(out), "--resume"]) == 0
    log = capsys.readouterr().out
    assert f"pretrain: completed earlier ({out / 'runs' / 'pretrain'})" in log and "$ minimind-trl train" not in log
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


def test_ablation_trains_the_two_cells_and_asks_for_the_interaction(tmp_path, monkeypatch):
    """The demo is one plan of the sweep's planner and driver: pretraining and SFT are its stages (on
    two threads, the projection after them), and with --ablation the RL conditions hold the 2x2's two
    extra cells for every seed and ask the driver for the interaction; RL runs and evaluations go to
    --jobs CPU slots of one thread each."""
    driven = []

    def fake_drive(plan, settings, run, slots=None, after_job=None, n_resamples=None, interaction=None,
                   stage_slot=None, after_stages=None):
        driven.append((plan, settings, slots, interaction, stage_slot))
        return False, {"summary": str(Path(plan.summary_dir) / "summary.md")}

    monkeypatch.setattr(demo, "stage_data", lambda out, size, seed, resume: None)
    monkeypatch.setattr(demo, "stage_tokenizer", lambda out, resume: None)
    monkeypatch.setattr(demo.sweep, "drive", fake_drive)
    out = tmp_path / "demo"
    plan = demo.make_plan(quick=True, seed=7, ablation=True)
    assert demo.run_demo(out, plan, seed=7) == out / "summary" / "summary.md"
    [(whole, settings, slots, interaction, stage_slot)] = driven
    assert slots == ["cpu:0:1", "cpu:1:1"] and stage_slot == "cpu:0:2"
    pretrain, sft, *rl = whole.conditions
    assert [(c.label, c.seed, c.after) for c in (pretrain, sft)] == [("pretrain", None, ""), ("sft", None, "pretrain")]
    assert "seed=7" in pretrain.overrides and f"model.path={out / 'runs' / 'pretrain' / 'final'}" in sft.overrides
    arms = ("grpo", "cispo", "dr_grpo", "gspo", "zscore_fixedL", "center_seqmean")
    assert [c.label for c in rl] == [f"{c}-seed{s}" for s in (7, 8) for c in arms]
    assert {c.action for c in whole.conditions} == {"train"} and {c.after for c in rl} == {"sft"}
    assert {Path(c.recipe).name for c in rl} == {"rl_replay.yaml"}  # the cells replay as the arms do
    by_label = {c.label: c for c in rl}
    assert {"objective.preset=dr_grpo", "objective.advantage=zscore"} <= set(by_label["zscore_fixedL-seed8"].overrides)
    assert {"objective.preset=grpo", "objective.advantage=center"} <= set(by_label["center_seqmean-seed7"].overrides)
    assert not any(o.startswith("objective.advantage") for o in by_label["grpo-seed7"].overrides)
    assert by_label["grpo-seed7"].run_dir == str(out / "runs" / "grpo-seed7")
    assert by_label["grpo-seed7"].eval_dir == str(out / "eval" / "grpo-seed7")
    assert (whole.sft, whole.data, whole.baseline_after) == (
        str(out / "runs" / "sft" / "final"), str(out / "data" / "splits"), "sft")
    assert (whole.baseline_eval, whole.summary_dir, whole.plots_dir) == (
        str(out / "eval" / "sft"), str(out / "summary"), str(out / "plots"))
    cells = dict(item.split("=") for item in interaction.split(","))
    assert cells == {"zscore_seqmean": "grpo", "zscore_fixedL": "zscore_fixedL", "center_seqmean": "center_seqmean",
                     "center_fixedL": "dr_grpo"}
    assert settings["split"] == "test" and settings["max_new_tokens"] == 96 and settings["limit"] is None
    timings = json.loads((out / demo.TIMINGS_FILE).read_text())
    assert timings["plan"]["seeds"] == [7, 8] and timings["plan"]["arms"] == list(arms)
    # a resume that asks for another plan is refused
    with pytest.raises(demo.DemoError, match="mix two plans"):
        demo.run_demo(out, demo.make_plan(quick=True, seed=7), seed=7, resume=True)


def test_the_default_plan_reads_nothing_of_the_machine(monkeypatch):
    """Issue 38: every machine that types `minimind-trl demo` runs the same arms, seeds, rollouts and
    questions: the plan never reads timings, cores, threads or load."""
    reference = demo.make_plan().describe()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(demo.sweep, "usable_cores", lambda: 64)
    monkeypatch.setattr(demo.Timings, "seconds", lambda self, stage: pytest.fail("the plan read a timing"))
    assert demo.make_plan().describe() == reference
    plan = demo.make_plan()
    assert [a.name for a in plan.arms] == list(demo.OBJECTIVES) and plan.seeds == [42, 43, 44]
    assert {a.recipe for a in plan.arms} == {"rl_replay.yaml"} and demo.rl_recipe("rl_replay.yaml").minibatches == 4
    assert plan.size.test_size == 600 and plan.jobs == 2
    k1 = demo.make_plan(experiment="k1_two_algorithms")
    assert [(a.name, a.recipe) for a in k1.arms] == [("grpo", "rl.yaml"), ("dr_grpo", "rl.yaml")]
    assert sum(k1.reference_seconds().values()) <= 60 * 60  # issue 38: the K = 1 experiment fits an hour
    passes = demo.make_plan(experiment="replay_passes")
    assert [(a.name, a.recipe) for a in passes.arms] == [("grpo", "rl_replay_passes.yaml"),
                                                         ("dr_grpo", "rl_replay_passes.yaml")]
    recipe = demo.rl_recipe("rl_replay_passes.yaml")  # the E form: 4 passes of the whole 24 x 4 rollout
    assert (recipe.passes, recipe.minibatches, recipe.rollouts, recipe.prompts) == (4, 1, 60, 24)
    assert recipe.learning_rate == demo.rl_recipe("rl_replay.yaml").learning_rate
    assert "K = 4 (4 passes x 1 minibatch)" in passes.describe()
    assert passes.reference_seconds()["rl"] == 3 * demo.RL_RUN_SECONDS["rl_replay_passes.yaml"]  # 6 runs, 2 slots


def test_reference_time_schedules_runs_on_the_job_slots():
    """12 replay runs two at a time take 6 run times; mixed recipes fill the first free slot."""
    plan = demo.make_plan()
    assert plan.reference_seconds()["rl"] == 6 * demo.RL_RUN_SECONDS["rl_replay.yaml"]
    assert demo.slots_makespan([3.0, 1.0, 1.0, 1.0], 2) == 3.0
    assert demo.slots_makespan([1.0, 1.0, 1.0], 1) == 3.0
    with pytest.raises(demo.DemoError, match="not one of"):
        demo.make_plan(experiment="nope")


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--dry-run", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == demo.make_plan().describe()
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert "time on the reference machine (2 idle cores)" in printed and "K = 4 (1 pass x 4 minibatches)" in printed


def test_the_readme_shows_the_plan_dry_run_prints():
    """The README's plan block is what `minimind-trl demo --dry-run` prints (issue 38 acceptance)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- demo-plan -->", 2)
    assert len(block) == 3, "README.md lacks the <!-- demo-plan --> block"
    shown = block[1].strip().removeprefix("```text").removesuffix("```").strip()
    assert shown == demo.make_plan().describe()


def test_the_full_demo_sets_only_start_data_tokenizer_objective_and_seed(tmp_path):
    """The demo's RL training settings live in its recipes alone: a full-size run's train command
    resolves to the same recipe (and hash) as the recipe with only model.path, data.path,
    tokenizer.path, objective.preset and seed set; --quick's shorter runs add max_steps = rollouts x K
    and the matching batch size."""
    recipe_file = demo.RECIPE_DIR / "rl.yaml"
    recipe = load_recipe(recipe_file)
    shape = demo.rl_recipe()
    assert shape.rollouts * shape.updates_per_rollout == recipe["training"]["max_steps"]
    assert shape.updates_per_rollout == recipe["training"]["num_iterations"]
    out = tmp_path / "demo"
    sft, splits, tok = out / "runs" / "sft" / "final", out / "data" / "splits", out / "tokenizer"
    arm = demo.Arm("dr_grpo", ("objective.preset=dr_grpo",))
    plan = demo.sweep_plan(out, demo.Plan(demo.K1, demo.SIZES["full"], (arm,), [43], jobs=2))
    [cond] = [c for c in plan.conditions if c.seed is not None]
    assert cond.overrides == ["objective.preset=dr_grpo"]
    five = [f"model.path={sft}", f"data.path={splits}", f"tokenizer.path={tok}", "objective.preset=dr_grpo", "seed=43"]
    assert cond.recipe_sha256 == recipe_sha256(load_recipe(recipe_file, five))
    assert load_recipe(recipe_file, sweep.condition_overrides(plan, cond)) == load_recipe(recipe_file, five)
    shorter = demo.rl_condition_overrides(demo.Arm("grpo", ("objective.preset=grpo",)), shape.rollouts - 1, prompts=4)
    assert f"training.max_steps={(shape.rollouts - 1) * shape.updates_per_rollout}" in shorter
    assert f"training.per_device_train_batch_size={4 * shape.group_size}" in shorter
    resolved = load_recipe(recipe_file, shorter)  # the overrides resolve as a recipe
    assert resolved["rollout"]["prompts_per_rollout"] == 4


def _one_arm_plan(rollouts: int | None = None) -> demo.Plan:
    """A full-size plan of one GRPO arm on rl.yaml and seed 42 (``rollouts`` per run: None, the recipe's)."""
    size = dataclasses.replace(demo.SIZES["full"], rl_rollouts=rollouts)
    return demo.Plan(demo.K1, size, (demo.Arm("grpo", ("objective.preset=grpo",)),), [42], jobs=2)


def _finished(plan: sweep.Plan, label: str) -> RunFolder:
    """Write a completed run of ``label``'s planned recipe (its hash, status and a final/ with weights)."""
    [cond] = [c for c in plan.conditions if c.label == label]
    run = RunFolder(cond.run_dir)
    resolved = load_recipe(cond.recipe, sweep.condition_overrides(plan, cond))
    run.final_dir.mkdir(parents=True)
    (run.final_dir / "config.json").write_text("{}")
    (run.final_dir / "model.safetensors").write_bytes(label.encode())
    run.manifest_path.write_text(json.dumps({"recipe_sha256": recipe_sha256(resolved), "recipe": resolved}))
    run.status_path.write_text(json.dumps({"state": "completed"}))
    return run


def _finished_demo(out: Path, rollouts: int | None = None) -> sweep.Plan:
    """A demo folder whose pretraining, SFT and one GRPO run completed; returns its plan."""
    plan = demo.sweep_plan(out, _one_arm_plan(rollouts))
    for label in ("pretrain", "sft", "grpo-seed42"):
        _finished(plan, label)
    return plan


def test_a_resumed_demo_reuses_a_finished_run_only_for_the_same_recipe(tmp_path):
    """A completed RL run of another recipe (here: a budget plan's shorter max_steps) is refused on
    --resume, naming the field, instead of being reused as if it were this call's run (the sweep's
    rule, RunFolder.reuse_action)."""
    out = tmp_path / "demo"
    _finished_demo(out, rollouts=3)
    again = demo.sweep_plan(out, _one_arm_plan(rollouts=3), resume=True)
    assert [c.action for c in again.conditions] == ["skip", "skip", "skip"]
    with pytest.raises(demo.DemoError, match=r"ran a different recipe \(differs in \['training'\]\)"):
        demo.sweep_plan(out, _one_arm_plan(), resume=True)
    with pytest.raises(demo.DemoError, match="use --resume"):
        demo.sweep_plan(out, _one_arm_plan(rollouts=3), resume=False)


def test_the_demo_refuses_a_stale_evaluation_before_any_stage_runs(tmp_path, capsys, monkeypatch):
    """The demo's whole plan goes through the sweep's planner before the data stage: an SFT start's
    evaluation of other weights, or one beside an SFT that will train, is refused with the sweep's
    one-line reason, and nothing runs."""
    monkeypatch.setattr(demo, "stage_data", lambda *args: pytest.fail("a stage ran before the plan was checked"))
    monkeypatch.setattr(demo.sweep, "drive", lambda *args, **kwargs: pytest.fail("the driver ran"))
    out = tmp_path / "demo"
    sft_eval = out / "eval" / "sft"

    def other_weights_evaluated() -> None:
        sft_eval.mkdir(parents=True)
        (sft_eval / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": "0" * 64}}))

    other_weights_evaluated()
    assert demo.main(["--quick", "--output-dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"  {sft_eval}: an evaluation of a run that is not complete; refusing to reuse it\n" in err
    assert not (out / "data").exists() and not (out / "runs").exists()
    shutil.rmtree(sft_eval)
    _finished_demo(out)  # now the SFT start completed: that evaluation is of other weights
    other_weights_evaluated()
    with pytest.raises(demo.DemoError) as refused:
        demo.sweep_plan(out, _one_arm_plan(), resume=True)
    sft = out / "runs" / "sft" / "final"
    assert str(refused.value).splitlines() == ["refusing to run:",
                                               f"  {sft_eval}: evaluated other weights than {sft} (SHA-256 differs)"]


def test_a_run_made_from_a_stage_that_trains_again_is_refused(tmp_path):
    """Dependencies are the planner's: SFT and the RL runs start from the stage before them, so a
    finished SFT or RL run is not reused when the stage it was made from will train again, and a stage
    that stopped on a non-finite value refuses what follows it (named once)."""
    out = tmp_path / "demo"
    _finished_demo(out)
    shutil.rmtree(out / "runs" / "pretrain")
    with pytest.raises(demo.DemoError) as refused:
        demo.sweep_plan(out, _one_arm_plan(), resume=True)
    assert str(refused.value).splitlines() == [
        "refusing to run:", f"  {out / 'runs' / 'sft'}: made from the final/ of pretrain, which will train again; "
        "refusing to reuse it"]
    shutil.rmtree(out / "runs")
    plan = _finished_demo(out)
    RunFolder(plan.conditions[1].run_dir).status_path.write_text(json.dumps({"state": "stopped"}))
    with pytest.raises(demo.DemoError, match=r"runs/sft stopped on a non-finite value .*grpo-seed42 starts from it"):
        demo.sweep_plan(out, _one_arm_plan(), resume=True)
