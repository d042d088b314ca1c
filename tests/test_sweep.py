"""``minimind-trl sweep`` on a tiny protocol: it completes, skips a completed condition on rerun,
resumes an interrupted one, and refuses to touch what it did not make.

The commands run in-process (``main(argv, runner=...)``) to keep the test fast; the subprocess
runner itself is checked separately, and tests/test_smoke_e2e.py drives the real CLI end to end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_tokenizer, tiny_tokenizer_path

from minimind_trl import sweep
from minimind_trl.cli import main as cli_main
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.fsio import write_json_atomic, write_jsonl_atomic
from minimind_trl.modeling import MiniMindForCausalLM, get_preset, save_for_hub
from minimind_trl.trainer.recipe import load_recipe
from minimind_trl.trainer.recorder import read_metrics
from minimind_trl.trainer.run import read_status

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
EVAL = ["--eval-limit", "3", "--eval-max-new-tokens", "8", "--eval-max-tool-turns", "1", "--eval-device", "cpu",
        "--n-resamples", "200"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; two threads on a busy 2-core host are ~100x slower per matmul
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A split folder, a tiny "SFT" checkpoint and a two-condition protocol folder (2 steps each)."""
    root = tmp_path_factory.mktemp("sweep")
    write_jsonl_atomic(root / "tasks.jsonl", generate_tasks(24, seed=11))
    prepare_splits([root / "tasks.jsonl"], root / "splits", seed=42, sizes=[16, 4, 4])
    torch.manual_seed(0)
    sft = save_for_hub(MiniMindForCausalLM(get_preset("tiny")), tiny_tokenizer(), root / "sft")
    protocol = root / "tiny_protocol"
    protocol.mkdir()
    raw = yaml.safe_load((RECIPES / "smoke_grpo.yaml").read_text(encoding="utf-8"))
    raw["tokenizer"]["path"] = tiny_tokenizer_path()
    raw["rollout"].update(max_completion_length=8, max_tool_turns=1)
    raw["training"].update(max_steps=2, num_iterations=1, save_steps=1)
    for objective in ("grpo", "cispo"):
        raw["objective"]["preset"] = objective
        (protocol / f"{objective}.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    return root, protocol, sft


class Recorder:
    """In-process runner that remembers every command."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], log: Path) -> int:
        self.calls.append(list(args))
        return cli_main(args)

    def trained(self) -> list[tuple[str, bool]]:
        return [(Path(c[c.index("--output-dir") + 1]).name, "--resume" in c) for c in self.calls if c[0] == "train"]


def _argv(setup, out: Path, *extra: str) -> list[str]:
    root, protocol, sft = setup
    return [str(protocol), "--data", str(root / "splits"), "--sft", str(sft), "--output-dir", str(out), *EVAL, *extra]


def test_sweep_completes_skips_and_resumes(setup, tmp_path):
    out = tmp_path / "out"
    runner = Recorder()
    assert sweep.main(_argv(setup, out), runner=runner) == 0
    assert runner.trained() == [("cispo-seed42", False), ("grpo-seed42", False)]
    assert [c[0] for c in runner.calls] == ["train", "train", "eval", "eval", "eval", "summarize", "plot"]
    runs, evals = out / "runs" / "tiny_protocol", out / "eval" / "tiny_protocol"
    for name in ("cispo-seed42", "grpo-seed42"):
        assert read_status(runs / name)["state"] == "completed"
        manifest = json.loads((runs / name / "manifest.json").read_text())
        assert manifest["seed"] == 42 and manifest["recipe"]["model"]["path"] == str(setup[2].resolve())
        assert (evals / name / "eval_manifest.json").is_file()
    assert (evals / "sft" / "eval_manifest.json").is_file()
    summary = json.loads((out / "summary" / "tiny_protocol" / "summary.json").read_text())
    assert summary["baseline"] == "sft" and set(summary["conditions"]) == {"sft", "cispo", "grpo"}
    assert summary["n_questions"] == 3 and list((out / "plots" / "tiny_protocol").glob("*.png"))
    record = json.loads((out / "sweep-tiny_protocol.json").read_text())
    assert [c["action"] for c in record["conditions"]] == ["train", "train"]
    assert not list(evals.glob(".staging-*"))

    # Rerun: nothing to train or evaluate; the summary and plots are rewritten.
    runner = Recorder()
    assert sweep.main(_argv(setup, out), runner=runner) == 0
    assert [c[0] for c in runner.calls] == ["summarize", "plot"]
    record = json.loads((out / "sweep-tiny_protocol.json").read_text())
    assert [(c["action"], c["eval_action"]) for c in record["conditions"]] == [("skip", "skip"), ("skip", "skip")]

    # Interrupt cispo after its first checkpoint: what a killed run leaves behind.
    cispo = runs / "cispo-seed42"
    shutil.rmtree(cispo / "final")
    shutil.rmtree(cispo / "checkpoint-2")
    shutil.rmtree(evals / "cispo-seed42")
    write_json_atomic(cispo / "status.json", {"state": "running"})
    before = read_metrics(cispo / "metrics.jsonl")
    runner = Recorder()
    assert sweep.main(_argv(setup, out), runner=runner) == 0
    assert runner.trained() == [("cispo-seed42", True)]
    assert [c[0] for c in runner.calls] == ["train", "eval", "summarize", "plot"]
    assert read_status(cispo)["state"] == "completed"
    manifest = json.loads((cispo / "manifest.json").read_text())
    assert len(manifest["resumes"]) == 1 and manifest["resumes"][0]["checkpoint"].endswith("checkpoint-1")
    after = read_metrics(cispo / "metrics.jsonl")
    assert [r["step"] for r in after] == [1, 2] and after[0] == before[0]
    record = json.loads((out / "sweep-tiny_protocol.json").read_text())
    assert [c["action"] for c in record["conditions"]] == ["resume", "skip"]

    # Only grpo selected: nothing to do for it, and cispo's finished evaluation stays in the summary.
    runner = Recorder()
    assert sweep.main(_argv(setup, out, "--conditions", "grpo"), runner=runner) == 0
    assert [c[0] for c in runner.calls] == ["summarize", "plot"]
    assert [a.split("=")[0] for a in runner.calls[0][1:4]] == ["sft", "cispo@42", "grpo@42"]
    record = json.loads((out / "sweep-tiny_protocol.json").read_text())
    assert [c["action"] for c in record["conditions"]] == ["other", "skip"]

    # A different --set value would silently reuse stale runs: refused before anything runs.
    runner = Recorder()
    assert sweep.main(_argv(setup, out, "--set", "training.learning_rate=0.5"), runner=runner) == 2
    assert runner.calls == []


def test_sweep_refuses_foreign_folders_and_bad_arguments(setup, tmp_path, capsys):
    out = tmp_path / "out"
    stray = out / "runs" / "tiny_protocol" / "grpo-seed42"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("mine")
    runner = Recorder()
    assert sweep.main(_argv(setup, out), runner=runner) == 2
    assert "not a run folder" in capsys.readouterr().err and runner.calls == []
    assert (stray / "notes.txt").read_text() == "mine"

    assert sweep.main(_argv(setup, tmp_path / "o2", "--conditions", "grpo,ppo"), runner=runner) == 2
    assert "unknown condition(s) ['ppo']" in capsys.readouterr().err
    assert sweep.main(_argv(setup, tmp_path / "o3", "--set", "seed=1"), runner=runner) == 2
    assert "use --seeds" in capsys.readouterr().err
    assert sweep.main(_argv(setup, tmp_path / "o4", "--set", "rollout.group_sise=2"), runner=runner) == 2
    assert "unknown key rollout.group_sise" in capsys.readouterr().err
    assert sweep.main(["e9", "--data", "d", "--sft", "s", "--output-dir", "o"], runner=runner) == 2
    assert runner.calls == []


def test_pre_manifest_leftovers_are_cleared_and_dry_run_plans(setup, tmp_path, capsys):
    out = tmp_path / "out"
    leftover = out / "runs" / "tiny_protocol" / "grpo-seed42" / "initial_model"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")
    assert sweep.main(_argv(setup, out, "--dry-run", "--seeds", "1,2", "--conditions", "grpo"), runner=Recorder()) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = [line.split()[:2] for line in lines if not line.startswith((" ", "pre-flight"))]
    assert plan == [["cispo-seed1:", "stale"], ["grpo-seed1:", "train"], ["cispo-seed2:", "stale"],
                    ["grpo-seed2:", "train"]]  # cispo is not selected and has no run to summarise
    assert sweep.run_state(leftover.parent) == "pre_manifest"
    # each condition to train shows its command; each its resolved differences; then the pre-flight
    commands = [line for line in lines if line.startswith("  $ ")]
    assert len(commands) == 2 and all("minimind-trl train" in c and "--output-dir" in c for c in commands)
    assert "seed=2" in commands[1] and "seed=1" in commands[0]
    differs = [line for line in lines if line.startswith("  differs")]
    assert "objective.preset='grpo'" in differs[1] and "nothing (it is the first)" in differs[0]
    assert lines[-1] == "pre-flight: 0 problem(s)"


def test_a_recipe_s_attention_kernel_survives_the_start_checkpoint_and_the_user_s_set_wins(setup, tmp_path):
    """The sweep swaps a recipe's model for its --sft folder (model.config={}), but keeps the attention
    kernel the recipe names; a --set of the user's comes after it."""
    root, protocol, sft = setup
    folder = tmp_path / "eager_protocol"
    folder.mkdir()
    raw = yaml.safe_load((protocol / "grpo.yaml").read_text(encoding="utf-8"))
    raw["model"]["config"] = {"attn_implementation": "eager", "hidden_size": 64}
    (folder / "grpo.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    argv = [str(folder), "--data", str(root / "splits"), "--sft", str(sft), *EVAL]
    for extra, expected in (([], "eager"), (["--set", "model.config.attn_implementation=sdpa"], "sdpa")):
        args = sweep._parser().parse_args([*argv, "--output-dir", str(tmp_path / f"out-{expected}"), *extra])
        plan = sweep.plan_sweep(args)
        cond = plan.conditions[0]
        recipe = load_recipe(cond.recipe, sweep.condition_overrides(plan, cond))
        assert recipe["model"]["config"] == {"attn_implementation": expected}
        assert recipe["model"]["path"] == str(sft) and recipe["model"]["preset"] is None


def test_dry_run_preflight_names_problems_and_exits_2(setup, tmp_path, capsys):
    bad = "rewards=[{name: reward_model, options: {path: /nonexistent/rm}}]"
    assert sweep.main(_argv(setup, tmp_path / "out", "--dry-run", "--set", bad), runner=Recorder()) == 2
    out = capsys.readouterr().out
    assert "PROBLEM" in out and "rewards.0.options.path" in out and "pre-flight: 2 problem(s)" in out


def test_known_protocols_resolve_to_the_shipped_recipes():
    for protocol, conditions in sweep.PROTOCOLS.items():
        name, folder, found = sweep.resolve_conditions(protocol, str(RECIPES), None)
        assert name == protocol and [c for c, _ in found] == list(conditions)
        assert all(path.is_file() for _, path in found)
    _, _, subset = sweep.resolve_conditions("e1", str(RECIPES), "gspo,grpo")
    assert [c for c, _ in subset] == ["grpo", "gspo"]  # protocol order


def test_e2_summary_pulls_in_the_e1_cells(tmp_path):
    out = tmp_path / "out"

    def fake_eval(protocol: str, name: str, sha: str = "s" * 64) -> Path:
        folder = out / "eval" / protocol / name
        folder.mkdir(parents=True)
        (folder / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": sha}}))
        return folder

    plan = sweep.Plan(protocol="e2", recipes_dir="r", data="d", sft="s", out=str(out), seeds=[42, 43], overrides=[])
    fake_eval("e2", "sft")
    own = {"zscore_fixed_length": [(42, "a")], "center_seq_mean": [(42, "b")]}
    assert sweep.interaction_specs(plan, own) == ([], None)  # no e1 sweep here
    fake_eval("e1", "sft")
    grpo, dr_grpo = fake_eval("e1", "grpo-seed42"), fake_eval("e1", "dr_grpo-seed43")
    specs, cells = sweep.interaction_specs(plan, own)
    assert specs == [f"grpo@42={grpo}", f"dr_grpo@43={dr_grpo}"]
    assert cells == ("zscore_seqmean=grpo,zscore_fixedL=zscore_fixed_length,center_seqmean=center_seq_mean,"
                     "center_fixedL=dr_grpo")
    (out / "eval" / "e1" / "sft" / "eval_manifest.json").write_text(json.dumps({"checkpoint": {"sha256": "x"}}))
    assert sweep.interaction_specs(plan, own) == ([], None)  # e1 started from another SFT checkpoint


def test_a_plan_names_its_own_paths_condition_overrides_and_interaction(tmp_path):
    """What the demo relies on: a Plan's baseline/summary/plots/logs paths replace the sweep's layout,
    a condition's own --set items follow the sweep's in its train command, and an interaction given
    to summarize_and_plot is passed to summarize as is."""
    out = tmp_path / "out"
    plan = sweep.Plan(protocol="demo", recipes_dir="r", data="d", sft="s", out=str(out), seeds=[42], overrides=["x=1"],
                      baseline_eval=str(out / "eval" / "sft"), summary_dir=str(out / "summary"),
                      plots_dir=str(out / "plots"), logs_dir=str(out / "logs"))
    default = sweep.Plan(protocol="e1", recipes_dir="r", data="d", sft="s", out=str(out), seeds=[42], overrides=[])
    assert default.baseline_eval == str(out / "eval" / "e1" / "sft")
    assert default.summary_dir == str(out / "summary" / "e1")
    for name in ("sft", "a-seed42", "b-seed42"):
        (out / "eval" / name).mkdir(parents=True)
        (out / "eval" / name / "eval_manifest.json").write_text("{}")
    plan.conditions = [sweep.Condition(name=n, seed=42, recipe="r.yaml", run_dir=str(out / "runs" / f"{n}-seed42"),
                                       eval_dir=str(out / "eval" / f"{n}-seed42"), overrides=[f"objective.preset={n}"],
                                       action="skip") for n in ("a", "b")]
    assert sweep.train_args(plan, plan.conditions[1])[-4:] == ["--set", "x=1", "--set", "objective.preset=b"]
    calls = []
    result = sweep.summarize_and_plot(plan, lambda args, log: calls.append((args, Path(log))) or 0, 100, "c1=a,c2=b")
    summarize, log = calls[0]
    assert summarize[summarize.index("--interaction") + 1] == "c1=a,c2=b"
    assert summarize[summarize.index("--output-dir") + 1] == str(out / "summary")
    assert log == out / "logs" / "summarize.log"
    assert f"sft={out / 'eval' / 'sft'}" in summarize and f"b@42={out / 'eval' / 'b-seed42'}" in summarize
    assert result["summary"] == str(out / "summary" / "summary.md") and result["interaction"] == "c1=a,c2=b"


def test_subprocess_runner_logs_and_uses_the_launcher(tmp_path):
    log = tmp_path / "logs" / "x.log"
    assert sweep.subprocess_runner()(["--version"], log) == 0
    assert "minimind-trl --version" not in log.read_text() and "-m minimind_trl.cli --version" in log.read_text()
    launched = sweep.subprocess_runner(f"{sys.executable}")(["train", "--help"], log)
    assert launched == 0 and "usage: minimind-trl train" in log.read_text()


def test_gpu_slots_parse_one_and_several_gpus_per_slot():
    assert sweep._gpu_slots("0,1,2,3") == ["0", "1", "2", "3"]
    assert sweep._gpu_slots("0,1:2,3") == ["0,1", "2,3"]
    for bad in ("0,0", "0,1:1", "a", "0,,1", "0:"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep._gpu_slots(bad)


def test_in_slots_runs_side_by_side_one_job_per_slot():
    lock, running, seen = threading.Lock(), {}, []

    def job(i):
        def run(slot):
            with lock:
                assert slot not in running.values(), "two jobs on one slot"
                running[i] = slot
                seen.append((i, slot, len(running)))
            time.sleep(0.05)
            with lock:
                del running[i]
        return run

    sweep.in_slots([job(i) for i in range(6)], ["0", "1"])
    assert sorted(i for i, _, _ in seen) == list(range(6)) and {s for _, s, _ in seen} == {"0", "1"}
    assert max(n for _, _, n in seen) == 2  # both slots busy at once
    order = []
    sweep.in_slots([lambda slot, i=i: order.append((i, slot)) for i in range(3)], None)
    assert order == [(0, None), (1, None), (2, None)]  # no --gpus: one after another


def test_the_subprocess_runner_shows_the_child_only_its_gpus(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    log = tmp_path / "gpus.log"
    code = ("import os, sys; print('seen:', os.environ.get('CUDA_VISIBLE_DEVICES', 'all'), "
            "'port:', sys.argv[1], os.environ.get('PET_MASTER_PORT'))")
    run = sweep.subprocess_runner(f'{sys.executable} -c "{code}" {{port}}')  # a "launcher" that prints what it got
    assert run(["train"], log, devices="2,3") == 0 and "\nseen: 2,3 port: 29503 29503\n" in log.read_text()
    assert run(["train"], log, devices="0") == 0 and "\nseen: 0 port: 29501 29501\n" in log.read_text()
    assert run(["train"], log) == 0 and "\nseen: all port: {port} None\n" in log.read_text()


def test_slots_index_the_gpus_this_process_sees():
    assert sweep.visible_devices("0,1", parent="4,5,6") == "4,5" and sweep.visible_devices("2", parent="") == "2"
    with pytest.raises(sweep.SweepError, match="sees only 2 GPU"):
        sweep.visible_devices("2", parent="4,5")


def test_a_failing_job_starts_no_further_job():
    started = []

    def job(i):
        def run(slot):
            started.append(i)
            time.sleep(0.05)
            if i == 0:
                raise RuntimeError("boom")
        return run

    with pytest.raises(RuntimeError, match="boom"):
        sweep.in_slots([job(i) for i in range(6)], ["0", "1"])
    assert len(started) <= 3  # the two first, perhaps one that took the free slot before the stop


def test_a_sweep_with_gpus_gives_every_command_a_slot(setup, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "visible_gpu_count", lambda: 2)  # CPU children only record their slots here
    lock, devices = threading.Lock(), []

    class SlotRecorder(Recorder):
        def __call__(self, args, log, devices_=None, **kwargs):
            with lock:  # in-process commands share torch state: one at a time, slots only recorded
                devices.append((args[0], kwargs.get("devices")))
                return super().__call__(args, log)

    out = tmp_path / "out"
    assert sweep.main(_argv(setup, out, "--gpus", "0,1", "--eval-device", "cuda:1"), runner=SlotRecorder()) == 2
    assert devices == []  # refused before anything ran: each child sees only its slot
    assert sweep.main(_argv(setup, out, "--gpus", "0,1"), runner=SlotRecorder()) == 0
    trains = [d for c, d in devices if c == "train"]
    evals = [d for c, d in devices if c == "eval"]
    assert len(trains) == 2 and len(evals) == 3 and set(trains + evals) <= {"0", "1"}
    assert [c for c, d in devices if d is None] == ["summarize", "plot"]  # no GPU for the CPU steps


def test_cpu_slots_share_the_cores_and_set_every_thread_variable(tmp_path):
    assert sweep.cpu_slots(2, cores=2) == ["cpu:0:1", "cpu:1:1"]
    assert sweep.cpu_slots(1, cores=2) == ["cpu:0:2"]
    assert sweep.cpu_slots(3, cores=2) == ["cpu:0:1", "cpu:1:1", "cpu:2:1"]  # never below one thread
    env = sweep.slot_env("cpu:1:1", base={"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"})
    assert {k: env[k] for k in sweep.THREAD_VARIABLES} == dict.fromkeys(sweep.THREAD_VARIABLES, "1")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29702"
    assert sweep.slot_threads("0,1") is None and "OMP_NUM_THREADS" not in sweep.slot_env("0,1", base={})
    log = tmp_path / "threads.log"
    code = "import torch; print('threads:', torch.get_num_threads())"
    assert sweep.subprocess_runner(f'{sys.executable} -c "{code}"')(["train"], log, devices="cpu:0:1") == 0
    assert "threads: 1" in log.read_text()


def test_jobs_and_gpus_exclude_each_other(setup, tmp_path, capsys):
    assert sweep.main(_argv(setup, tmp_path / "out", "--jobs", "2", "--gpus", "0"), runner=Recorder()) == 2
    assert "--jobs and --gpus exclude each other" in capsys.readouterr().err
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            sweep.main(_argv(setup, tmp_path / "out", "--jobs", bad), runner=Recorder())


_TIMING_KEYS = ("_seconds", "_per_second")


def _without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.endswith(_TIMING_KEYS)} for row in rows]


def test_jobs_side_by_side_equal_sequential_one_thread_runs(setup, tmp_path, monkeypatch):
    """``--jobs 2`` on 2 cores: two children at once, one thread each; every run's metrics (but
    timings), final weights and evaluation records equal those of a sequential one-thread sweep."""
    monkeypatch.setattr(sweep, "usable_cores", lambda: 2)
    side_by_side = tmp_path / "jobs2"
    assert sweep.main(_argv(setup, side_by_side, "--jobs", "2", "--seeds", "42,43", "--conditions", "grpo")) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    sequential = tmp_path / "sequential"
    assert sweep.main(_argv(setup, sequential, "--seeds", "42,43", "--conditions", "grpo")) == 0
    for name in ("grpo-seed42", "grpo-seed43"):
        runs = [out / "runs" / "tiny_protocol" / name for out in (side_by_side, sequential)]
        manifests = [json.loads((run / "manifest.json").read_text()) for run in runs]
        assert [m["torch_threads"] for m in manifests] == [1, 1]
        assert _without_timings(read_metrics(runs[0] / "metrics.jsonl")) == \
            _without_timings(read_metrics(runs[1] / "metrics.jsonl"))
        assert (runs[0] / "final" / "model.safetensors").read_bytes() == \
            (runs[1] / "final" / "model.safetensors").read_bytes()
    for name in ("sft", "grpo-seed42", "grpo-seed43"):
        records = [(out / "eval" / "tiny_protocol" / name / "records.jsonl").read_text()
                   for out in (side_by_side, sequential)]
        assert records[0] == records[1]


@pytest.mark.parametrize("extra, needle", [
    (["--eval-device", "tpu"], "--eval-device"),
    (["--eval-max-new-tokens", "100000000"], "--eval-max-new-tokens"),
    (["--eval-max-tool-turns", "1000"], "--eval-max-tool-turns"),
    (["--eval-batch-size", "0"], "--eval-batch-size"),
    (["--eval-limit", "0"], "--eval-limit"),
    (["--n-resamples", "0"], "--n-resamples"),
    (["--launcher", "no-such-launcher-xyz --nproc_per_node 2"], "--launcher"),
    (["--launcher", "torchrun '"], "--launcher"),
    (["--launcher", "torchrun --master_port {port}"], "{port}"),
    (["--gpus", "0,7"], "--gpus"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_setting_is_checked_before_the_first_condition_trains(setup, tmp_path, capsys, monkeypatch, extra,
                                                                     needle):
    """Issue 40.6: these used to be found only when the first evaluation (or launch) ran, after
    every condition had trained."""
    monkeypatch.setattr(sweep, "visible_gpu_count", lambda: 2)
    runner = Recorder()
    assert sweep.main(_argv(setup, tmp_path / "out", *extra), runner=runner) == 2
    err = capsys.readouterr().err.strip()
    assert runner.calls == [] and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert needle in err, err
    assert not (tmp_path / "out").exists()


def test_gpus_on_a_machine_without_one_are_refused(setup, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "visible_gpu_count", lambda: 0)
    runner = Recorder()
    assert sweep.main(_argv(setup, tmp_path / "out", "--gpus", "0"), runner=runner) == 2
    assert runner.calls == [] and "no GPU" in capsys.readouterr().err


def test_a_second_split_evaluates_the_same_runs_beside_the_first(setup, tmp_path):
    """--eval-split val after a test sweep: nothing trains again; the runs, and the SFT start, are
    evaluated into eval/<protocol>@val, summarised into summary/<protocol>@val; the test folders stay."""
    out = tmp_path / "out"
    assert sweep.main(_argv(setup, out, "--conditions", "grpo"), runner=Recorder()) == 0
    test_records = (out / "eval" / "tiny_protocol" / "grpo-seed42" / "records.jsonl").read_bytes()
    runner = Recorder()
    assert sweep.main(_argv(setup, out, "--conditions", "grpo", "--eval-split", "val"), runner=runner) == 0
    assert [c[0] for c in runner.calls] == ["eval", "eval", "summarize", "plot"]
    for name in ("sft", "grpo-seed42"):
        manifest = json.loads((out / "eval" / "tiny_protocol@val" / name / "eval_manifest.json").read_text())
        assert manifest["split"]["name"] == "val"
    assert (out / "summary" / "tiny_protocol@val" / "summary.json").is_file()
    assert (out / "eval" / "tiny_protocol" / "grpo-seed42" / "records.jsonl").read_bytes() == test_records


def _stage_plan(out: Path) -> sweep.Plan:
    """Stages ``a`` then ``b`` (no seed; ``b`` starts from ``a`` and is the baseline) and a condition
    ``c`` (seed 1) after ``b``, as the demo plans pretraining, SFT and an RL run; checked by the planner."""
    recipe = str(RECIPES / "demo" / "sft.yaml")
    plan = sweep.Plan(protocol="p", recipes_dir="r", data="d", sft=str(out / "runs" / "b" / "final"), out=str(out),
                      seeds=[1], overrides=[], baseline_after="b", logs_dir=str(out / "logs"))
    plan.conditions = [sweep.Condition("a", None, recipe, str(out / "runs" / "a"), ""),
                       sweep.Condition("b", None, recipe, str(out / "runs" / "b"), "", after="a"),
                       sweep.Condition("c", 1, recipe, str(out / "runs" / "c-seed1"), str(out / "eval" / "c"),
                                       after="b")]
    sweep.check_plan(plan, _STAGE_EVAL, "use another folder")
    return plan


_STAGE_EVAL = {"split": "test", "limit": None, "batch_size": 1, "max_new_tokens": 8, "max_tool_turns": 1,
               "device": "cpu"}


class StageRunner:
    """Records (command, output folder, slot); ``train`` leaves a completed run unless its folder is
    in ``failing``, ``eval`` a finished evaluation."""

    def __init__(self, failing: tuple[str, ...] = ()):
        self.calls: list[tuple[str, str, str | None]] = []
        self.failing = failing

    def __call__(self, args: list[str], log: Path, devices: str | None = None) -> int:
        target = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else None
        self.calls.append((args[0], target.name if target else "", devices))
        if args[0] == "train":
            if target.name in self.failing:
                return 1
            (target / "final").mkdir(parents=True)
            (target / "final" / "config.json").write_text("{}")
            (target / "manifest.json").write_text("{}")
            (target / "status.json").write_text(json.dumps({"state": "completed"}))
        elif args[0] == "eval":
            target.mkdir(parents=True)
            (target / "eval_manifest.json").write_text("{}")
        return 0


def test_stages_train_first_on_their_slot_then_what_follows_them(tmp_path):
    """The driver keeps the plan's dependencies: the stages one after another on the stage slot, then
    after_stages(), then the seeded conditions on their slots; the baseline (the stage that makes the
    start) and each run are evaluated after their run; stages have no evaluation of their own."""
    plan, runner, projected = _stage_plan(tmp_path / "out"), StageRunner(), []
    assert [(c.label, c.action) for c in plan.conditions] == [("a", "train"), ("b", "train"), ("c-seed1", "train")]
    failed, _ = sweep.drive(plan, _STAGE_EVAL, runner, ["cpu:0:1"], stage_slot="cpu:0:2",
                            after_stages=lambda: projected.append(len(runner.calls)))
    assert not failed and projected == [2]
    assert runner.calls == [("train", "a", "cpu:0:2"), ("train", "b", "cpu:0:2"), ("train", "c-seed1", "cpu:0:1"),
                            ("eval", "sft", "cpu:0:1"), ("eval", "c", "cpu:0:1"), ("summarize", "p", None),
                            ("plot", "p", None)]
    assert [c.eval_action for c in plan.conditions] == ["none", "none", "eval"]


def test_what_follows_a_failed_stage_is_not_trained(tmp_path):
    plan, runner, projected = _stage_plan(tmp_path / "out"), StageRunner(failing=("a",)), []
    failed, outputs = sweep.drive(plan, _STAGE_EVAL, runner, ["cpu:0:1"], stage_slot="cpu:0:2",
                                  after_stages=lambda: projected.append(True))
    assert failed and outputs["summary"] is None and projected == []
    assert runner.calls == [("train", "a", "cpu:0:2")]  # nothing after it, not even the baseline's evaluation
    assert [c.action for c in plan.conditions] == ["failed", "blocked", "blocked"]


def test_the_planner_refuses_a_stage_named_after_its_follower(tmp_path):
    plan = sweep.Plan(protocol="p", recipes_dir="r", data="d", sft="s", out=str(tmp_path), seeds=[1], overrides=[])
    recipe = str(RECIPES / "demo" / "sft.yaml")
    plan.conditions = [sweep.Condition("c", 1, recipe, str(tmp_path / "c"), str(tmp_path / "e"), after="a"),
                       sweep.Condition("a", None, recipe, str(tmp_path / "a"), "")]
    with pytest.raises(sweep.SweepError, match="names 'a' as a stage to start from, but has no such stage before it"):
        sweep.check_plan(plan, _STAGE_EVAL, "use another folder")
