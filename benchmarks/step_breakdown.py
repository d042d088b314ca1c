"""Where a GRPO step's time goes, from the trainer's own timing metrics, checked against the clock.

What is measured
----------------
The smoke recipe (``--recipe``; default: the first ``recipes/*smoke*.yaml``; when the project has
none, a built-in fallback recipe, reported as such) is trained through the same code path as
``minimind-trl train`` (``minimind_trl.trainer.cli.train``) for ``--steps`` optimizer steps. The
trainer writes ``RUN_DIR/metrics.jsonl`` with, per optimizer step, ``rollout_seconds`` (generation,
tool calls, rewards, advantages), ``old_logp_seconds`` (the frozen old-log-prob pass, once per
rollout when K > 1) and ``update_seconds`` (forward + loss + backward of the micro-batches).

This script times, around the trainer and without changing what it does (instance-level
wrappers and a callback):

* ``measured``: wall time of each optimizer step, from the start of ``get_batch_samples`` (the
  outer loop's first call for the step) to the end of ``_maybe_log_save_evaluate`` (logging,
  metrics record, saving);
* ``reward``: time inside the reward functions (part of ``rollout_seconds``; shown apart, the
  rollout row then excludes it);
* ``data``: ``get_batch_samples``; ``grad_norm``: ``_clip_grad_norm`` + ``_get_grad_norm``
  (gradient clipping and the trainer's end-of-step reduction of its figures); ``optimizer``:
  ``optimizer.step()`` (between the pre/post optimizer callbacks); ``scheduler``: scheduler step,
  zero_grad and callbacks up to ``on_step_end``; ``logging``: ``_maybe_log_save_evaluate``.

Reported: a per-step table, totals over the steps after the first (warm-up; ``--include-first``
to keep it), the share of each phase, and two sums against the measured step time: the trainer's
own fields alone (rollout + old-log-prob + update) and the full breakdown (those + the phases
timed here). Target: the breakdown sums to the measured step time within 5%.
"""

from __future__ import annotations

import glob
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402
from _common import REPO, PeakMemory, environment, print_table, print_targets, write_json  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from minimind_trl.data import generate_tasks  # noqa: E402
from minimind_trl.data.splits import prepare_splits  # noqa: E402
from minimind_trl.metric_names import COMPLETION_TOKENS_MAX, ROLLOUT_ACTION_TOKENS  # noqa: E402
from minimind_trl.trainer import build  # noqa: E402
from minimind_trl.trainer.cli import train  # noqa: E402
from minimind_trl.trainer.recipe import load_recipe, validate_recipe  # noqa: E402
from minimind_trl.trainer.recorder import read_metrics  # noqa: E402

TARGET_TOLERANCE = 0.05
TRAINER_FIELDS = ("rollout_seconds", "old_logp_seconds", "update_seconds")
PHASES = ("rollout", "reward", "old_logp", "update", "data", "grad_norm", "optimizer", "scheduler", "logging")

FALLBACK_RECIPE = {
    "kind": "grpo",
    "seed": 0,
    "description": "step_breakdown.py fallback smoke recipe (the project has no recipes/*smoke*.yaml yet)",
    "model": {"preset": "tiny", "dtype": "float32"},
    "data": {"path": None, "split": "train", "verify": False},
    "objective": {"preset": "grpo"},
    "rollout": {"group_size": 4, "prompts_per_rollout": 2, "max_tool_turns": 2, "thinking_ratio": 0.0,
                "max_completion_length": 64, "temperature": 1.0},
    "rewards": [{"name": "task_reward"}],
    "training": {"max_steps": 6, "num_iterations": 2, "gradient_accumulation_steps": 1, "learning_rate": 1e-4,
                 "lr_scheduler_type": "constant", "bf16": False, "gradient_checkpointing": False, "report_to": [],
                 "save_strategy": "no", "disable_tqdm": True, "dataloader_num_workers": 0},
}


