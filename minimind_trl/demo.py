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
path. Stages 5-7 are the sweep's own driver (:func:`minimind_trl.sweep.drive`) on a plan the demo
names (:func:`rl_plan`): runs in ``runs/<condition>-seed<S>``, evaluations in ``eval/``, the
summary in ``summary/`` and plots in ``plots/``, with the sweep's reuse rules (a run by its recipe
hash, an evaluation by its weights and settings; summary and plots are rewritten every time). A
stage whose output is complete is skipped on ``--resume``; anything half-written is refused, never
overwritten. ``--quick`` shrinks every stage (a couple of minutes; for CI-like
smoke runs), without changing what is run.

``--ablation`` adds the two missing cells of the 2x2 (advantage z-score / centred x reduction
per-sequence mean / fixed L), with the same RL seeds: ``zscore_fixedL`` (Dr.GRPO's fixed-L
reduction with GRPO's z-score advantage) and ``center_seqmean`` (GRPO's per-sequence mean with
Dr.GRPO's centred advantage). The summary then reports the interaction
``(center_fixedL - center_seqmean) - (zscore_fixedL - zscore_seqmean)``, GRPO and Dr.GRPO being
the other two cells.

Time. Every stage's wall time goes to ``timings.json``. After pretraining and SFT the demo projects
the rest from how long this machine took for those two stages against the reference machine
(:data:`REFERENCE_SECONDS`, 2 idle cores) and prints the projection. It shortens the RL stage to fit
its budget (:data:`DEFAULT_BUDGET_MIN` minutes unless ``--budget MINUTES``): fewer rollouts per run
(not below 2), then 2 RL seeds, and evaluates each checkpoint on the first
``budget_eval_questions`` (150) of the 600 test questions; what it chose is printed and recorded
in ``timings.json`` (``plan``), and ``--resume`` keeps that plan; a resume that asks for another
one (another ``--budget``, ``--full-rl``, ``--seeds``) is refused. A finished RL run is reused
only when it ran the recipe this call would run (the sweep's rule, ``recipe_sha256``). The full
recipe (60 rollouts, the setting that raised greedy success) takes about 12 minutes per run on 2
cores; ``--full-rl`` runs it whole and evaluates on every test question.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minimind_trl import sweep
from minimind_trl.data import generate_tasks, prepare_splits
from minimind_trl.data.drills import copy_drills
from minimind_trl.data.gold import gold_file_rows
from minimind_trl.data.tokenizer_corpus import default_corpus
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import FolderLockError, folder_lock, sha256_file, write_json_atomic, write_jsonl_atomic
from minimind_trl.run_folder import RunFolder, RunFolderConflict
from minimind_trl.subprocess_runner import CommandFailed, run_cli
from minimind_trl.targets import OutputTargetError, check_output_folder
from minimind_trl.trainer.recipe import RecipeError, load_recipe, recipe_sha256

CONDITIONS = ("grpo", "cispo", "dr_grpo", "gspo")
# --ablation: the 2x2's other two cells as recipe overrides (GRPO is z-score x per-sequence mean,
# Dr.GRPO centred x fixed L).
ABLATION_CONDITIONS = {
    "zscore_fixedL": ("objective.preset=dr_grpo", "objective.advantage=zscore"),
    "center_seqmean": ("objective.preset=grpo", "objective.advantage=center"),
}
INTERACTION = "zscore_seqmean=grpo,zscore_fixedL=zscore_fixedL,center_seqmean=center_seqmean,center_fixedL=dr_grpo"
RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes" / "demo"  # the repository checkout
TIMINGS_FILE = "timings.json"

# Wall seconds of the full demo on the reference machine (2 idle cores; docs/demo_results.md). An RL
# run costs ``rl_run_overhead + rollouts * rl_rollout`` (process start, model load, save; then each
# rollout of recipes/demo/rl.yaml: 24 prompts x 4 trajectories at T=0.7, K=1 update). rl_rollout is an
# estimate: 11.5 s per rollout measured on this project's 2-core session machine (4.2 s sampling +
# 7.3 s update), scaled by 0.64, the ratio of the previous recipe's reference figure to its time on
# that machine; ``eval_question`` is one checkpoint's evaluation per test question, the same way (62 s
# for 300 questions at batch 50 on that machine, less the ~10 s process start, x 0.64: about 0.15 s,
# so 90 s for the 600 test questions).
REFERENCE_SECONDS = {"pretrain": 447.0, "sft": 144.0, "rl_run_overhead": 13.0, "rl_rollout": 7.4,
                     "eval_question": 0.15, "summary": 17.0}
DEFAULT_BUDGET_MIN = 30.0
"""The full-size demo's time budget unless ``--budget`` or ``--full-rl`` says otherwise."""
MIN_BUDGET_ROLLOUTS = 2
MIN_BUDGET_SEEDS = 2


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
    rl_rollouts: int | None  # rollouts per RL run (each = K optimizer updates); None: the RL recipe's
    rl_seeds: int  # RL seeds per objective (all from the one SFT start)
    eval_batch_size: int
    rl_prompts: int | None = None  # prompts per rollout (x the group size); None: the recipe's
    budget_eval_questions: int | None = None  # a budget-fitted demo reads the first N test questions; None: all


SIZES = {
    "full": DemoSize(num_tasks=5000, val_size=300, test_size=600, drill_rows=8000, pretrain_epochs=2.0, sft_rows=800,
                     sft_epochs=1.0, rl_rollouts=None, rl_seeds=3, eval_batch_size=50, budget_eval_questions=150),
    "quick": DemoSize(num_tasks=160, val_size=10, test_size=20, drill_rows=200, pretrain_epochs=1.0, sft_rows=64,
                      sft_epochs=1.0, rl_rollouts=1, rl_seeds=2, eval_batch_size=20, rl_prompts=4),
}


@dataclass(frozen=True)
class RLRecipe:
    """What the demo reads from ``recipes/demo/rl.yaml`` (the one home of the demo's RL settings)."""

    updates_per_rollout: int  # training.num_iterations (K)
    group_size: int  # rollout.group_size
    rollouts: int  # training.max_steps / K


def rl_recipe() -> RLRecipe:
    """The RL recipe's K, group size and rollouts per run; its ``max_steps`` must be a multiple of K."""
    recipe = load_recipe(RECIPE_DIR / "rl.yaml")
    k, steps = recipe["training"]["num_iterations"], recipe["training"]["max_steps"]
    if steps % k:
        raise DemoError(f"{RECIPE_DIR / 'rl.yaml'}: training.max_steps={steps} is not a multiple of "
                        f"training.num_iterations={k}")
    return RLRecipe(updates_per_rollout=k, group_size=recipe["rollout"]["group_size"], rollouts=steps // k)

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
    """Run ``minimind-trl ARGS`` in a child process, its output teed to ``log_file`` (rewritten)."""
    _log("$ minimind-trl " + " ".join(args))
    try:
        run_cli(args, log_file, append=False, header=False, echo=True, check=True)
    except CommandFailed as exc:
        raise DemoError(str(exc)) from None


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
    return RunFolder(run_dir).state() == "completed"


def stage_data(out: Path, size: DemoSize, seed: int, resume: bool) -> Path:
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

    folder = out / "tokenizer"
    if _check_fresh(folder, resume, "tokenizer.json"):
        return folder
    corpus = out / "data" / "tokenizer_corpus.jsonl"
    write_jsonl_atomic(corpus, [{"text": doc} for doc in default_corpus(4000, 20240601, 20)])
    _run(["tokenizer", "build", "--corpus", str(corpus), "--output-dir", str(folder)], out / "logs" / "tokenizer.log")
    return folder


def stage_train(out: Path, name: str, recipe: Path, overrides: list[str], resume: bool) -> Path:
    """Train ``recipe`` with ``overrides`` into ``out/runs/NAME``. With ``resume``, a folder is
    reused by the sweep's rule (:meth:`RunFolder.reuse_action`): a finished run of the same resolved
    recipe (``recipe_sha256``) is kept, an interrupted one resumed, one of another recipe refused."""
    run_dir = out / "runs" / name
    try:
        resolved = load_recipe(recipe, overrides)
        action = RunFolder(run_dir).reuse_action(resolved, recipe_sha256(resolved))
    except RecipeError as exc:
        raise DemoError(f"{recipe}: {exc}") from None
    except RunFolderConflict as exc:
        raise DemoError(f"{exc}; a demo folder holds one recipe per run: use a new --output-dir") from None
    started = run_dir.is_dir() and any(run_dir.iterdir())
    if started and not resume:
        raise DemoError(f"{run_dir} is not empty; use --resume or a new --output-dir")
    if action == "skip":
        _log(f"{name}: already trained with this recipe, skipping")
        return RunFolder(run_dir).final_dir
    if action == "stopped":
        raise DemoError(f"{run_dir} stopped on a non-finite value (see its status.json); delete it to train again")
    args = ["train", str(recipe), "--output-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    if started:  # interrupted, or killed before its manifest: train resumes or clears it
        args.append("--resume")
    _run(args, out / "logs" / f"train_{name}.log")
    return RunFolder(run_dir).final_dir


def rl_seeds(seed: int, count: int) -> list[int]:
    """The RL seeds: ``seed``, ``seed + 1``, ... (the first is the pretraining/SFT seed too)."""
    if count < 1:
        raise DemoError(f"--seeds must be at least 1, got {count}")
    return [seed + i for i in range(count)]


def pretrain_overrides(data_dir: Path, tokenizer: Path, size: DemoSize, seed: int) -> list[str]:
    """``--set`` items of the pretraining run (``recipes/demo/pretrain.yaml``) on ``data_dir/pretrain``."""
    return [f"data.path={data_dir / 'pretrain'}", f"training.num_train_epochs={size.pretrain_epochs}",
            f"tokenizer.path={tokenizer}", f"seed={seed}"]


def sft_overrides(data_dir: Path, pretrained: Path, tokenizer: Path, size: DemoSize, seed: int) -> list[str]:
    """``--set`` items of the SFT run (``recipes/demo/sft.yaml``) from the ``pretrained`` checkpoint."""
    return [f"data.path={data_dir / 'sft'}", f"training.num_train_epochs={size.sft_epochs}", "model.preset=null",
            f"model.path={pretrained}", f"tokenizer.path={tokenizer}", f"seed={seed}"]


def rl_condition_overrides(objective: tuple[str, ...], rollouts: int | None = None,
                           prompts: int | None = None) -> list[str]:
    """One RL condition's own ``--set`` items (the sweep's ``Condition.overrides``): ``objective``'s,
    and only for a plan that differs from ``recipes/demo/rl.yaml`` (``--budget``, ``--quick``)
    ``rollouts`` x K updates and ``prompts`` per rollout. The start, data, tokenizer and seed come
    from :func:`rl_plan`; every other training setting is the recipe's."""
    recipe = rl_recipe()
    shape = []
    if prompts is not None:
        shape += [f"rollout.prompts_per_rollout={prompts}",
                  f"training.per_device_train_batch_size={prompts * recipe.group_size}"]
    if rollouts is not None and rollouts != recipe.rollouts:
        shape.append(f"training.max_steps={rollouts * recipe.updates_per_rollout}")
    return [*objective, *shape]


def rl_plan(out: Path, sft: Path, splits: Path, tokenizer: Path, table: dict[str, tuple[str, ...]],
            seeds: list[int], rollouts: int | None = None, prompts: int | None = None,
            resume: bool = False) -> sweep.Plan:
    """The RL stage as a sweep plan (:class:`minimind_trl.sweep.Plan`): every condition of ``table``
    x ``seeds`` trains ``recipes/demo/rl.yaml`` from ``sft`` into ``out/runs/<condition>-seed<S>``,
    is evaluated into ``out/eval/<condition>-seed<S>`` (the SFT start into ``out/eval/sft``), and the
    summary and plots go to ``out/summary`` and ``out/plots``. A run folder is reused by the sweep's
    rule (the recipe hash); without ``resume`` only new folders are accepted."""
    plan = sweep.Plan(protocol="demo", recipes_dir=str(RECIPE_DIR), data=str(splits), sft=str(sft), out=str(out),
                      seeds=list(seeds), overrides=[f"tokenizer.path={tokenizer}"],
                      baseline_eval=str(out / "eval" / sweep.BASELINE), summary_dir=str(out / "summary"),
                      plots_dir=str(out / "plots"), logs_dir=str(out / "logs"))
    for seed in seeds:
        for name, objective in table.items():
            label = f"{name}-seed{seed}"
            cond = sweep.Condition(name=name, seed=seed, recipe=str(RECIPE_DIR / "rl.yaml"),
                                   run_dir=str(out / "runs" / label), eval_dir=str(out / "eval" / label),
                                   overrides=rl_condition_overrides(objective, rollouts, prompts))
            try:
                action, conflict = sweep.reuse_action(plan, cond)
            except sweep.SweepError as exc:
                raise DemoError(str(exc)) from None
            if action is None:
                raise DemoError(f"{conflict}; a demo folder holds one recipe per run: use a new --output-dir")
            if action != "train" and not resume:
                raise DemoError(f"{cond.run_dir} is not empty; use --resume or a new --output-dir")
            cond.action = action
            plan.conditions.append(cond)
    return plan


def eval_settings(size: DemoSize, questions: int | None = None) -> dict:
    """The demo's frozen greedy evaluation (the sweep's settings dict): the test split (its first
    ``questions`` when fewer than the whole), 96 new tokens per turn, up to 3 tool turns."""
    limit = questions if questions is not None and questions < size.test_size else None
    return {"split": "test", "limit": limit, "batch_size": size.eval_batch_size, "max_new_tokens": 96,
            "max_tool_turns": 3, "device": "auto"}


def demo_runner(timings: Timings) -> sweep.Runner:
    """The sweep's runner for the demo: each command echoed (training bars included) and logged,
    its wall time recorded in ``timings.json`` under the log's name (``grpo-seed42.train``, ...)."""

    def run(args: list[str], log: Path, devices: str | None = None) -> int:
        _log("$ minimind-trl " + " ".join(args))
        started = time.time()
        rc = run_cli(args, log, append=False, header=False, echo=True)
        if rc == 0:
            timings.record(Path(log).stem, time.time() - started)
        return rc

    return run


def conditions(ablation: bool) -> dict[str, tuple[str, ...]]:
    """Condition name -> its recipe overrides: the four objectives, plus the 2x2 cells with ``ablation``."""
    table = {name: (f"objective.preset={name}",) for name in CONDITIONS}
    if ablation:
        table.update(ABLATION_CONDITIONS)
    return table


@dataclass(frozen=True)
class RLPlan:
    """What the RL stage runs: rollouts per run, RL seeds per condition and the test questions each
    checkpoint is evaluated on (the first N of the split)."""

    rl_rollouts: int
    rl_seeds: int
    eval_questions: int = SIZES["full"].test_size


def projected_rest_seconds(plan: RLPlan, n_conditions: int, speed_factor: float) -> float:
    """Seconds the RL, eval and summary stages should take on this machine: the reference stage
    costs (:data:`REFERENCE_SECONDS`) times ``speed_factor`` (this machine's pretrain + SFT seconds
    over the reference's)."""
    ref = REFERENCE_SECONDS
    runs = n_conditions * plan.rl_seeds
    rl = runs * (ref["rl_run_overhead"] + plan.rl_rollouts * ref["rl_rollout"])
    return speed_factor * (rl + (runs + 1) * plan.eval_questions * ref["eval_question"] + ref["summary"])


def fit_plan(wanted: RLPlan, n_conditions: int, speed_factor: float, seconds_left: float) -> RLPlan:
    """The largest plan within ``seconds_left``: first fewer rollouts per run (down to
    :data:`MIN_BUDGET_ROLLOUTS`), then fewer seeds (down to :data:`MIN_BUDGET_SEEDS`). When even the
    smallest does not fit, the smallest (the caller warns)."""
    seed_options = [wanted.rl_seeds] + ([MIN_BUDGET_SEEDS] if wanted.rl_seeds > MIN_BUDGET_SEEDS else [])
    smallest = wanted
    for seeds in seed_options:
        for rollouts in range(wanted.rl_rollouts, min(wanted.rl_rollouts, MIN_BUDGET_ROLLOUTS) - 1, -1):
            smallest = RLPlan(rollouts, seeds, wanted.eval_questions)
            if projected_rest_seconds(smallest, n_conditions, speed_factor) <= seconds_left:
                return smallest
    return smallest


class Timings:
    """``timings.json``: wall seconds per stage (kept across ``--resume``), the speed factor and the plan."""

    def __init__(self, out: Path):
        self.path = out / TIMINGS_FILE
        self.data: dict = {"stages": {}}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text(encoding="utf-8"))

    def record(self, stage: str, seconds: float) -> None:
        self.data["stages"][stage] = round(seconds, 1)
        self.save()

    def seconds(self, stage: str) -> float | None:
        return self.data["stages"].get(stage)

    def recorded_seconds(self) -> float:
        """Seconds of every stage recorded so far (this run and the runs it resumes)."""
        return float(sum(self.data["stages"].values()))

    def save(self) -> None:
        write_json_atomic(self.path, self.data)


def _timed(timings: Timings, stage: str, work):
    """Run ``work()``; record its wall time unless the stage was already done (skipped on resume)."""
    started = time.time()
    result, ran = work()
    if ran:
        timings.record(stage, time.time() - started)
    return result


def _plan_request(wanted: RLPlan, budget_min: float | None) -> str:
    """What a demo call asked of the RL stage, in words (for the resume check)."""
    fitted = f"fitted to --budget {budget_min:g}" if budget_min is not None else "not fitted to a budget"
    return (f"{wanted.rl_rollouts} rollouts x {wanted.rl_seeds} seeds per condition, {wanted.eval_questions} test "
            f"questions, {fitted}")


def _plan_rl(timings: Timings, size: DemoSize, num_seeds: int | None, n_conditions: int, budget_min: float | None,
             elapsed: float, full_size: bool) -> RLPlan:
    rollouts = rl_recipe().rollouts if size.rl_rollouts is None else size.rl_rollouts
    # A budget-fitted demo evaluates the first budget_eval_questions test questions (600 would take
    # about 20 of the 30 minutes); --full-rl evaluates them all.
    questions = size.test_size if budget_min is None else min(size.test_size,
                                                              size.budget_eval_questions or size.test_size)
    wanted = RLPlan(rollouts, size.rl_seeds if num_seeds is None else num_seeds, questions)
    if "plan" in timings.data:  # --resume: keep the plan the run started with, if this call asks for the same
        recorded = timings.data["plan"]
        asked_before = (RLPlan(**recorded["wanted"]), recorded.get("budget_min"))
        if asked_before != (wanted, budget_min):
            raise DemoError(f"{timings.path.parent} was started with {_plan_request(*asked_before)}; this call asks "
                            f"for {_plan_request(wanted, budget_min)}, and its RL runs would mix two plans: resume "
                            "with the options it started with, or use a new --output-dir")
        kept = RLPlan(**recorded["chosen"])
        _log(f"plan: {kept.rl_rollouts} rollouts x {kept.rl_seeds} seeds per condition, {kept.eval_questions} test "
             f"questions (kept from {timings.path})")
        return kept
    base = [timings.seconds("pretrain"), timings.seconds("sft")]
    # A resumed demo skipped the stages it had finished: count their recorded seconds, not this
    # process's wall time (the data and tokenizer stages, ~20 s, are not recorded).
    elapsed = max(elapsed, timings.recorded_seconds())
    plan, note = wanted, {}
    if full_size and None not in base:
        factor = sum(base) / (REFERENCE_SECONDS["pretrain"] + REFERENCE_SECONDS["sft"])
        rest = projected_rest_seconds(wanted, n_conditions, factor)
        _log(f"this machine took {sum(base):.0f} s for pretrain + SFT ({factor:.2f}x the reference machine); "
             f"the rest should take about {rest / 60:.0f} min (total about {(elapsed + rest) / 60:.0f} min)")
        note = {"speed_factor": round(factor, 3), "projected_total_s": round(elapsed + rest)}
        if budget_min is not None:
            plan = fit_plan(wanted, n_conditions, factor, budget_min * 60 - elapsed)
            fitted = elapsed + projected_rest_seconds(plan, n_conditions, factor)
            note["projected_total_s"] = round(fitted)
            if plan != wanted:
                updates = plan.rl_rollouts * rl_recipe().updates_per_rollout
                _log(f"--budget {budget_min:g} min: {plan.rl_rollouts} rollouts ({updates} updates) x "
                     f"{plan.rl_seeds} seeds per condition instead of {wanted.rl_rollouts} x {wanted.rl_seeds}, "
                     f"evaluated on the first {plan.eval_questions} of {size.test_size} test questions "
                     f"(--full-rl: all); projected total {fitted / 60:.0f} min")
            if fitted > budget_min * 60:
                _log(f"warning: even that is projected to take {fitted / 60:.0f} min, over the "
                     f"{budget_min:g}-minute budget (pretraining and SFT are not shortened); try --quick")
    timings.data["plan"] = {"wanted": dataclasses.asdict(wanted), "chosen": dataclasses.asdict(plan),
                            "budget_min": budget_min, **note}
    timings.save()
    return plan


def run_demo(out: Path, size: DemoSize, seed: int = 42, resume: bool = False, num_seeds: int | None = None,
             ablation: bool = False, budget_min: float | None = None) -> Path:
    """Run every stage into ``out``; returns the path of ``summary.md``. ``num_seeds`` RL seeds per
    condition (default: the size's); ``ablation`` adds the 2x2 cells; ``budget_min`` fits the RL
    stage into that many minutes (module docstring)."""
    try:  # never the root or home folder, under a file, or a run, split, eval or sweep folder
        check_output_folder(out, own=(TIMINGS_FILE,), reuse=lambda folder: True)
    except OutputTargetError as exc:
        raise DemoError(f"--output-dir: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "minimind-trl demo"):
        return _run_stages(out, size, seed, resume, num_seeds, ablation, budget_min)


def _run_stages(out: Path, size: DemoSize, seed: int, resume: bool, num_seeds: int | None, ablation: bool,
                budget_min: float | None) -> Path:
    """:func:`run_demo`'s stages, with the demo folder locked."""
    started = time.time()
    timings = Timings(out)
    splits = stage_data(out, size, seed, resume)
    tokenizer = stage_tokenizer(out, resume)

    def train(name: str, recipe: str, overrides: list[str]):
        def work():
            done = _training_done(out / "runs" / name) and resume
            return stage_train(out, name, RECIPE_DIR / recipe, overrides, resume), not done
        final = _timed(timings, name, work)
        _log(f"{name} done ({time.time() - started:.0f} s so far)")
        return final

    pretrained = train("pretrain", "pretrain.yaml", pretrain_overrides(out / "data", tokenizer, size, seed))
    sft = train("sft", "sft.yaml", sft_overrides(out / "data", pretrained, tokenizer, size, seed))
    table = conditions(ablation)
    plan = _plan_rl(timings, size, num_seeds, len(table), budget_min, time.time() - started, size == SIZES["full"])
    rl = rl_plan(out, sft, splits, tokenizer, table, rl_seeds(seed, plan.rl_seeds), plan.rl_rollouts,
                 size.rl_prompts, resume)
    try:
        failed, outputs = sweep.drive(rl, eval_settings(size, plan.eval_questions), demo_runner(timings),
                                      interaction=INTERACTION if ablation else None)
    except sweep.SweepError as exc:
        raise DemoError(str(exc)) from None
    if failed:
        bad = [f"{c.label} ({c.log or c.eval_dir})" for c in rl.conditions if c.action in ("failed", "stopped")
               or c.eval_action == "failed"]
        raise DemoError(f"the RL stage did not finish: {', '.join(bad) or outputs.get('failed', 'the baseline eval')}; "
                        f"logs in {rl.logs_dir}")
    summary_dir = Path(rl.summary_dir)
    # A resumed demo's total counts the recorded stages it skipped (not the data and tokenizer, ~20 s).
    timings.data["total_s"] = round(max(time.time() - started, timings.recorded_seconds()), 1)
    timings.save()
    _log(f"done in {time.time() - started:.0f} s; summary: {summary_dir / 'summary.md'}; plots: {rl.plots_dir}; "
         f"stage times: {timings.path}")
    return summary_dir / "summary.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minimind-trl demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/demo", help="demo folder (default: runs/demo)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the chain in a few minutes")
    parser.add_argument("--seed", type=int, default=42, help="data, pretraining and SFT seed; the first RL seed")
    parser.add_argument("--seeds", type=int, default=None,
                        help="RL seeds per objective (default 3; --quick: 2): seed, seed+1, ...")
    parser.add_argument("--ablation", action="store_true",
                        help="also train the 2x2 cells zscore_fixedL and center_seqmean; the summary reports "
                             "the interaction")
    parser.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                        help=f"fit the RL stage into this many minutes in all (fewer rollouts, then 2 seeds), "
                             f"projected from this machine's pretrain + SFT time (full size only; default "
                             f"{DEFAULT_BUDGET_MIN:g})")
    parser.add_argument("--full-rl", action="store_true",
                        help="run every rollout of recipes/demo/rl.yaml (about 12 min per RL run on 2 cores; "
                             "about 2.5 hours for the 12 runs) and evaluate on all 600 test questions, instead of "
                             "fitting the RL stage into the budget")
    parser.add_argument("--resume", action="store_true", help="skip finished stages, redo unfinished ones")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of minutes, got {args.budget}")
    if args.budget is not None and args.full_rl:
        parser.error("--budget and --full-rl exclude each other")
    if args.budget is None and not args.full_rl and not args.quick:
        args.budget = DEFAULT_BUDGET_MIN
    try:
        summary = run_demo(Path(args.output_dir), SIZES["quick" if args.quick else "full"], args.seed, args.resume,
                           args.seeds, args.ablation, args.budget)
    except (DemoError, FolderLockError) as exc:
        print(f"minimind-trl demo: {exc}", file=sys.stderr)
        return 2
    print()
    print(summary.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
