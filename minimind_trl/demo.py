"""The CPU demo: the whole protocol, from nothing, on a laptop-class machine.

``minimind-trl demo --output-dir runs/demo`` runs, one stage after another:

1. data      generate agent-math tasks (seed 42) and prepare audited train/val/test splits;
2. tokenizer build the 6400-id byte-level BPE tokenizer from project data (rendered gold
             trajectories of generated tasks and the package's general text) with
             ``minimind-trl tokenizer build``;
3. pretrain  next-token pretraining of a small MiniMind (``demo`` preset, ~5M parameters) from
             random init on short plain-text solutions of the training split mixed with
             number-copy drills (``minimind_trl.data.drills``), packed into 128-token blocks,
             small batches (``recipes/demo/pretrain.yaml``): the drills make the model learn to
             copy numbers (operands into calls, results into answers), which the solution texts
             alone do not teach a 5M model within the budget;
4. sft       SFT on gold tool-use trajectories of the training split (``recipes/demo/sft.yaml``,
             assistant-only loss);
5. rl        GRPO, CISPO, Dr.GRPO and GSPO from that same SFT checkpoint, each with the same RL
             seeds (``--seeds``, default 3: seed, seed+1, ...; one seed gives every objective the
             same data order and sampling stream), same rollout budget (``recipes/demo/rl.yaml``
             with ``objective.preset`` and ``seed`` set per run);
6. eval      frozen greedy evaluation of the SFT checkpoint and every RL run on the test split;
7. summary   ``summary.md`` with per-seed results, paired-bootstrap CIs against SFT over questions
             and two-level CIs (training seeds, then questions), and PNG plots.

Every heavy stage is the public command a user would type (``minimind-trl train``, ``eval``,
``summarize``, ``plot``), run in a child process, so the demo exercises exactly the documented
path. A stage whose output is complete is skipped on ``--resume``; anything half-written is
refused, never overwritten. ``--quick`` shrinks every stage (a couple of minutes; for CI-like
smoke runs), without changing what is run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CONDITIONS = ("grpo", "cispo", "dr_grpo", "gspo")
RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes" / "demo"  # the repository checkout


@dataclass(frozen=True)
class DemoSize:
    """How big each stage is. ``full`` is what the README reports; ``quick`` only proves the chain."""

    num_tasks: int  # generated before de-duplication and splitting
    val_size: int
    test_size: int
    drill_rows: int  # number-copy drills mixed into the pretraining texts
    pretrain_epochs: float
    sft_rows: int  # gold trajectories used for SFT (the first N of the training split)
    sft_epochs: float
    rl_rollouts: int  # rollouts per RL run (each = K optimizer updates)
    rl_seeds: int  # RL seeds per objective (all from the one SFT start)
    eval_batch_size: int


SIZES = {
    "full": DemoSize(num_tasks=4300, val_size=50, test_size=150, drill_rows=8000, pretrain_epochs=2.0, sft_rows=800,
                     sft_epochs=1.0, rl_rollouts=6, rl_seeds=3, eval_batch_size=50),
    "quick": DemoSize(num_tasks=160, val_size=10, test_size=30, drill_rows=200, pretrain_epochs=1.0, sft_rows=120,
                      sft_epochs=1.0, rl_rollouts=1, rl_seeds=2, eval_batch_size=30),
}

# The demo's task mix: questions the calculator answers (arithmetic, percentages, powers), with one
# or two ground-truth values, no distractor tools (prompts stay short enough for 2 CPU cores) and
# the easy tier (small integers, one operation). On medium/hard tasks (up to 5 digits, decimals,
# reordered operands) a 5M model did not learn to copy within the budget (docs/demo_results.md).
TASK_FILTER = {"op_types": ("arithmetic", "percentage", "power"), "n_gt_values": (1, 2), "max_distractors": 0,
               "difficulties": ("easy",)}


class DemoError(RuntimeError):
    """A stage failed or the output folder holds something the demo will not overwrite."""


def _log(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _run(args: list[str], log_file: Path) -> None:
    """Run ``minimind-trl ARGS`` in a child process, its output teed to ``log_file``."""
    command = [sys.executable, "-m", "minimind_trl.cli", *args]
    _log("$ minimind-trl " + " ".join(args))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1)
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if not line.startswith(("[20", "  warnings.warn")):  # drop DeepSpeed/transformers chatter
                sys.stdout.write("    " + line)
        code = process.wait()
    if code != 0:
        raise DemoError(f"`minimind-trl {args[0]}` failed with exit code {code}; see {log_file}")


def _stage_done(path: Path, marker: str) -> bool:
    return (path / marker).is_file()


def _check_fresh(path: Path, resume: bool, marker: str) -> bool:
    """True when the stage is already complete (and ``resume``); clears a half-written stage on
    ``resume``; refuses a non-empty stage folder otherwise."""
    if _stage_done(path, marker):
        if resume:
            return True
        raise DemoError(f"{path} already holds a finished stage; use --resume or a new --output-dir")
    if path.exists() and any(path.iterdir()):
        if not resume:
            raise DemoError(f"{path} is not empty; use --resume or a new --output-dir")
        shutil.rmtree(path)
    return False


def _training_done(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    if not status.is_file():
        return False
    return json.loads(status.read_text(encoding="utf-8")).get("state") == "completed"


def stage_data(out: Path, size: DemoSize, seed: int, resume: bool) -> Path:
    from minimind_trl.data import generate_tasks, prepare_splits
    from minimind_trl.data.drills import copy_drills
    from minimind_trl.data.gold import gold_file_rows
    from minimind_trl.data.manifest import sha256_file, write_json_atomic, write_jsonl_atomic
    from minimind_trl.envs.tools import default_registry

    splits, sft = out / "data" / "splits", out / "data" / "sft"
    if resume and _stage_done(splits, "manifest.json") and _stage_done(sft, "manifest.json"):
        return splits
    if (out / "data").exists() and any((out / "data").iterdir()):
        if not resume:
            raise DemoError(f"{out / 'data'} is not empty; use --resume or a new --output-dir")
        shutil.rmtree(out / "data")
    (out / "data").mkdir(parents=True)
    registry = default_registry()
    tasks = generate_tasks(size.num_tasks, seed, registry=registry, **TASK_FILTER)
    tasks_file = out / "data" / "tasks.jsonl"
    write_jsonl_atomic(tasks_file, tasks)
    train_size = len(tasks) - size.val_size - size.test_size
    prepare_splits([tasks_file], splits, seed=seed, sizes=[train_size, size.val_size, size.test_size])
    # SFT data: one gold trajectory per *training* task (val/test never leak into SFT).
    gold = gold_file_rows(str(splits / "train.jsonl"), registry)
    source = {"train.jsonl": sha256_file(splits / "train.jsonl")}
    # Pretraining texts: every training task's solution plus copy drills, shuffled (packing keeps
    # row order, so each 128-token block mixes both kinds).
    pretrain_rows = [{"text": solution_text(g)} for g in gold] + copy_drills(size.drill_rows, seed)
    random.Random(seed).shuffle(pretrain_rows)
    for folder, rows, what in ((sft, gold[: size.sft_rows], "gold SFT trajectories"),
                               (out / "data" / "pretrain", pretrain_rows,
                                f"plain-text solutions and {size.drill_rows} number-copy drills (pretraining)")):
        folder.mkdir(parents=True)
        write_jsonl_atomic(folder / "train.jsonl", rows)
        write_json_atomic(folder / "manifest.json", {
            "description": f"{what} of the demo's training split",
            "source": source,
            "outputs": {"train.jsonl": {"sha256": sha256_file(folder / "train.jsonl"), "rows": len(rows)}},
        })
    _log(f"data: {len(tasks)} tasks -> {train_size}/{size.val_size}/{size.test_size} splits, "
         f"{len(pretrain_rows)} pretraining texts ({size.drill_rows} drills), {min(len(gold), size.sft_rows)} SFT rows")
    return splits


def solution_text(gold: dict) -> str:
    """A gold trajectory as plain text: question, tool-call JSON, tool results, answer (one per line)."""
    parts = []
    for message in gold["conversations"][1:]:
        parts.append(message.get("tool_calls") or message.get("content") or "")
    return "\n".join(p for p in parts if p)


def stage_tokenizer(out: Path, resume: bool) -> Path:
    """The project's tokenizer recipe (as ``scripts/build_default_tokenizer.py``): rendered gold
    trajectories of 4,000 generated tasks plus the package's general text, 6400 ids."""
    from minimind_trl.data.manifest import write_jsonl_atomic
    from minimind_trl.tokenization.default_corpus import default_corpus

    folder = out / "tokenizer"
    if _check_fresh(folder, resume, "tokenizer.json"):
        return folder
    corpus = out / "data" / "tokenizer_corpus.jsonl"
    write_jsonl_atomic(corpus, [{"text": doc} for doc in default_corpus(4000, 20240601, 20)])
    _run(["tokenizer", "build", "--corpus", str(corpus), "--output-dir", str(folder)], out / "logs" / "tokenizer.log")
    return folder


