"""The CPU demo: the whole protocol, from nothing, on a laptop-class machine.

``minimind-trl demo --output-dir runs/demo`` runs one fixed experiment (:data:`DEFAULT`, the four
objectives under replay; ``--experiment`` names another of :data:`EXPERIMENTS`; the same arms,
seeds, rollouts and questions on every machine), one stage after another:

1. data      generate agent-math tasks (seed 42) and prepare audited train/val/test splits;
2. tokenizer build the 6400-id byte-level BPE tokenizer from project data (rendered gold
             trajectories of generated tasks and the package's general text) with
             ``minimind-trl tokenizer build``;
3. pretrain  next-token pretraining of a small MiniMind (``demo`` preset, ~5M parameters) from
             random init on short plain-text solutions of the training split mixed with
             number-copy drills (``minimind_trl.data.drills``), packed into 128-token blocks
             (``recipes/demo/pretrain.yaml``): the drills make the model learn to copy numbers
             (operands into calls, results into answers), which the solution texts alone do not
             teach a 5M model within the budget;
4. sft       SFT on gold tool-use trajectories of the training split (``recipes/demo/sft.yaml``,
             assistant-only loss);
5. rl        every arm of the experiment (a recipe of ``recipes/demo`` and its own ``--set`` items)
             from that same SFT checkpoint, with the same RL seeds (``--seeds``; one seed gives every
             arm the same data order and sampling streams);
6. eval      frozen greedy evaluation of the SFT checkpoint and every RL run on the test split;
7. summary   ``summary.md`` with per-seed results, paired-bootstrap CIs against SFT over questions
             and two-level CIs (training seeds, then questions), and PNG plots.

Every heavy stage is the public command a user would type (``minimind-trl train``, ``eval``,
``summarize``, ``plot``), run in a child process. Pretraining and SFT run with two threads (the
reference machine's; the same SFT start on every machine); the RL runs and evaluations run two at
a time (``--jobs``, default 2), one thread each, so a run's numbers do not depend on the machine's
core count.

Stages 3-7 are one plan of the sweep's planner and driver (:func:`sweep_plan`): pretraining and SFT
are its stages (:func:`stage_conditions`: conditions with no seed, trained first, SFT after
pretraining), every arm x seed a condition that starts from SFT (:func:`rl_conditions`), each
evaluated after its run, the SFT start into ``eval/sft``; runs in ``runs/<name>``, evaluations in
``eval/``, the summary in ``summary/`` and plots in ``plots/``. Before the first stage runs the
sweep's :func:`~minimind_trl.sweep.check_plan` checks the whole plan at once, with the sweep's
refusals: a run folder that ran another recipe (by its recipe hash) or is no run folder, a run made
from a stage that will train again, an evaluation folder of other weights or settings, or one beside
a run that is not complete. :func:`minimind_trl.sweep.drive` then runs it (summary and plots are
rewritten every time). The data and tokenizer stages stay the demo's own: they run no recipe, so
they have no run folder or recipe hash for the planner to compare; a finished one is kept on
``--resume``, a half-written one made again. Without ``--resume`` every stage's folder must be new.
``--quick`` shrinks every stage (a few minutes; it proves the chain, it learns nothing).
``--dry-run`` prints the plan and its time on the reference machine and writes nothing.

``--ablation`` adds the two missing cells of the 2x2 (advantage z-score / centred x reduction
per-sequence mean / fixed L), with the same RL seeds: ``zscore_fixedL`` (Dr.GRPO's fixed-L
reduction with GRPO's z-score advantage) and ``center_seqmean`` (GRPO's per-sequence mean with
Dr.GRPO's centred advantage), and the quick demo's other objectives (CISPO, GSPO) when they are
missing. The summary then reports the interaction
``(center_fixedL - center_seqmean) - (zscore_fixedL - zscore_seqmean)``.

Time. Every stage's wall time goes to ``timings.json``. Before it starts the demo prints its plan
and the time the plan took on the reference machine (:data:`REFERENCE_SECONDS`, 2 idle cores);
after pretraining and SFT it prints the projection for this machine (scaled by how long those two
stages took here). Nothing in the plan depends on the measured speed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minimind_trl import sweep
from minimind_trl.data import generate_tasks, prepare_splits
from minimind_trl.data.drills import copy_drills
from minimind_trl.data.gold import gold_file_rows
from minimind_trl.data.tokenizer_corpus import default_corpus
from minimind_trl.envs.tools import default_registry
from minimind_trl.eval.runner import EVAL_BATCH_SIZE
from minimind_trl.fsio import FolderLockError, folder_lock, sha256_file, write_json_atomic, write_jsonl_atomic
from minimind_trl.run_folder import RunFolder
from minimind_trl.subprocess_runner import CommandFailed, run_cli
from minimind_trl.targets import OutputTargetError, check_output_folder
from minimind_trl.trainer.recipe import load_recipe

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes" / "demo"  # the repository checkout
TIMINGS_FILE = "timings.json"
PRETRAIN_THREADS = 2  # pretraining and SFT: the reference machine's threads
# ...on one CPU slot of their own, whatever this machine has: the same SFT start everywhere
STAGE_SLOT = sweep.cpu_slots(1, cores=PRETRAIN_THREADS)[0]
STAGE_LOG = "train_"  # a stage's log is logs/train_<stage>.log; timings.json records its time as <stage>
# Under the demo folder: the splits, the tokenizer, and the SFT stage (runs/sft, whose final/ every RL run starts from).
SPLITS = Path("data", "splits")
TOKENIZER = "tokenizer"
SFT = "sft"
DEFAULT_JOBS = 2  # RL runs and evaluations side by side, one thread each


@dataclass(frozen=True)
class Arm:
    """One RL condition of the demo: ``recipes/demo/<recipe>`` with its own ``--set`` items."""

    name: str
    overrides: tuple[str, ...]
    recipe: str = "rl.yaml"


@dataclass(frozen=True)
class Experiment:
    """A fixed demo experiment: its arms, RL seeds and test questions, and what it shows (its time on
    the reference machine comes from :data:`REFERENCE_SECONDS` through :meth:`Plan.reference_seconds`)."""

    name: str
    shows: str
    arms: tuple[Arm, ...]
    seeds: int
    eval_questions: int


OBJECTIVES = ("grpo", "cispo", "dr_grpo", "gspo")
# --ablation: the 2x2's other two cells (GRPO is z-score x per-sequence mean, Dr.GRPO centred x fixed L).
ABLATION_CELLS = (
    ("zscore_fixedL", ("objective.preset=dr_grpo", "objective.advantage=zscore")),
    ("center_seqmean", ("objective.preset=grpo", "objective.advantage=center")),
)
INTERACTION = "zscore_seqmean=grpo,zscore_fixedL=zscore_fixedL,center_seqmean=center_seqmean,center_fixedL=dr_grpo"


def objective_arms(names: tuple[str, ...], recipe: str) -> tuple[Arm, ...]:
    """One arm per objective preset, all on ``recipes/demo/<recipe>``."""
    return tuple(Arm(name, (f"objective.preset={name}",), recipe) for name in names)


DEFAULT = Experiment(
    name="replay_four_objectives",
    shows=("the four objectives as four algorithms under replay (K = 4 updates per rollout as 4 minibatches, "
           "recipes/demo/rl_replay.yaml), each against the SFT start on the 600 test questions with two-level "
           "CIs over 3 RL seeds: on two starts each rose +0.03 to +0.05 (CIs above zero but GSPO's on the first, at "
           "zero); K = 1 GRPO gained +0.007 on the first start (not resolved), +0.042 on the second (as much as "
           "replay) and +0.055 on a third (replay +0.074 there) (docs/demo_results.md, replay study 4a)"),
    arms=objective_arms(OBJECTIVES, "rl_replay.yaml"),
    seeds=3,
    eval_questions=600,
)
K1 = Experiment(
    name="k1_two_algorithms",
    shows=("the two algorithms that differ at K = 1 (recipes/demo/rl.yaml): GRPO (z-scored advantage, "
           "per-sequence mean) and Dr.GRPO (centred advantage, fixed-length sum); at K = 1 every ratio is 1, so "
           "CISPO and GSPO would repeat GRPO's gradient. GRPO gained +0.04 on two starts and +0.01 to +0.02, not "
           "resolved, on two others (docs/demo_results.md)"),
    arms=objective_arms(("grpo", "dr_grpo"), "rl.yaml"),
    seeds=3,
    eval_questions=600,
)
PASSES = Experiment(
    name="replay_passes",
    shows=("GRPO and Dr.GRPO under replay as K = 4 passes over each whole rollout (recipes/demo/rl_replay_passes.yaml: "
           "every trajectory used 4 times, about twice the default's run time), against the SFT start on the 600 test "
           "questions with two-level CIs over 3 RL seeds: on the third demo start (--seed 21) +0.10 and +0.12, the "
           "largest gains the lab has measured, above the default's 4 minibatches there by +0.028 (resolved); on the "
           "second (--seed 7) GRPO +0.042, the same as the minibatches (docs/demo_results.md, replay study 4a-E)"),
    arms=objective_arms(("grpo", "dr_grpo"), "rl_replay_passes.yaml"),
    seeds=3,
    eval_questions=600,
)
EXPERIMENTS = {experiment.name: experiment for experiment in (DEFAULT, K1, PASSES)}
QUICK_SEEDS = 2

# Wall seconds of the stages on the reference machine (2 idle cores), measured by the default demo
# from nothing in 1:45:04 (docs/demo_results.md, "The default demo, timed on an idle machine"):
# pretraining and SFT with 2 threads; one evaluation of the 600 test questions (106-143 s, mean 114)
# while a second runs beside it (the demo runs them two at a time); summary and plots (20 s each).
REFERENCE_SECONDS = {"pretrain": 371.0, "sft": 117.0, "eval": 114.0, "summary": 40.0}
# One RL run of each demo recipe (process start, its 60 rollouts, saving), one thread
# beside another job. rl_replay.yaml (60 rollouts): 812-858 s in that run, mean 829; rl.yaml (60
# rollouts, K = 1): 60 x 11.5 s (benchmarks/cpu_speed.py, bf16 one-thread job beside another) + 20 s.
# rl_replay_passes.yaml: six runs of the replay study's 4a-E, two at a time (session 25), 1,530-1,653 s, mean 1,583.
RL_RUN_SECONDS = {"rl.yaml": 710.0, "rl_replay.yaml": 829.0, "rl_replay_passes.yaml": 1583.0}


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
    eval_batch_size: int
    rl_rollouts: int | None = None  # rollouts per RL run (each = K optimizer updates); None: the recipe's
    rl_prompts: int | None = None  # prompts per rollout (x the group size); None: the recipe's


SIZES = {
    "full": DemoSize(num_tasks=5000, val_size=300, test_size=600, drill_rows=8000, pretrain_epochs=2.0, sft_rows=800,
                     sft_epochs=1.0, eval_batch_size=EVAL_BATCH_SIZE),
    "quick": DemoSize(num_tasks=160, val_size=10, test_size=20, drill_rows=200, pretrain_epochs=1.0, sft_rows=64,
                      sft_epochs=1.0, eval_batch_size=20, rl_rollouts=1, rl_prompts=4),
}


@dataclass(frozen=True)
class RLRecipe:
    """What the demo reads from an RL recipe of ``recipes/demo`` (the one home of its settings)."""

    updates_per_rollout: int  # K = training.num_iterations (E passes) x training.minibatches (M)
    group_size: int  # rollout.group_size
    rollouts: int  # training.max_steps / K
    prompts: int | None  # rollout.prompts_per_rollout
    learning_rate: float
    passes: int = 1
    minibatches: int = 1


def rl_recipe(name: str = "rl.yaml") -> RLRecipe:
    """K, group size, rollouts per run, prompts and step of ``recipes/demo/NAME``; its ``max_steps``
    must be a multiple of K."""
    recipe = load_recipe(RECIPE_DIR / name)
    training = recipe["training"]
    passes, minibatches = training.get("num_iterations", 1), training.get("minibatches", 1)
    k, steps = passes * minibatches, training["max_steps"]
    if steps % k:
        raise DemoError(f"{RECIPE_DIR / name}: training.max_steps={steps} is not a multiple of K={k}")
    return RLRecipe(updates_per_rollout=k, group_size=recipe["rollout"]["group_size"], rollouts=steps // k,
                    prompts=recipe["rollout"]["prompts_per_rollout"], learning_rate=training["learning_rate"],
                    passes=passes, minibatches=minibatches)


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
    """Run ``minimind-trl ARGS`` (the tokenizer's build) in a child process on the stages' slot, its
    output teed to ``log_file`` (rewritten)."""
    _log("$ minimind-trl " + " ".join(args))
    try:
        run_cli(args, log_file, append=False, header=False, echo=True, check=True, env=sweep.slot_env(STAGE_SLOT))
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


def stage_data(out: Path, size: DemoSize, seed: int, resume: bool) -> None:
    splits, sft = out / SPLITS, out / "data" / "sft"
    if resume and _stage_done(splits, "manifest.json") and _stage_done(sft, "manifest.json"):
        return
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


def solution_text(gold: dict) -> str:
    """A gold trajectory as plain text: question, tool-call JSON, tool results, answer (one per line)."""
    parts = []
    for message in gold["conversations"][1:]:
        parts.append(message.get("tool_calls") or message.get("content") or "")
    return "\n".join(p for p in parts if p)


def stage_tokenizer(out: Path, resume: bool) -> None:
    """The project's tokenizer recipe (as ``scripts/build_default_tokenizer.py``): rendered gold
    trajectories of 4,000 generated tasks plus the package's general text, 6400 ids."""

    folder = out / TOKENIZER
    if _check_fresh(folder, resume, "tokenizer.json"):
        return
    corpus = out / "data" / "tokenizer_corpus.jsonl"
    write_jsonl_atomic(corpus, [{"text": doc} for doc in default_corpus(4000, 20240601, 20)])
    _run(["tokenizer", "build", "--corpus", str(corpus), "--output-dir", str(folder)], out / "logs" / "tokenizer.log")


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


def rl_condition_overrides(arm: Arm, rollouts: int | None = None, prompts: int | None = None) -> list[str]:
    """One arm's own ``--set`` items (the sweep's ``Condition.overrides``): its overrides and, only for a
    size that differs from its recipe (``--quick``), ``rollouts`` x K updates and ``prompts`` per
    rollout. The start, data, tokenizer and seed come from :func:`sweep_plan`; every other training
    setting is the recipe's."""
    recipe = rl_recipe(arm.recipe)
    shape = []
    if prompts is not None:
        shape += [f"rollout.prompts_per_rollout={prompts}",
                  f"training.per_device_train_batch_size={prompts * recipe.group_size // recipe.minibatches}"]
    if rollouts is not None and rollouts != recipe.rollouts:
        shape.append(f"training.max_steps={rollouts * recipe.updates_per_rollout}")
    return [*arm.overrides, *shape]


def stage_conditions(out: Path, size: DemoSize, seed: int) -> list[sweep.Condition]:
    """Pretraining and SFT as stages of the sweep's planner (conditions with no seed: run once, first,
    one after the other; every ``--set`` item their own): ``runs/pretrain``, then ``runs/sft`` from its
    ``final/``. Neither is evaluated as a condition: the SFT start's evaluation is the plan's baseline
    (``eval/sft``). Their logs keep the demo's names (``logs/train_<stage>.log``)."""
    data, tokenizer = out / "data", out / TOKENIZER
    pretrain = sweep.Condition(name="pretrain", seed=None, recipe=str(RECIPE_DIR / "pretrain.yaml"),
                               run_dir=str(out / "runs" / "pretrain"), eval_dir="",
                               overrides=pretrain_overrides(data, tokenizer, size, seed),
                               log=str(out / "logs" / f"{STAGE_LOG}pretrain.log"))
    pretrained = RunFolder(pretrain.run_dir).final_dir
    sft = sweep.Condition(name=SFT, seed=None, recipe=str(RECIPE_DIR / "sft.yaml"), run_dir=str(out / "runs" / SFT),
                          eval_dir="", overrides=sft_overrides(data, pretrained, tokenizer, size, seed),
                          after=pretrain.label, log=str(out / "logs" / f"{STAGE_LOG}{SFT}.log"))
    return [pretrain, sft]


def rl_conditions(out: Path, arms: tuple[Arm, ...], seeds: list[int], rollouts: int | None = None,
                  prompts: int | None = None) -> list[sweep.Condition]:
    """The RL stage's conditions: every arm x seed trains its recipe from the SFT stage's ``final/`` into
    ``out/runs/<arm>-seed<S>`` and is evaluated into ``out/eval/<arm>-seed<S>``."""
    conditions = []
    for seed in seeds:
        for arm in arms:
            label = f"{arm.name}-seed{seed}"
            conditions.append(sweep.Condition(name=arm.name, seed=seed, recipe=str(RECIPE_DIR / arm.recipe),
                                              run_dir=str(out / "runs" / label), eval_dir=str(out / "eval" / label),
                                              overrides=rl_condition_overrides(arm, rollouts, prompts), after=SFT))
    return conditions


def sweep_plan(out: Path, plan: Plan, seed: int = 42, resume: bool = False) -> sweep.Plan:
    """The whole demo as one plan of the sweep's planner, checked before any stage runs
    (:func:`minimind_trl.sweep.check_plan`): pretraining and SFT (:func:`stage_conditions`), every RL
    run (:func:`rl_conditions`), the SFT start's evaluation into ``out/eval/sft``, the summary and plots
    into ``out/summary`` and ``out/plots``. Every run folder is reused by the sweep's rule (the recipe
    hash), every evaluation folder by its weights and settings, and a run made from a stage that will
    train again is refused; without ``resume`` only new run folders are accepted."""
    size = plan.size
    whole = sweep.Plan(protocol="demo", recipes_dir=str(RECIPE_DIR), data=str(out / SPLITS),
                       sft=str(out / "runs" / SFT / "final"), out=str(out), seeds=list(plan.seeds),
                       overrides=[f"tokenizer.path={out / TOKENIZER}"], baseline_after=SFT,
                       baseline_eval=str(out / "eval" / sweep.BASELINE), summary_dir=str(out / "summary"),
                       plots_dir=str(out / "plots"), logs_dir=str(out / "logs"))
    whole.conditions = [*stage_conditions(out, size, seed),
                        *rl_conditions(out, plan.arms, plan.seeds, size.rl_rollouts, size.rl_prompts)]
    try:
        sweep.check_plan(whole, eval_settings(size), "a demo folder holds one recipe per run: use a new --output-dir")
    except sweep.SweepError as exc:
        raise DemoError(str(exc)) from None
    started = [cond.run_dir for cond in whole.conditions if RunFolder(cond.run_dir).state() != "new"]
    if started and not resume:
        raise DemoError(f"{started[0]} is not empty; use --resume or a new --output-dir")
    return whole


def eval_settings(size: DemoSize) -> dict:
    """The demo's frozen greedy evaluation (the sweep's settings dict): every test question, 96 new
    tokens per turn, up to 3 tool turns."""
    return {"split": "test", "limit": None, "batch_size": size.eval_batch_size, "max_new_tokens": 96,
            "max_tool_turns": 3, "device": "auto"}


def demo_runner(timings: Timings) -> sweep.Runner:
    """The sweep's runner for the demo: each command echoed (training bars included) and logged, on
    its slot's thread count (the stages' two, a ``--jobs`` slot's one), its wall time recorded in
    ``timings.json`` under the log's name (``grpo-seed42.train``, ``sft.eval``, ...), a stage's under its
    own (``pretrain``, ``sft``: logs ``train_pretrain``, ``train_sft``)."""

    def run(args: list[str], log: Path, devices: str | None = None) -> int:
        _log("$ minimind-trl " + " ".join(args))
        started = time.time()
        rc = run_cli(args, log, append=False, header=False, echo=True,
                     env=None if devices is None else sweep.slot_env(devices))
        if rc == 0:
            timings.record(Path(log).stem.removeprefix(STAGE_LOG), time.time() - started)
        return rc

    return run


def arms_of(experiment: Experiment, ablation: bool) -> tuple[Arm, ...]:
    """The experiment's arms, with ``ablation`` the 2x2's missing cells (and GRPO, Dr.GRPO if absent),
    on the recipe of the experiment's first arm."""
    arms = list(experiment.arms)
    if ablation:
        names, recipe = {arm.name for arm in arms}, experiment.arms[0].recipe
        arms += [arm for arm in objective_arms(("grpo", "dr_grpo"), recipe) if arm.name not in names]
        arms += [Arm(name, overrides, recipe) for name, overrides in ABLATION_CELLS if name not in names]
    return tuple(arms)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def slots_makespan(seconds: list[float], jobs: int) -> float:
    """Wall seconds of jobs taking ``seconds`` each, in this order, each started on the first free
    one of ``jobs`` slots (the sweep's ``in_slots``)."""
    free = [0.0] * jobs
    for duration in seconds:
        slot = free.index(min(free))
        free[slot] += duration
    return max(free)


@dataclass
class Plan:
    """What one ``minimind-trl demo`` call runs: the experiment, its arms (with ``--ablation``), the RL
    seeds, the rollouts and prompts of each run (None: the recipe's) and the jobs side by side."""

    experiment: Experiment
    size: DemoSize
    arms: tuple[Arm, ...]
    seeds: list[int]
    jobs: int
    quick: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.arms) * len(self.seeds)

    def reference_seconds(self) -> dict[str, float]:
        """Each stage's wall seconds on the reference machine (2 idle cores), from
        :data:`REFERENCE_SECONDS`: RL runs and evaluations share the ``jobs`` slots."""
        ref = REFERENCE_SECONDS
        runs = [RL_RUN_SECONDS[arm.recipe] for _ in self.seeds for arm in self.arms]  # rl_conditions' order
        evals = math.ceil((self.runs + 1) / self.jobs)
        return {"pretrain": ref["pretrain"], "sft": ref["sft"], "rl": slots_makespan(runs, self.jobs),
                "eval": evals * ref["eval"], "summary": ref["summary"]}

    def describe(self) -> str:
        """The plan in words (``--dry-run``, the start of every demo, the README's block)."""
        size, lines = self.size, []
        name = self.experiment.name + (" (the default)" if self.experiment is DEFAULT else "")
        lines.append(f"minimind-trl demo plan: {name}")
        lines.append(f"  shows: {self.experiment.shows}")
        lines.append(f"  1. data       {size.num_tasks:,} generated tasks -> train / {size.val_size} val / "
                     f"{size.test_size} test (seed {self.seeds[0]})")
        lines.append("  2. tokenizer  6,400-id byte-level BPE from project data")
        lines.append(f"  3. pretrain   recipes/demo/pretrain.yaml, {size.pretrain_epochs:g} epochs, "
                     f"{PRETRAIN_THREADS} threads")
        lines.append(f"  4. sft        recipes/demo/sft.yaml, {size.sft_rows} gold trajectories, "
                     f"{size.sft_epochs:g} epoch, {PRETRAIN_THREADS} threads")
        lines.append(f"  5. rl         {len(self.arms)} arms x {len(self.seeds)} seeds "
                     f"({', '.join(map(str, self.seeds))}) = {self.runs} runs, {self.jobs} at a time, 1 thread each:")
        width = max(len(arm.name) for arm in self.arms)
        for arm in self.arms:
            recipe = rl_recipe(arm.recipe)
            rollouts = recipe.rollouts if size.rl_rollouts is None else size.rl_rollouts
            prompts = recipe.prompts if size.rl_prompts is None else size.rl_prompts
            lines.append(f"       {arm.name:<{width}}  recipes/demo/{arm.recipe} {' '.join(arm.overrides)}: "
                         f"K = {recipe.updates_per_rollout} ({_count(recipe.passes, 'pass', 'passes')} x "
                         f"{_count(recipe.minibatches, 'minibatch', 'minibatches')}), "
                         f"{rollouts} rollouts of {prompts} prompts x {recipe.group_size}, lr {recipe.learning_rate:g}")
        decoding = eval_settings(size)
        lines.append(f"  6. eval       the SFT start and every run on the {size.test_size} test questions "
                     f"(greedy, {decoding['max_new_tokens']} tokens per turn, {decoding['max_tool_turns']} tool turns)")
        lines.append(f"  7. summary    paired bootstrap against SFT, two-level CIs over the {len(self.seeds)} seeds; "
                     "plots")
        if self.quick:
            lines.append("  time: a few minutes (--quick proves the chain; it learns nothing)")
        else:
            seconds = self.reference_seconds()
            parts = ", ".join(f"{k} {v / 60:.0f} min" for k, v in seconds.items())
            lines.append(f"  time on the reference machine (2 idle cores): {sum(seconds.values()) / 60:.0f} min "
                         f"({parts})")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def make_plan(quick: bool = False, seed: int = 42, num_seeds: int | None = None, ablation: bool = False,
              jobs: int = DEFAULT_JOBS, experiment: str = DEFAULT.name) -> Plan:
    """The plan a ``minimind-trl demo`` call runs; reads nothing of the machine (its speed, cores,
    threads, load) so every machine that types the same command runs the same experiment. ``quick``
    runs the named experiment's arms at tiny sizes with :data:`QUICK_SEEDS` seeds."""
    if experiment not in EXPERIMENTS:
        raise DemoError(f"--experiment {experiment!r}: not one of {', '.join(EXPERIMENTS)}")
    chosen = EXPERIMENTS[experiment]
    if quick:
        chosen = Experiment(name="quick", shows=f"the chain of {chosen.name} runs end to end (a tiny model learns "
                            "nothing in one rollout)", arms=chosen.arms, seeds=QUICK_SEEDS, eval_questions=20)
    experiment = chosen
    if jobs < 1:
        raise DemoError(f"--jobs must be at least 1, got {jobs}")
    seeds = rl_seeds(seed, experiment.seeds if num_seeds is None else num_seeds)
    plan = Plan(experiment, SIZES["quick" if quick else "full"], arms_of(experiment, ablation), seeds, jobs, quick)
    if num_seeds is not None and num_seeds != experiment.seeds:
        plan.notes.append(f"--seeds {num_seeds}: the default experiment runs {experiment.seeds}")
    if ablation:
        plan.notes.append("--ablation: the 2x2's cells; the summary reports the interaction")
    return plan


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