# ----------------------------------------------------------------------------------- recipe


def find_smoke_recipe() -> Path | None:
    found = sorted(glob.glob(str(REPO / "recipes" / "*smoke*.yaml")) + glob.glob(str(REPO / "recipes" / "*smoke*.yml")))
    return Path(found[0]) if found else None


def make_task_folder(folder: Path, num_tasks: int, seed: int) -> Path:
    """Generated agent-math tasks as a split folder (``train.jsonl`` ...) with a manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "tasks.jsonl"
    with open(source, "w", encoding="utf-8") as handle:
        for row in generate_tasks(num_tasks, seed):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    out = folder / "splits"
    try:
        prepare_splits([source], out, seed=seed, fractions=[0.8, 0.1, 0.1])
    except Exception as exc:  # noqa: BLE001 - fall back to a bare train file
        print(f"note: prepare_splits failed ({type(exc).__name__}: {exc}); writing a bare train.jsonl")
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, out / "train.jsonl")
    return out


def load(args: Any, work: Path) -> tuple[dict, dict[str, Any]]:
    """The resolved recipe and a note of where it came from and what was overridden."""
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"training.max_steps={args.steps}")
    if args.device == "cpu":
        overrides.append("training.use_cpu=true")
    source: dict[str, Any] = {"overrides": overrides}
    path = Path(args.recipe) if args.recipe else find_smoke_recipe()
    if path is not None:
        source["recipe"] = str(path)
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    else:
        source["recipe"] = "built-in fallback (no recipes/*smoke*.yaml in the project)"
        raw = json.loads(json.dumps(FALLBACK_RECIPE))
    data_path = (raw.get("data") or {}).get("path")
    if data_path is not None and not Path(data_path).is_absolute() and path is not None:
        for base in (Path.cwd(), REPO, path.parent):
            if (base / data_path).exists():
                raw["data"]["path"] = str(base / data_path)
                break
    if data_path is None or not Path(raw["data"]["path"]).exists():
        folder = make_task_folder(work / "data", args.num_tasks, args.seed)
        source["data"] = f"generated: generate_tasks({args.num_tasks}, seed={args.seed}) -> {folder}"
        if data_path is not None:
            source["data"] += f" (the recipe's data.path {data_path!r} does not exist)"
        raw.setdefault("data", {})["path"] = str(folder)
    else:
        source["data"] = str(raw["data"]["path"])
    recipe_file = work / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), encoding="utf-8")
    recipe = load_recipe(recipe_file, overrides) if overrides else validate_recipe(raw)
    return recipe, source


# ------------------------------------------------------------------------------ instrumentation


class StepClock:
    """Instance-level wrappers and a callback that time each optimizer step and its phases."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.epoch_end_logging = 0.0

    def _add(self, key: str, seconds: float) -> None:
        if self.current is not None:
            self.current[key] = self.current.get(key, 0.0) + seconds

    def _timed(self, key: str, fn: Any, opens: bool = False, closes: bool = False) -> Any:
        clock = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            if opens:
                clock.current = {"start": start}
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                if clock.current is None:
                    if key == "logging":
                        clock.epoch_end_logging += end - start
                else:
                    clock._add(key, end - start)
                    if closes and "optimizer_end" in clock.current:
                        clock._close(end)

        wrapper.__name__ = getattr(fn, "__name__", key)
        wrapper.__qualname__ = getattr(fn, "__qualname__", key)
        return wrapper

    def _close(self, end: float) -> None:
        step = self.current
        step["measured"] = end - step.pop("start")
        step["scheduler"] = step.pop("step_end") - step.pop("optimizer_end")
        step.pop("optimizer_start", None)
        self.steps.append(step)
        self.current = None

    def attach(self, trainer: Any) -> Any:
        clock = self
        trainer.get_batch_samples = self._timed("data", trainer.get_batch_samples, opens=True)
        trainer._clip_grad_norm = self._timed("grad_norm", trainer._clip_grad_norm)
        trainer._get_grad_norm = self._timed("grad_norm", trainer._get_grad_norm)
        trainer._maybe_log_save_evaluate = self._timed("logging", trainer._maybe_log_save_evaluate, closes=True)
        trainer.reward_funcs = [self._timed("reward", f) if callable(f) and not hasattr(f, "parameters") else f
                                for f in trainer.reward_funcs]

        class Marks(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                if clock.current is not None:
                    clock.current["optimizer_start"] = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kwargs):
                if clock.current is not None:
                    now = time.perf_counter()
                    clock.current["optimizer"] = now - clock.current["optimizer_start"]
                    clock.current["optimizer_end"] = now

            def on_step_end(self, args, state, control, **kwargs):
                if clock.current is not None:
                    clock.current["step_end"] = time.perf_counter()
                    clock.current["global_step"] = state.global_step

        trainer.add_callback(Marks())
        return trainer