def stage_train(out: Path, name: str, recipe: Path, overrides: list[str], resume: bool) -> Path:
    run_dir = out / "runs" / name
    if _training_done(run_dir):
        if resume:
            _log(f"{name}: already trained, skipping")
            return run_dir / "final"
        raise DemoError(f"{run_dir} already holds a finished run; use --resume or a new --output-dir")
    args = ["train", str(recipe), "--output-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    if run_dir.exists() and any(run_dir.iterdir()):
        if not resume:
            raise DemoError(f"{run_dir} is not empty; use --resume or a new --output-dir")
        args.append("--resume")
    _run(args, out / "logs" / f"train_{name}.log")
    return run_dir / "final"


def stage_eval(out: Path, name: str, checkpoint: Path, splits: Path, tokenizer: Path, size: DemoSize,
               resume: bool) -> Path:
    folder = out / "eval" / name
    if _check_fresh(folder, resume, "eval_manifest.json"):
        _log(f"eval {name}: already done, skipping")
        return folder
    _run(["eval", "--checkpoint", str(checkpoint), "--tokenizer", str(tokenizer), "--split-dir", str(splits),
          "--split", "test", "--output-dir", str(folder), "--batch-size", str(size.eval_batch_size),
          "--max-new-tokens", "96"], out / "logs" / f"eval_{name}.log")
    return folder


def rl_seeds(seed: int, count: int) -> list[int]:
    """The RL seeds: ``seed``, ``seed + 1``, ... (the first is the pretraining/SFT seed too)."""
    if count < 1:
        raise DemoError(f"--seeds must be at least 1, got {count}")
    return [seed + i for i in range(count)]


def run_name(condition: str, rl_seed: int) -> str:
    """Run and eval folder name of one (objective, RL seed)."""
    return f"{condition}_seed{rl_seed}"


def run_demo(out: Path, size: DemoSize, seed: int = 42, resume: bool = False, num_seeds: int | None = None) -> Path:
    """Run every stage into ``out``; returns the path of ``summary.md``. ``num_seeds`` RL seeds per
    objective (default: the size's)."""
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    splits = stage_data(out, size, seed, resume)
    tokenizer = stage_tokenizer(out, resume)
    common = [f"tokenizer.path={tokenizer}", f"seed={seed}"]
    pretrained = stage_train(out, "pretrain", RECIPE_DIR / "pretrain.yaml",
                             [f"data.path={out / 'data' / 'pretrain'}",
                              f"training.num_train_epochs={size.pretrain_epochs}", *common], resume)
    _log(f"pretrain done ({time.time() - started:.0f} s so far)")
    sft = stage_train(out, "sft", RECIPE_DIR / "sft.yaml",
                      [f"data.path={out / 'data' / 'sft'}", f"training.num_train_epochs={size.sft_epochs}",
                       "model.preset=null", f"model.path={pretrained}", *common],
                      resume)
    _log(f"sft done ({time.time() - started:.0f} s so far)")
    checkpoints = {"sft": sft}
    labels = {"sft": "sft"}  # folder name -> summarize label (cond@seed)
    for rl_seed in rl_seeds(seed, size.rl_seeds if num_seeds is None else num_seeds):
        for name in CONDITIONS:
            run = run_name(name, rl_seed)
            checkpoints[run] = stage_train(
                out, run, RECIPE_DIR / "rl.yaml",
                [f"model.path={sft}", f"data.path={splits}", f"objective.preset={name}",
                 f"training.max_steps={size.rl_rollouts * 4}", f"tokenizer.path={tokenizer}", f"seed={rl_seed}"],
                resume,
            )
            labels[run] = f"{name}@{rl_seed}"
            _log(f"{run} done ({time.time() - started:.0f} s so far)")
    evals = {run: stage_eval(out, run, ckpt, splits, tokenizer, size, resume) for run, ckpt in checkpoints.items()}
    summary_dir = out / "summary"
    if not (resume and _stage_done(summary_dir, "summary.md")):
        if summary_dir.exists():
            shutil.rmtree(summary_dir)
        _run(["summarize", *[f"{labels[run]}={path}" for run, path in evals.items()], "--baseline", "sft",
              "--output-dir", str(summary_dir)], out / "logs" / "summarize.log")
    plots = out / "plots"
    if not (resume and plots.is_dir() and any(plots.iterdir())):
        shutil.rmtree(plots, ignore_errors=True)
        _run(["plot", "--runs", *[str(out / "runs" / run) for run in checkpoints if run != "sft"], "--summary",
              str(summary_dir / "summary.json"), "--output-dir", str(plots)], out / "logs" / "plot.log")
    _log(f"done in {time.time() - started:.0f} s; summary: {summary_dir / 'summary.md'}; plots: {plots}")
    return summary_dir / "summary.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minimind-trl demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/demo", help="demo folder (default: runs/demo)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the chain in a few minutes")
    parser.add_argument("--seed", type=int, default=42, help="data, pretraining and SFT seed; the first RL seed")
    parser.add_argument("--seeds", type=int, default=None,
                        help="RL seeds per objective (default 3; --quick: 2): seed, seed+1, ...")
    parser.add_argument("--resume", action="store_true", help="skip finished stages, redo unfinished ones")
    args = parser.parse_args(argv)
    try:
        summary = run_demo(Path(args.output_dir), SIZES["quick" if args.quick else "full"], args.seed, args.resume,
                           args.seeds)
    except DemoError as exc:
        print(f"minimind-trl demo: {exc}", file=sys.stderr)
        return 2
    print()
    print(summary.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