def run_demo(out: Path, plan: Plan, seed: int = 42, resume: bool = False) -> Path:
    """Run every stage of ``plan`` into ``out``; returns the path of ``summary.md``."""
    try:  # never the root or home folder, under a file, or a run, split, eval or sweep folder
        check_output_folder(out, own=(TIMINGS_FILE,), reuse=lambda folder: True)
    except OutputTargetError as exc:
        raise DemoError(f"--output-dir: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "minimind-trl demo"):
        return _run_stages(out, plan, seed, resume)


def _check_recorded_plan(timings: Timings, plan: Plan) -> None:
    """A resumed demo runs the plan it started with: the arms, seeds and size are recorded in
    ``timings.json``; another plan (other ``--seeds``, ``--ablation``, ``--quick``) is refused."""
    asked = {"experiment": plan.experiment.name, "arms": [a.name for a in plan.arms], "seeds": plan.seeds}
    recorded = timings.data.get("plan")
    if recorded is not None and {k: recorded.get(k) for k in asked} != asked:
        raise DemoError(f"{timings.path.parent} was started with {recorded}; this call asks for {asked}, and its "
                        "runs would mix two plans: resume with the options it started with, or use a new --output-dir")
    timings.data["plan"] = {**asked, "jobs": plan.jobs, "reference_seconds": plan.reference_seconds()}
    timings.save()


def _run_stages(out: Path, plan: Plan, seed: int, resume: bool) -> Path:
    """:func:`run_demo`'s stages, with the demo folder locked: the whole plan is checked first
    (:func:`sweep_plan`), then the data and tokenizer are made and the sweep's driver runs the rest."""
    started = time.time()
    size = plan.size
    timings = Timings(out)
    _check_recorded_plan(timings, plan)
    print(plan.describe(), flush=True)
    whole = sweep_plan(out, plan, seed, resume)
    stage_data(out, size, seed, resume)
    stage_tokenizer(out, resume)
    ablation = {name for name, _ in ABLATION_CELLS} <= {arm.name for arm in plan.arms}
    try:
        failed, outputs = sweep.drive(whole, eval_settings(size), demo_runner(timings),
                                      sweep.cpu_slots(plan.jobs, cores=plan.jobs),
                                      interaction=INTERACTION if ablation else None, stage_slot=STAGE_SLOT,
                                      after_stages=None if plan.quick else lambda: _project(timings, plan))
    except sweep.SweepError as exc:
        raise DemoError(str(exc)) from None
    if failed:
        bad = [f"{c.label} ({c.log or c.eval_dir})" for c in whole.conditions if c.action in ("failed", "stopped")
               or c.eval_action == "failed"]
        raise DemoError(f"the demo did not finish: {', '.join(bad) or outputs.get('failed', 'the baseline eval')}; "
                        f"logs in {whole.logs_dir}")
    summary_dir = Path(whole.summary_dir)
    # A resumed demo's total counts the recorded stages it skipped (not the data and tokenizer, ~20 s).
    timings.data["total_s"] = round(max(time.time() - started, timings.recorded_seconds()), 1)
    timings.save()
    _log(f"done in {time.time() - started:.0f} s; summary: {summary_dir / 'summary.md'}; plots: {whole.plots_dir}; "
         f"stage times: {timings.path}")
    return summary_dir / "summary.md"


def _project(timings: Timings, plan: Plan) -> None:
    """After pretraining and SFT: the rest's projected time on this machine, scaled by how long those
    two stages took here against the reference machine (printed and recorded; the plan is unchanged)."""
    base = [timings.seconds("pretrain"), timings.seconds("sft")]
    if None in base:
        return
    ref = plan.reference_seconds()
    factor = sum(base) / (ref["pretrain"] + ref["sft"])
    rest = factor * (ref["rl"] + ref["eval"] + ref["summary"])
    _log(f"this machine took {sum(base):.0f} s for pretrain + SFT ({factor:.2f}x the reference machine); the rest "
         f"should take about {rest / 60:.0f} min")
    timings.data["projection"] = {"speed_factor": round(factor, 3), "rest_s": round(rest)}
    timings.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minimind-trl demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/demo", help="demo folder (default: runs/demo)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the chain in a few minutes")
    parser.add_argument("--seed", type=int, default=42, help="data, pretraining and SFT seed; the first RL seed")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"RL seeds per arm (default {DEFAULT.seeds}; --quick: {QUICK_SEEDS}): seed, seed+1, ...")
    parser.add_argument("--experiment", default=DEFAULT.name, choices=sorted(EXPERIMENTS),
                        help=f"which fixed experiment (default {DEFAULT.name}; {K1.name}: the K = 1 comparison of "
                             f"GRPO and Dr.GRPO, about an hour; {PASSES.name}: GRPO and Dr.GRPO with K = 4 passes, "
                             "about 1 h 40 min)")
    parser.add_argument("--ablation", action="store_true",
                        help="also train the 2x2 cells zscore_fixedL and center_seqmean; the summary reports "
                             "the interaction")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"RL runs and evaluations side by side, one thread each (default {DEFAULT_JOBS})")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its time, write nothing, exit")
    parser.add_argument("--resume", action="store_true", help="skip finished stages, redo unfinished ones")
    args = parser.parse_args(argv)
    try:
        plan = make_plan(args.quick, args.seed, args.seeds, args.ablation, args.jobs, args.experiment)
        if args.dry_run:
            print(plan.describe())
            return 0
        summary = run_demo(Path(args.output_dir), plan, args.seed, args.resume)
    except (DemoError, FolderLockError) as exc:
        print(f"minimind-trl demo: {exc}", file=sys.stderr)
        return 2
    print()
    print(summary.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