# ----------------------------------------------------------------------------------------- main


def breakdown(records: list[dict[str, Any]], clocked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the trainer's fields joined with the clocked phases (by step number)."""
    by_step = {c["global_step"]: c for c in clocked}
    rows = []
    for record in records:
        clock = by_step.get(record["step"])
        if clock is None:
            continue
        reward = clock.get("reward", 0.0)
        row = {
            "step": record["step"], "rollout_index": record.get("rollout"), "update_index": record.get("update"),
            "measured": clock["measured"],
            "rollout": (record.get("rollout_seconds") or 0.0) - reward, "reward": reward,
            "old_logp": record.get("old_logp_seconds") or 0.0, "update": record.get("update_seconds") or 0.0,
            "data": clock.get("data", 0.0), "grad_norm": clock.get("grad_norm", 0.0),
            "optimizer": clock.get("optimizer", 0.0), "scheduler": clock.get("scheduler", 0.0),
            "logging": clock.get("logging", 0.0),
            # The rollout's workload (every step of a rollout repeats it): model tokens sampled, longest completion.
            "action_tokens": record.get(ROLLOUT_ACTION_TOKENS) or 0.0,
            "completion_tokens_max": record.get(COMPLETION_TOKENS_MAX) or 0.0,
        }
        row["trainer_sum"] = sum(record.get(k) or 0.0 for k in TRAINER_FIELDS)
        row["breakdown_sum"] = sum(row[k] for k in PHASES)
        row["unaccounted"] = row["measured"] - row["breakdown_sum"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--recipe", default=None, help="recipe YAML (default: recipes/*smoke*.yaml, else built-in)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="recipe override, as for minimind-trl train (repeatable)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (training.max_steps)")
    parser.add_argument("--device", default="auto",
                        help="cpu forces training.use_cpu; anything else leaves the device to the recipe/accelerate")
    parser.add_argument("--num-tasks", type=int, default=64, help="tasks generated when the recipe's data is absent")
    parser.add_argument("--run-dir", default=None, help="run folder to keep (default: a temporary one, removed)")
    parser.add_argument("--include-first", action="store_true", help="count the first (warm-up) step in the totals")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write the results as JSON to this file")
    parser.add_argument("--quick", action="store_true", help="2 steps of a tiny setting: checks that the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 2 if args.steps is None else args.steps
        args.num_tasks = min(args.num_tasks, 16)
        args.threads = args.threads or 1
        args.overrides = ["rollout.max_completion_length=8", "rollout.group_size=2", "rollout.prompts_per_rollout=2",
                          "model.preset=tiny", *args.overrides]

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="step_breakdown_"))
    run_dir = Path(args.run_dir) if args.run_dir else work / "run"
    try:
        recipe, source = load(args, work)

        if recipe["kind"] != "grpo":
            raise SystemExit(f"step_breakdown: the recipe is of kind {recipe['kind']!r}; a GRPO recipe is needed")
        clock = StepClock()
        original = build.build_trainer

        def instrumented(*a: Any, **k: Any) -> Any:
            return clock.attach(original(*a, **k))

        device = torch.device("cuda" if torch.cuda.is_available() and not recipe["training"].get("use_cpu")
                              else "cpu")
        build.build_trainer = instrumented
        try:
            started = time.perf_counter()
            with PeakMemory(device) as memory:
                train(recipe, str(run_dir), False, ["benchmarks/step_breakdown.py", *(argv or sys.argv[1:])])
            total_wall = time.perf_counter() - started
        finally:
            build.build_trainer = original
        metrics_file = run_dir / "metrics.jsonl"
        records = read_metrics(metrics_file) if metrics_file.is_file() else []
        fields = sorted({k for r in records for k in r})
    finally:
        if not args.run_dir:
            shutil.rmtree(work, ignore_errors=True)

    rows = breakdown(records, clock.steps)
    missing = [k for k in TRAINER_FIELDS if not any(k in r for r in records)]
    print(f"step breakdown: recipe {source['recipe']}; data {source['data']}; {len(records)} metrics records, "
          f"{len(clock.steps)} clocked steps; training wall {total_wall:.2f} s; peak memory of the run "
          f"{memory.peak_mib:,.0f} MiB ({memory.method})")
    if missing:
        print(f"metrics.jsonl lacks timing field(s): {missing}")
    columns = ["step", "measured", *PHASES, "unaccounted"]
    print_table("Per step (seconds; rollout excludes reward)", columns,
                [[r["step"], *(r[c] for c in columns[1:])] for r in rows])

    kept = rows if args.include_first or len(rows) < 2 else rows[1:]
    totals = {k: sum(r[k] for r in kept) for k in ("measured", "trainer_sum", "breakdown_sum", *PHASES)}
    measured = totals["measured"] or float("nan")
    print_table(f"Totals over {len(kept)} step(s){'' if kept is rows else ' (first step left out: warm-up)'}",
                ["phase", "seconds", "share of measured"],
                [[k, totals[k], totals[k] / measured] for k in (*PHASES, "breakdown_sum", "trainer_sum", "measured")])
    full_gap = abs(totals["breakdown_sum"] - totals["measured"]) / measured if kept else None
    trainer_gap = abs(totals["trainer_sum"] - totals["measured"]) / measured if kept else None
    worst = max((abs(r["unaccounted"]) / r["measured"] for r in kept), default=None)
    targets = [
        {"name": "breakdown (trainer fields + clocked phases) sums to the measured step time",
         "measured": "-" if full_gap is None else f"{full_gap * 100:.2f}% off (worst step {worst * 100:.2f}%)",
         "target": f"within {TARGET_TOLERANCE * 100:g}%",
         "pass": None if full_gap is None else full_gap <= TARGET_TOLERANCE},
        {"name": "trainer's own fields alone (rollout + old_logp + update) vs measured step time",
         "measured": "-" if trainer_gap is None else f"{trainer_gap * 100:.2f}% off",
         "target": f"within {TARGET_TOLERANCE * 100:g}%",
         "pass": None if trainer_gap is None or missing else trainer_gap <= TARGET_TOLERANCE},
    ]
    print_targets(targets)
    payload = {
        "benchmark": "step_breakdown",
        "what": "GRPO step-time breakdown from metrics.jsonl timing fields plus clocked phases; see the docstring",
        "quick": args.quick,
        "environment": environment(device),
        "source": source,
        "recipe": recipe,
        "metrics_fields": fields,
        "missing_timing_fields": missing,
        "training_wall_s": total_wall,
        "training_memory": memory.as_dict(),
        "epoch_end_logging_s": clock.epoch_end_logging,
        "steps": rows,
        "totals": totals,
        "first_step_excluded": kept is not rows,
        "breakdown_gap": full_gap,
        "trainer_fields_gap": trainer_gap,
        "targets": targets,
    }
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
