"""``minimind-trl sweep``: run a protocol's conditions, evaluate them, summarise, plot.

::

    minimind-trl sweep PROTOCOL --data SPLIT_DIR --sft CHECKPOINT --output-dir OUT
        [--seeds 42,43] [--conditions grpo,cispo] [--set KEY=VALUE ...] [--recipes DIR]
        [--launcher "torchrun --nproc_per_node 4"] [--eval-limit N] [--eval-batch-size 25]
        [--eval-max-new-tokens 256] [--eval-max-tool-turns 3] [--eval-device auto]
        [--eval-split test] [--n-resamples 10000] [--jobs N | --gpus IDS] [--dry-run]

``PROTOCOL`` is ``e1`` (GRPO, CISPO, Dr.GRPO, GSPO on MiniMind-3), ``e2`` (the two missing cells
of the {z-score, centred} x {sequence mean, fixed L} 2x2), ``e3`` (the four objectives on
MiniMind-3-MoE; give the MoE SFT checkpoint as ``--sft``) or ``e4`` (GRPO on a reward model),
whose recipes are ``RECIPES/<protocol>/<condition>.yaml`` (``--recipes``, default ``./recipes``
when it has the protocol's folder, else the ``recipes/`` folder beside this package); or the path
of a folder of recipe YAML files, each file one condition (named by its stem, run in name order).

For every seed, then every condition, the sweep trains the recipe in a fresh process::

    minimind-trl train RECIPE --output-dir OUT/runs/<protocol>/<condition>-seed<S>
        --set data.path=SPLIT_DIR --set model.path=CHECKPOINT --set model.preset=null
        --set model.native=null --set model.config={} [--set model.config.attn_implementation=A]
        --set seed=S [--set KEY=VALUE ...]

(A when the recipe's own ``model.config`` names the attention kernel, which holds for any start;
the user's ``--set`` items come last and win; the command is prefixed by ``--launcher`` for
multi-process training, e.g. ``"accelerate launch --config_file accelerate_configs/multi_gpu.yaml"``:
``LAUNCHER -m minimind_trl.cli train ...``), then evaluates the SFT baseline and every completed
run's ``final/`` greedily on the test split (``minimind-trl eval``), then writes ``minimind-trl
summarize`` (baseline ``sft``; for e2 also the 2x2 interaction, when the e1 ``grpo`` and
``dr_grpo`` cells of the same seeds were evaluated in the same OUT) and ``minimind-trl plot``.

Layout of ``OUT``::

    runs/<protocol>/<condition>-seed<S>/   run folders (see docs/recipes.md)
    eval/<protocol>/sft/                   the SFT baseline's eval folder
    eval/<protocol>/<condition>-seed<S>/   eval folders (records.jsonl, metrics.json, eval_manifest.json)
    summary/<protocol>/                    summary.json / .md, failures (rewritten by every sweep)
    plots/<protocol>/                      PNG figures (rewritten by every sweep)
    eval|summary|plots/<protocol>@<split>/ the same for --eval-split train or val (a second sweep of the
                                           same runs with another split evaluates them there too)
    logs/<protocol>/<name>.log             output of every command the sweep ran (appended)
    sweep-<protocol>.json                  what the last sweep did: commands, actions, exit codes, times

Conditions train one after another, each in a fresh process, then every evaluation runs. With
``--gpus 0,1,2,3`` they run side by side instead, one per GPU slot (``0,1:2,3``: two slots of two
GPUs, for a ``--launcher`` that starts several processes), each child seeing only its slot
through ``CUDA_VISIBLE_DEVICES``; the evaluations share the slots the same way, and the summary
and plots follow on the CPU. With ``--jobs N`` they run N at a time on the CPU instead, each child
with ``cores // N`` threads (``OMP_NUM_THREADS`` and the other thread variables, so side-by-side
jobs never oversubscribe the cores) and its own log; a failed job starts no new one. A job's outputs
are identical to the same job run alone with that thread count (tested).

Reruns are safe. A run folder whose ``status.json`` says ``completed`` is skipped; one with a
manifest but no completed status (killed or interrupted) is resumed with ``--resume`` from its
newest checkpoint; one that stopped on a non-finite value is reported and left alone. A run folder
is reused only if its manifest's ``recipe_sha256`` equals the recipe the sweep would run now (same
recipe file, data, checkpoint, seed and ``--set`` values); otherwise the sweep refuses before
running anything. That rule is :meth:`~minimind_trl.run_folder.RunFolder.reuse_action`. A non-empty
run folder without a manifest is refused too, unless it holds only what ``train`` writes before its
manifest (``initial_model/``), which is removed. Eval folders are built by ``eval`` in
``.staging-<name>/`` and committed whole (:mod:`minimind_trl.eval.folder`); a finished one is reused
only if it evaluated the same weights (SHA-256) with the same decoding settings. Run and eval
folders are read through :class:`~minimind_trl.run_folder.RunFolder` and
:class:`~minimind_trl.eval.folder.EvalFolder`; every command runs through
:func:`minimind_trl.subprocess_runner.run_cli`. Summary and plots are derived files and are
rewritten every time. ``--conditions`` limits what is trained and evaluated; the summary still
includes the protocol's other conditions already evaluated in OUT for these seeds, when their run
matches the recipe the sweep would run (same checks as above).

One planner and one driver serve the sweep and the demo: :func:`check_plan` decides every
condition's action and makes every refusal above before anything runs, and :func:`drive` runs the
plan. A plan may hold *stages*, conditions with no seed that the others start from (the demo's
pretraining and SFT; ``Condition.after`` names the stage, ``Plan.baseline_after`` the one that makes
the start): stages train first, one after another, and what follows a stage that did not complete is
not trained; a finished run made from a stage that will train again, and anything after a stage that
stopped on a non-finite value, are refused with the rest.

``--dry-run`` runs nothing: per condition it prints the action, the exact ``minimind-trl train``
command and the resolved recipe keys that differ from the protocol's first condition, then the
pre-flight checks (:func:`preflight`: plugins such as E4's reward model, the tokenizer against the
start folder's, a dense start for the MoE protocol), exit 2 when any fails. OUT is locked for the
life of a sweep (a second sweep into it exits 2 naming the first).

Every evaluation and launch setting (``--eval-*``, ``--eval-device``, ``--n-resamples``, ``--gpus``,
``--launcher``) is checked before anything runs, with eval's and summarize's own rules
(:func:`check_eval_settings`, :func:`check_launch`), and OUT by the output-target rule
(:mod:`minimind_trl.targets`: never a run, split, eval or demo folder, the root or home folder).

Exit status: 0 when every condition trained and was evaluated, 1 when some command failed (the
others still ran; see the log named in the message), 2 for bad arguments, a conflicting or locked
OUT, or a failed pre-flight check.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import queue
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from minimind_trl.eval import stats
from minimind_trl.eval.errors import EvalError
from minimind_trl.eval.folder import EvalFolder
from minimind_trl.eval.runner import EVAL_BATCH_SIZE, EvalSettings, resolve_device
from minimind_trl.fsio import FolderLockError, folder_lock, write_json_atomic
from minimind_trl.modeling.checkpoints import resolve_checkpoint
from minimind_trl.run_folder import RunFolder, RunFolderConflict
from minimind_trl.subprocess_runner import run_cli
from minimind_trl.targets import OutputTargetError, check_output_folder
from minimind_trl.trainer import build
from minimind_trl.trainer.recipe import RecipeError, load_recipe, recipe_sha256
from minimind_trl.trainer.recipe_schema import PATH_MODEL_CONFIG_KEYS

PROTOCOLS: dict[str, tuple[str, ...]] = {
    "e1": ("grpo", "cispo", "dr_grpo", "gspo"),
    "e2": ("zscore_fixed_length", "center_seq_mean"),
    "e3": ("grpo", "cispo", "dr_grpo", "gspo"),
    "e4": ("grpo_reward_model",),
}
# e2's 2x2 cells: summarize --interaction cell -> (protocol, condition)
E2_CELLS = {
    "zscore_seqmean": ("e1", "grpo"),
    "zscore_fixedL": ("e2", "zscore_fixed_length"),
    "center_seqmean": ("e2", "center_seq_mean"),
    "center_fixedL": ("e1", "dr_grpo"),
}
BASELINE = "sft"
PREFIX = "minimind-trl sweep"
_IGNORED_DECODING = ("batch_size", "device", "greedy", "dtype")  # run-time choices and fixed values: not compared

Runner = Callable[..., int]
"""``run(args, log) -> exit code`` runs ``minimind-trl ARGS``; with ``--gpus`` it is called as
``run(args, log, devices="0,1")``, the child seeing only those GPUs (``CUDA_VISIBLE_DEVICES``)."""


class SweepError(RuntimeError):
    """Bad arguments or an output folder the sweep must not touch."""


@dataclass
class Condition:
    """One (condition, seed) of the sweep and what happened to it.

    A condition with no seed is a *stage* (the demo's pretraining and SFT): it runs once, before the
    seeded conditions, on its own slot; its ``--set`` items are all its own (it does not start from
    the plan's ``sft``), its label is its name, and it has no evaluation of its own (``eval_dir``
    empty). ``after`` names the stage whose ``final/`` a condition starts from: it trains only once
    that stage completed, and the planner (:func:`check_plan`) refuses to reuse its run when that
    stage will train again."""

    name: str
    seed: int | None
    recipe: str
    run_dir: str
    eval_dir: str
    overrides: list[str] = field(default_factory=list)  # this condition's own --set items, after the plan's
    after: str = ""  # label of the stage it starts from (the demo: SFT after pretraining, RL runs after SFT)
    recipe_sha256: str = ""
    action: str = ""  # train | resume | skip | stopped | failed | blocked; other | stale (outside --conditions)
    rc: int | None = None
    seconds: float | None = None
    eval_action: str = ""  # eval | skip | failed | none
    eval_rc: int | None = None
    log: str = ""  # the train command's log: logs/<label>.train.log unless the plan names one

    @property
    def label(self) -> str:
        return self.name if self.seed is None else f"{self.name}-seed{self.seed}"


@dataclass
class Plan:
    """What a sweep runs and where it writes. The four paths default to the sweep's layout (module
    docstring); the demo names its own (:mod:`minimind_trl.demo`)."""

    protocol: str
    recipes_dir: str
    data: str
    sft: str
    out: str
    seeds: list[int]
    overrides: list[str]  # --set items of every condition
    conditions: list[Condition] = field(default_factory=list)  # every condition x seed of the protocol
    baseline_eval: str = ""  # OUT/eval/<protocol>/sft
    baseline_after: str = ""  # label of the stage that trains ``sft`` (the demo's); empty: ``sft`` is given
    summary_dir: str = ""  # OUT/summary/<protocol>
    plots_dir: str = ""  # OUT/plots/<protocol>
    logs_dir: str = ""  # OUT/logs/<protocol>

    def __post_init__(self) -> None:
        self.baseline_eval = self.baseline_eval or str(Path(self.out, "eval", self.protocol, BASELINE))
        self.summary_dir = self.summary_dir or str(Path(self.out, "summary", self.protocol))
        self.plots_dir = self.plots_dir or str(Path(self.out, "plots", self.protocol))
        self.logs_dir = self.logs_dir or str(Path(self.out, "logs", self.protocol))


# ----------------------------------------------------------------------------------- arguments


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds, got {text!r}")
    return seeds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _gpu_slots(text: str) -> list[str]:
    """``--gpus``: comma-separated ids are one-GPU slots; ``:`` separates multi-GPU slots."""
    groups = text.split(":") if ":" in text else text.split(",")
    slots, seen = [], []
    for group in groups:
        ids = [part.strip() for part in group.split(",")]
        if not group.strip() or not all(part.isdigit() for part in ids):
            raise argparse.ArgumentTypeError(f"expected GPU ids like 0,1,2,3 or 0,1:2,3, got {text!r}")
        seen += ids
        slots.append(",".join(ids))
    if len(set(seen)) != len(seen):
        raise argparse.ArgumentTypeError(f"a GPU id appears twice in {text!r}")
    return slots


def in_slots(jobs: list[Callable[[str | None], Any]], slots: list[str] | None) -> None:
    """Run each ``job(slot)``: one after another with slot None, or side by side with at most one
    job per slot at a time (threads; each job waits for a free slot). An exception in a job, or
    Ctrl-C, starts no further job; it is raised once the running ones have returned (a Ctrl-C
    reaches their child processes too)."""
    if not slots:
        for job in jobs:
            job(None)
        return
    free: queue.Queue[str] = queue.Queue()
    for slot in slots:
        free.put(slot)
    stop = threading.Event()

    def work(job):
        slot = free.get()
        try:
            if not stop.is_set():
                return job(slot)
            return None
        except BaseException:
            stop.set()
            raise
        finally:
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=len(slots))
    try:
        for future in [pool.submit(work, job) for job in jobs]:
            future.result()
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


CPU_SLOT = "cpu:"  # a --jobs slot: "cpu:0", "cpu:1", ... (one job, its share of the cores)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def cpu_slots(jobs: int, cores: int | None = None) -> list[str]:
    """``--jobs N``: N CPU slots, each job with ``cores // N`` threads (at least 1)."""
    cores = usable_cores() if cores is None else cores
    threads = max(cores // jobs, 1)
    return [f"{CPU_SLOT}{i}:{threads}" for i in range(jobs)]


def slot_threads(slot: str) -> int | None:
    """The thread count of a ``--jobs`` slot (None for a GPU slot)."""
    return int(slot.rsplit(":", 1)[1]) if slot.startswith(CPU_SLOT) else None


def slot_name(slot: str) -> str:
    """A slot in words: ``CPU slot 0 (1 thread)`` or ``GPU 2,3``."""
    threads = slot_threads(slot)
    if threads is None:
        return f"GPU {slot}"
    return f"CPU slot {slot[len(CPU_SLOT):].split(':')[0]} ({threads} thread{'s' if threads > 1 else ''})"


def slot_env(slot: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child on ``slot``. A CPU slot (``--jobs``) sets the thread count of
    every math library (OpenMP, MKL, OpenBLAS), so side-by-side jobs do not oversubscribe the
    cores; a GPU slot (``--gpus``) shows the child only its GPUs (:func:`visible_devices`). Both give
    each slot a rendezvous port of its own (:func:`slot_port`)."""
    env = dict(os.environ if base is None else base)
    threads = slot_threads(slot)
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(slot)
    port = str(slot_port(slot))
    env["MASTER_PORT"] = env["PET_MASTER_PORT"] = port
    return env


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def visible_devices(slot: str, parent: str | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child on ``slot`` (ids as ``--gpus`` gives them): ids index
    the GPUs this process sees, so under a scheduler that set ``CUDA_VISIBLE_DEVICES=4,5`` slot
    ``0`` is physical GPU 4. ``parent`` defaults to this process's ``CUDA_VISIBLE_DEVICES``."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES") if parent is None else parent
    if not parent:
        return slot
    visible = [part.strip() for part in parent.split(",")]
    ids = [int(part) for part in slot.split(",")]
    if max(ids) >= len(visible):
        raise SweepError(f"--gpus {slot}: this process sees only {len(visible)} GPU(s) (CUDA_VISIBLE_DEVICES={parent})")
    return ",".join(visible[i] for i in ids)


def slot_port(slot: str) -> int:
    """A rendezvous port of its own for each slot: 29500 + 1 + the slot's first GPU id (slots share
    no id), 29701 + i for CPU slot i. ``{port}`` in ``--launcher`` is replaced by it; torchrun reads
    ``PET_MASTER_PORT``."""
    if slot.startswith(CPU_SLOT):
        return 29701 + int(slot[len(CPU_SLOT):].split(":")[0])
    return 29501 + int(slot.split(",")[0])


def _call(run: Runner, args: list[str], log: Path, devices: str | None) -> int:
    return run(args, log) if devices is None else run(args, log, devices=devices)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PREFIX,
        description="Train a protocol's conditions one after another (each in a fresh process), evaluate them and "
                    "the SFT baseline on the test split, then summarise and plot. Reruns skip completed "
                    "conditions and resume interrupted ones.",
        epilog="Exit status: 0 all done, 1 some command failed, 2 bad arguments or a conflicting output folder.",
    )
    parser.add_argument("protocol",
                        help=f"{', '.join(PROTOCOLS)}, or a folder of recipe YAML files (one per condition)")
    parser.add_argument("--data", required=True, help="split folder (train/val/test.jsonl + manifest.json)")
    parser.add_argument("--sft", required=True, help="Hub-format start checkpoint (an E0 SFT run's final/)")
    parser.add_argument("--output-dir", required=True, help="sweep folder (runs/, eval/, summary/, plots/, logs/)")
    parser.add_argument("--seeds", type=_seeds, default=[42], help="comma-separated seeds (default: 42)")
    parser.add_argument("--conditions", default=None, help="comma-separated subset of the protocol's conditions")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="recipe override for every condition (repeatable), as for minimind-trl train")
    parser.add_argument("--recipes", default=None, help="recipes root holding <protocol>/<condition>.yaml")
    parser.add_argument("--launcher", default=None,
                        help='prefix of the train command, e.g. "torchrun --nproc_per_node 4" '
                             '(then runs -m minimind_trl.cli)')
    parser.add_argument("--gpus", type=_gpu_slots, default=None, metavar="IDS",
                        help='run conditions (and evaluations) side by side, one per GPU slot: "0,1,2,3" is four '
                             'one-GPU slots, "0,1:2,3" two two-GPU slots (with --launcher for several processes '
                             "per condition; {port} in it becomes the slot's own rendezvous port); each child sees "
                             "only its slot (CUDA_VISIBLE_DEVICES). Default: one after another")
    parser.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                        help="run N conditions (and evaluations) side by side on the CPU, each child with "
                             "cores // N threads (OMP_NUM_THREADS) and its own log; a failed job starts no new one. "
                             "Default: one after another with every core")
    parser.add_argument("--eval-split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate only the first N questions")
    parser.add_argument("--eval-batch-size", type=int, default=EVAL_BATCH_SIZE)
    parser.add_argument("--eval-max-new-tokens", type=int, default=256, help="per assistant turn")
    parser.add_argument("--eval-max-tool-turns", type=int, default=3)
    parser.add_argument("--eval-device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--n-resamples", type=int, default=None,
                        help="bootstrap resamples (summarize's default if unset)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each condition's action, command and resolved differences, run the pre-flight "
                             "checks, and exit")
    return parser


def _default_recipes_root(protocol: str) -> Path:
    local = Path("recipes")
    if (local / protocol).is_dir():
        return local
    return Path(__file__).resolve().parent.parent / "recipes"


def resolve_conditions(protocol: str, recipes: str | None,
                       subset: str | None) -> tuple[str, Path, list[tuple[str, Path]]]:
    """(protocol name, recipes folder, [(condition, recipe file)]) of a protocol name or a folder."""
    given = Path(protocol)
    if given.is_dir():
        name, folder = given.resolve().name, given
        found = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        conditions = [(p.stem, p) for p in found]
        if not conditions:
            raise SweepError(f"{folder} holds no recipe (*.yaml)")
    elif protocol in PROTOCOLS:
        name = protocol
        folder = (Path(recipes) if recipes else _default_recipes_root(protocol)) / protocol
        conditions = [(c, folder / f"{c}.yaml") for c in PROTOCOLS[protocol]]
        missing = [str(p) for _, p in conditions if not p.is_file()]
        if missing:
            raise SweepError(f"protocol {protocol}: recipe(s) not found: {', '.join(missing)} (see --recipes)")
    else:
        raise SweepError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)} or a folder of recipes")
    if BASELINE in [c for c, _ in conditions]:
        raise SweepError(f"a condition may not be called {BASELINE!r} (the baseline's name)")
    if subset:
        wanted = [c.strip() for c in subset.split(",") if c.strip()]
        known = [c for c, _ in conditions]
        unknown = [c for c in wanted if c not in known]
        if unknown or not wanted:
            raise SweepError(f"--conditions: unknown condition(s) {unknown}; {name} has {known}")
        conditions = [(c, p) for c, p in conditions if c in wanted]
    return name, folder, conditions


def sweep_overrides(data: str, sft: str, seed: int, user: list[str], start: list[str] | None = None) -> list[str]:
    """The ``--set`` values of one condition: data, start checkpoint (and ``start``: what of the
    recipe's model.config holds for it, :func:`start_overrides`), seed, then the user's."""
    for text in user:
        key = text.partition("=")[0].strip()
        if key == "seed":
            raise SweepError("--set seed=...: use --seeds")
    return [f"data.path={data}", f"model.path={sft}", "model.preset=null", "model.native=null", "model.config={}",
            *(start or []), f"seed={seed}", *user]


def start_overrides(recipe_file: str | Path) -> list[str]:
    """``--set`` items that carry the recipe's own ``model.config`` keys which hold for any start
    checkpoint (``PATH_MODEL_CONFIG_KEYS``: the attention kernel) past the sweep's ``model.config={}``."""
    try:
        config = load_recipe(recipe_file)["model"]["config"]
    except (RecipeError, OSError):
        return []  # the pre-flight check loads the recipe again and names the problem
    return [f"model.config.{key}={config[key]}" for key in PATH_MODEL_CONFIG_KEYS if key in config]


def condition_overrides(plan: Plan, cond: Condition) -> list[str]:
    """Every ``--set`` item of ``cond``'s train command: the sweep's (:func:`sweep_overrides`), then its own;
    a stage's (no seed) are all its own."""
    if cond.seed is None:
        return list(cond.overrides)
    return [*sweep_overrides(plan.data, plan.sft, cond.seed, plan.overrides, start_overrides(cond.recipe)),
            *cond.overrides]


# ----------------------------------------------------------------------------------- planning


def run_state(run_dir: Path) -> str:
    """``new``, ``completed``, ``stopped``, ``interrupted`` (manifest, not completed),
    ``pre_manifest`` (only what train writes before its manifest) or ``foreign``
    (:meth:`RunFolder.state`)."""
    return RunFolder(run_dir).state()


def plan_sweep(args: argparse.Namespace) -> Plan:
    """Resolve everything and check every run folder before anything runs (:func:`check_plan`); raises
    SweepError. Conditions outside ``--conditions`` are never trained or evaluated."""
    name, folder, everything = resolve_conditions(args.protocol, args.recipes, None)
    selected = {c for c, _ in resolve_conditions(args.protocol, args.recipes, args.conditions)[2]}
    data, sft, out = (str(Path(p).resolve()) for p in (args.data, args.sft, args.output_dir))
    if not (Path(data) / "manifest.json").is_file():
        raise SweepError(f"--data {args.data}: not a split folder (no manifest.json; see minimind-trl data prepare)")
    if not (Path(sft) / "config.json").is_file():
        raise SweepError(f"--sft {args.sft}: not a Hub-format checkpoint folder (no config.json)")
    # The test split's evaluations, summary and plots are <protocol>'s; another split's <protocol>@<split>'s,
    # so one sweep's runs can be evaluated on several splits side by side.
    label = name if args.eval_split == "test" else f"{name}@{args.eval_split}"
    plan = Plan(protocol=name, recipes_dir=str(folder), data=data, sft=sft, out=out, seeds=list(args.seeds),
                overrides=list(args.overrides), baseline_eval=str(Path(out, "eval", label, BASELINE)),
                summary_dir=str(Path(out, "summary", label)), plots_dir=str(Path(out, "plots", label)))
    for seed in args.seeds:
        for condition, recipe_path in everything:
            plan.conditions.append(Condition(name=condition, seed=seed, recipe=str(recipe_path.resolve()),
                                             run_dir=str(Path(out, "runs", name, f"{condition}-seed{seed}")),
                                             eval_dir=str(Path(out, "eval", label, f"{condition}-seed{seed}"))))
    check_plan(plan, eval_settings(args), "use another --output-dir (or the same --set values)", selected)
    return plan


def check_plan(plan: Plan, settings: dict[str, Any], advice: str, selected: set[str] | None = None) -> None:
    """The one planner of the sweep and the demo: set every condition's action by the one reuse rule
    (:func:`reuse_action`), then refuse before anything runs, every problem listed in one SweepError:
    a run folder that holds another recipe's run or no run (``advice`` says what to do instead), a run
    that cannot follow its stage (:func:`stage_problems`) and an evaluation folder that is stale or
    foreign (:func:`eval_problems`).

    Conditions outside ``selected`` (the sweep's ``--conditions``) are planned as ``other``: never
    trained or evaluated, but their finished evaluations go into the summary when their run matches
    the recipe (else ``stale``, left out)."""
    problems = []
    for cond in plan.conditions:
        action, conflict = reuse_action(plan, cond)
        if selected is not None and cond.name not in selected:
            cond.action = _outside_action(cond, action, settings)
        elif action is None:
            problems.append(f"{conflict}; {advice}")
        else:
            cond.action = action
    problems += stage_problems(plan) + eval_problems(plan, settings)
    if problems:
        raise SweepError("refusing to run:\n  " + "\n  ".join(problems))


def _outside_action(cond: Condition, action: str | None, settings: dict[str, Any]) -> str:
    """``other`` when a condition outside ``--conditions`` completed this recipe and its evaluation is of
    that run with these settings, else ``stale``."""
    if action != "skip":
        return "stale"
    try:
        eval_done(Path(cond.eval_dir), RunFolder(cond.run_dir).final_dir, settings)
    except SweepError:
        return "stale"
    return "other"


def _stage(plan: Plan, label: str, before: Condition | None = None) -> Condition:
    """The stage called ``label``, earlier in the plan than ``before``; SweepError when there is none (a
    plan whose order would train a condition before the run it starts from)."""
    earlier = plan.conditions[:plan.conditions.index(before)] if before is not None else plan.conditions
    for cond in earlier:
        if cond.seed is None and cond.label == label:
            return cond
    raise SweepError(f"the plan names {label!r} as a stage to start from, but has no such stage before it")


def stage_problems(plan: Plan) -> list[str]:
    """Runs that cannot follow their stage (``after``): a stage that stopped on a non-finite value (its
    ``final/`` will never be there; named once), and a run to reuse (``skip``, ``resume``, ``stopped``)
    made from the ``final/`` of a stage that will train again."""
    problems, stopped = [], set()
    for cond in plan.conditions:
        if not cond.after:
            continue
        stage = _stage(plan, cond.after, cond)
        if stage.action == "stopped" and stage.label not in stopped:
            stopped.add(stage.label)
            problems.append(f"{stage.run_dir} stopped on a non-finite value (see its status.json); {cond.label} "
                            "starts from it: delete it to train again")
        elif stage.action in ("train", "resume") and cond.action in ("skip", "resume", "stopped"):
            problems.append(f"{cond.run_dir}: made from the final/ of {stage.label}, which will train again; "
                            "refusing to reuse it")
    return problems


def eval_problems(plan: Plan, settings: dict[str, Any]) -> list[str]:
    """Evaluation folders that cannot be reused: one beside a run that is not complete, and one that
    evaluated other weights or settings (:func:`eval_done`). The baseline's run is the stage
    ``baseline_after`` when the plan trains ``sft``; a given ``sft`` is complete."""
    maker = _stage(plan, plan.baseline_after).action if plan.baseline_after else "skip"
    evals = [(maker, Path(plan.sft), Path(plan.baseline_eval))]
    evals += [(c.action, RunFolder(c.run_dir).final_dir, Path(c.eval_dir)) for c in plan.conditions if c.eval_dir]
    problems, finished = [], []
    for action, checkpoint, eval_dir in evals:
        if action == "skip":
            finished.append((checkpoint, eval_dir))
        elif action in ("train", "resume", "stopped") and not EvalFolder(eval_dir).is_empty():
            problems.append(f"{eval_dir}: an evaluation of a run that is not complete; refusing to reuse it")
    for checkpoint, eval_dir in finished:
        try:
            eval_done(eval_dir, checkpoint, settings)
        except SweepError as exc:
            problems.append(str(exc))
    return problems


def reuse_action(plan: Plan, cond: Condition) -> tuple[str | None, str]:
    """Resolve ``cond``'s recipe (setting ``cond.recipe_sha256``) and what its run folder allows:
    (``train`` | ``resume`` | ``skip`` | ``stopped``, "") by :meth:`RunFolder.reuse_action`, or
    (None, why) when the folder holds another recipe's run or is not a run folder."""
    try:
        recipe = load_recipe(cond.recipe, condition_overrides(plan, cond))
    except (RecipeError, FileNotFoundError) as exc:
        raise SweepError(f"{cond.recipe}: {exc}") from None
    cond.recipe_sha256 = recipe_sha256(recipe)
    try:
        return RunFolder(cond.run_dir).reuse_action(recipe, cond.recipe_sha256), ""
    except RunFolderConflict as exc:
        return None, str(exc)


# ----------------------------------------------------------------------------------- running


def subprocess_runner(launcher: str | None = None) -> Runner:
    """Runs ``minimind-trl ARGS`` in a fresh process (the train command under ``launcher`` if
    given) through :func:`~minimind_trl.subprocess_runner.run_cli`, its output appended to the log
    file after a ``=== TIME $ COMMAND`` line; returns the exit code."""

    def run(args: list[str], log: Path, devices: str | None = None) -> int:
        prefix = launcher if args and args[0] == "train" else None
        env = None
        if devices is not None:
            env = slot_env(devices)  # side-by-side launchers must not share a rendezvous port
            prefix = prefix.replace("{port}", env["MASTER_PORT"]) if prefix else prefix
        return run_cli(args, log, launcher=prefix, env=env)

    return run


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _say(text: str) -> None:
    print(f"[sweep] {text}", flush=True)


def _log_path(plan: Plan, name: str) -> Path:
    return Path(plan.logs_dir, f"{name}.log")


MOE_PROTOCOLS = ("e3",)
"""Protocols whose conditions train the MoE preset (recipes/e3: MiniMind-3-MoE)."""


def train_args(plan: Plan, cond: Condition) -> list[str]:
    """The ``minimind-trl`` arguments that train (or resume) ``cond``."""
    args = ["train", cond.recipe, "--output-dir", cond.run_dir]
    for text in condition_overrides(plan, cond):
        args += ["--set", text]
    return args + (["--resume"] if cond.action == "resume" else [])


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def preflight(plan: Plan, recipes: dict[str, dict]) -> list[str]:
    """Problems found before anything runs, per condition to train (``recipes``: label -> resolved
    recipe): its plugins (rewards, tools: an E4 reward model that is not there), its tokenizer
    against the start folder's, and for a MoE protocol (:data:`MOE_PROTOCOLS`) a dense start."""
    problems = []
    start = json.loads((Path(plan.sft) / "config.json").read_text(encoding="utf-8"))
    for cond in plan.conditions:
        if cond.action in ("other", "stale"):
            continue
        try:
            build.check_plugins(recipes[cond.label])
            build.tokenizer_folder(recipes[cond.label])
        except RecipeError as exc:
            problems.append(f"{cond.label}: {exc}")
        if plan.protocol in MOE_PROTOCOLS and not start.get("use_moe"):
            problems.append(f"{cond.label}: protocol {plan.protocol} trains the MoE model but --sft {plan.sft} is "
                            "a dense model (its config.json has no use_moe: true)")
    return problems


def dry_run(plan: Plan) -> int:
    """Print each condition's action, command and resolved differences from the protocol's first
    condition, then the pre-flight problems; 2 if there are any."""
    recipes = {cond.label: load_recipe(cond.recipe, condition_overrides(plan, cond)) for cond in plan.conditions}
    base = _flat(recipes[plan.conditions[0].label]) if plan.conditions else {}
    for index, cond in enumerate(plan.conditions):
        flat = _flat(recipes[cond.label])
        print(f"{cond.label}: {cond.action}  {cond.recipe} -> {cond.run_dir}")
        if cond.action not in ("other", "stale", "skip", "stopped"):
            print("  $ " + shlex.join(["minimind-trl", *train_args(plan, cond)]))
        differs = [f"{k}={flat.get(k)!r}" for k in sorted(set(flat) | set(base)) if flat.get(k) != base.get(k)]
        shown = ", ".join(differs) or ("nothing (it is the first)" if index == 0 else "nothing")
        print(f"  differs from the first condition in: {shown}")
    problems = preflight(plan, recipes)
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"pre-flight: {len(problems)} problem(s)")
    return 2 if problems else 0


def train_condition(plan: Plan, cond: Condition, run: Runner, devices: str | None = None) -> None:
    if cond.action in ("skip", "stopped"):
        note = "completed earlier" if cond.action == "skip" else "stopped on a non-finite value earlier (not resumed)"
        _say(f"{cond.label}: {note} ({cond.run_dir})")
        return
    run_dir = Path(cond.run_dir)
    if cond.action == "train" and run_dir.is_dir():  # only pre-manifest leftovers (checked by check_plan)
        for leftover in run_dir.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
    args = train_args(plan, cond)
    log = Path(cond.log) if cond.log else _log_path(plan, f"{cond.label}.train")
    cond.log = str(log)
    where = "" if devices is None else f" on {slot_name(devices)}"
    _say(f"{cond.label}: {'resuming' if cond.action == 'resume' else 'training'}{where} -> {cond.run_dir}")
    started = time.perf_counter()
    cond.rc = _call(run, args, log, devices)
    cond.seconds = round(time.perf_counter() - started, 1)
    if cond.rc != 0 or run_state(run_dir) != "completed":
        cond.action = "failed" if run_state(run_dir) != "stopped" else "stopped"
        _say(f"{cond.label}: train exited with {cond.rc} after {cond.seconds} s; see {log}")
    else:
        _say(f"{cond.label}: completed in {cond.seconds} s")


def eval_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"split": args.eval_split, "limit": args.eval_limit, "batch_size": args.eval_batch_size,
            "max_new_tokens": args.eval_max_new_tokens, "max_tool_turns": args.eval_max_tool_turns,
            "device": args.eval_device}


def eval_done(eval_dir: Path, checkpoint: Path, settings: dict[str, Any]) -> bool:
    """True if ``eval_dir`` holds a finished evaluation of these weights with these settings;
    False if there is none; SweepError if it holds a different one."""
    folder = EvalFolder(eval_dir)
    if eval_dir.is_dir() and folder.is_empty():
        eval_dir.rmdir()
    if not eval_dir.exists():
        return False
    manifest = folder.manifest()
    if manifest is None:
        raise SweepError(f"{eval_dir}: not empty and not an eval folder (no eval_manifest.json); refusing to touch it")
    sha = resolve_checkpoint(checkpoint).sha256
    if manifest.get("checkpoint", {}).get("sha256") != sha:
        raise SweepError(f"{eval_dir}: evaluated other weights than {checkpoint} (SHA-256 differs)")
    decoding = {k: v for k, v in manifest.get("decoding", {}).items() if k not in _IGNORED_DECODING}
    wanted = {"max_new_tokens": settings["max_new_tokens"], "max_tool_turns": settings["max_tool_turns"],
              "open_thinking": False, "limit": settings["limit"]}
    split = manifest.get("split", {}).get("name")
    if any(decoding.get(k) != v for k, v in wanted.items()) or split != settings["split"]:
        raise SweepError(f"{eval_dir}: evaluated with other settings ({decoding}, split {split!r}); "
                         "use another --output-dir")
    return True


def evaluate(plan: Plan, name: str, checkpoint: Path, eval_dir: Path, settings: dict[str, Any],
             run: Runner, devices: str | None = None) -> tuple[str, int | None]:
    """Evaluate ``checkpoint`` into ``eval_dir`` (``eval`` commits the folder whole); (action, exit code)."""
    if eval_done(eval_dir, checkpoint, settings):
        _say(f"{name}: evaluated earlier ({eval_dir})")
        return "skip", None
    eval_dir.parent.mkdir(parents=True, exist_ok=True)
    args = ["eval", "--checkpoint", str(checkpoint), "--split-dir", plan.data, "--split", settings["split"],
            "--output-dir", str(eval_dir), "--batch-size", str(settings["batch_size"]),
            "--max-new-tokens", str(settings["max_new_tokens"]), "--max-tool-turns", str(settings["max_tool_turns"]),
            "--device", settings["device"]]  # eval resolves auto
    if settings["limit"] is not None:
        args += ["--limit", str(settings["limit"])]
    log = _log_path(plan, f"{name}.eval")
    where = "" if devices is None else f" on {slot_name(devices)}"
    _say(f"{name}: evaluating {checkpoint} on {settings['split']}{where}")
    rc = _call(run, args, log, devices)
    if rc != 0 or not EvalFolder(eval_dir).is_complete():
        _say(f"{name}: eval exited with {rc}; see {log}")
        return "failed", rc
    return "eval", rc


def _evaluated(eval_dir: str | Path) -> bool:
    """A finished evaluation there (never for a stage, whose ``eval_dir`` is empty)."""
    return eval_dir != "" and EvalFolder(eval_dir).is_complete()


def interaction_specs(plan: Plan, own: dict[str, list[tuple[int, str]]]) -> tuple[list[str], str | None]:
    """For e2: the e1 cells' eval folders (same seeds, same SFT baseline) and the --interaction value."""
    if plan.protocol != "e2":
        return [], None
    baseline = EvalFolder(plan.baseline_eval).checkpoint_sha256()
    e1_baseline = EvalFolder(Path(plan.out, "eval", "e1", BASELINE)).checkpoint_sha256()
    if e1_baseline != baseline:
        return [], None  # no e1 sweep here, or one from another SFT checkpoint
    specs, cells = [], {}
    for cell, (protocol, condition) in E2_CELLS.items():
        if protocol == "e2":
            if not own.get(condition):
                return [], None
        else:
            found = [(s, Path(plan.out, "eval", "e1", f"{condition}-seed{s}")) for s in plan.seeds]
            found = [(s, p) for s, p in found if _evaluated(p)]
            if not found:
                return [], None
            specs += [f"{condition}@{s}={p}" for s, p in found]
        cells[cell] = condition
    return specs, ",".join(f"{cell}={condition}" for cell, condition in cells.items())


def summarize_and_plot(plan: Plan, run: Runner, n_resamples: int | None = None,
                       interaction: str | None = None) -> dict[str, Any]:
    """``minimind-trl summarize`` and ``plot`` over the evaluated conditions; returns what was written.
    ``interaction`` (``cell=condition,...``, all conditions of this plan) asks summarize for the 2x2
    interaction; without it, e2 looks for its e1 cells (:func:`interaction_specs`)."""
    baseline_dir = Path(plan.baseline_eval)
    own: dict[str, list[tuple[int, str]]] = {}  # evaluated conditions (this sweep's, and matching others)
    for cond in plan.conditions:
        if cond.action != "stale" and _evaluated(cond.eval_dir):
            own.setdefault(cond.name, []).append((cond.seed, cond.eval_dir))
    result: dict[str, Any] = {"summary": None, "plots": None}
    if not own or not _evaluated(baseline_dir):
        _say("nothing to summarise (no evaluated condition, or no baseline)")
        return result
    specs = [f"{BASELINE}={baseline_dir}"]
    specs += [f"{name}@{seed}={path}" for name, items in own.items() for seed, path in items]
    if interaction is None:
        extra, interaction = interaction_specs(plan, own)
        specs += extra
    summary_dir = Path(plan.summary_dir)
    command = ["summarize", *specs, "--output-dir", str(summary_dir), "--baseline", BASELINE, "--overwrite"]
    if interaction:
        command += ["--interaction", interaction]
    if n_resamples is not None:
        command += ["--n-resamples", str(n_resamples)]
    log = _log_path(plan, "summarize")
    if run(command, log) != 0:
        _say(f"summarize failed; see {log}")
        result["failed"] = "summarize"
        return result
    result["summary"] = str(summary_dir / "summary.md")
    result["interaction"] = interaction
    _say(f"summary: {summary_dir / 'summary.md'}" + (" (with the 2x2 interaction)" if interaction else ""))
    runs = [c.run_dir for c in plan.conditions if c.action != "stale" and _evaluated(c.eval_dir)
            and run_state(Path(c.run_dir)) == "completed"]
    plots_dir = Path(plan.plots_dir)
    log = _log_path(plan, "plot")
    if run(["plot", "--runs", *runs, "--summary", str(summary_dir / "summary.json"), "--output-dir", str(plots_dir)],
           log) != 0:
        _say(f"plot failed; see {log}")
        result["failed"] = "plot"
        return result
    result["plots"] = str(plots_dir)
    _say(f"plots: {plots_dir}")
    return result


def write_record(plan: Plan, argv: list[str], started: str, extra: dict[str, Any]) -> Path:
    path = Path(plan.out, f"sweep-{plan.protocol}.json")
    record = {"protocol": plan.protocol, "argv": argv, "started": started, "finished": _now(),
              "recipes_dir": plan.recipes_dir, "data": plan.data, "sft": plan.sft, "seeds": plan.seeds,
              "overrides": plan.overrides, "conditions": [asdict(c) for c in plan.conditions], **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return path


def visible_gpu_count() -> int:
    """The GPUs this process's torch sees (``--gpus`` ids index them)."""
    return torch.cuda.device_count()


def check_launch(args: argparse.Namespace) -> None:
    """``--gpus`` and ``--launcher``, before anything runs: GPU ids this process sees, a launcher
    that parses and names a program on PATH, ``{port}`` only with ``--gpus``."""
    if args.jobs is not None and args.gpus:
        raise SweepError("--jobs and --gpus exclude each other: --gpus already runs one job per GPU slot")
    if args.gpus:
        count = visible_gpu_count()
        if count == 0:
            raise SweepError("--gpus: torch sees no GPU here; run without --gpus (conditions then run one after "
                             "another)")
        ids = [int(i) for slot in args.gpus for i in slot.split(",")]
        if max(ids) >= count:
            raise SweepError(f"--gpus: GPU {max(ids)} asked for, but this process sees {count} GPU(s) (ids 0 to "
                             f"{count - 1})")
        if args.eval_device.startswith("cuda:"):
            raise SweepError(f"--eval-device {args.eval_device} with --gpus: each child sees only its slot's GPUs; "
                             "use --eval-device auto or cuda")
        for slot in args.gpus:
            visible_devices(slot)  # refuses ids this process cannot see
    if args.launcher is None:
        return
    try:
        words = shlex.split(args.launcher)
    except ValueError as exc:
        raise SweepError(f"--launcher {args.launcher!r}: {exc}") from None
    if not words or (shutil.which(words[0]) is None and not Path(words[0]).is_file()):
        raise SweepError(f"--launcher {args.launcher!r}: {words[0] if words else 'nothing'!r} is not a program on "
                         "PATH")
    if "{port}" in args.launcher and not args.gpus:
        raise SweepError("--launcher: {port} is replaced by each GPU slot's rendezvous port; it needs --gpus")


def check_eval_settings(args: argparse.Namespace) -> None:
    """The evaluation and summary settings, as ``eval`` and ``summarize`` would check them (same
    bounds, :meth:`EvalSettings.validate`), before the first condition trains."""
    settings = EvalSettings(batch_size=args.eval_batch_size, max_new_tokens=args.eval_max_new_tokens,
                            max_tool_turns=args.eval_max_tool_turns, limit=args.eval_limit)
    try:
        settings.validate(prefix="eval-")
        resolve_device(args.eval_device, option="--eval-device")
    except EvalError as exc:
        raise SweepError(str(exc)) from None
    if args.n_resamples is not None:
        try:
            stats.check_settings(args.n_resamples, stats.DEFAULT_CONFIDENCE)
        except ValueError as exc:
            raise SweepError(f"--n-resamples: {exc}") from None


def sweep(args: argparse.Namespace, argv: list[str], run: Runner) -> int:
    started = _now()
    try:  # OUT: never the root or home folder, under a file, or a run, split, eval or demo folder
        check_output_folder(args.output_dir, own=("sweep-*.json",), reuse=lambda folder: True)
    except OutputTargetError as exc:
        raise SweepError(f"--output-dir: {exc}") from None
    check_launch(args)
    check_eval_settings(args)
    plan = plan_sweep(args)
    settings = eval_settings(args)
    if args.dry_run:
        return dry_run(plan)
    Path(plan.out).mkdir(parents=True, exist_ok=True)
    with folder_lock(plan.out, "minimind-trl sweep"):
        return _run_plan(plan, settings, args, argv, started, run)


def _run_plan(plan, settings, args: argparse.Namespace, argv: list[str], started: str, run: Runner) -> int:
    """Train, evaluate, summarize and plot the planned conditions (the sweep folder is locked)."""
    record_lock = threading.Lock()

    def save_record() -> None:
        with record_lock:  # jobs finish in other threads with --gpus
            write_record(plan, argv, started, {})

    slots = args.gpus or (cpu_slots(args.jobs) if args.jobs else None)
    failed, outputs = drive(plan, settings, run, slots, after_job=save_record, n_resamples=args.n_resamples)
    record = write_record(plan, argv, started, {"baseline_eval": plan.baseline_eval, **outputs})
    _say(f"record: {record}")
    return 1 if failed else 0


def drive(plan: Plan, settings: dict[str, Any], run: Runner, slots: list[str] | None = None,
          after_job: Callable[[], None] | None = None, n_resamples: int | None = None,
          interaction: str | None = None, stage_slot: str | None = None,
          after_stages: Callable[[], None] | None = None) -> tuple[bool, dict[str, Any]]:
    """The one driver of the sweep and the demo, on a plan :func:`check_plan` accepted: train every
    planned condition (:func:`train_planned`: stages first, on ``stage_slot``, then ``after_stages()``;
    action ``train``/``resume``; ``skip`` and ``stopped`` are reported), evaluate the baseline and every
    completed run (:func:`evaluate`: an evaluation of the same weights and settings is reused), then
    :func:`summarize_and_plot`. ``after_job()`` runs after each training and evaluation (the sweep
    rewrites its record). Returns (whether anything failed, what was written)."""
    mine = [cond for cond in plan.conditions if cond.action not in ("other", "stale")]
    done = after_job or (lambda: None)
    train_planned(plan, mine, run, slots, done, stage_slot, after_stages)
    baseline: list[str] = []

    def evaluate_baseline(devices: str | None) -> None:
        baseline.append(evaluate(plan, BASELINE, Path(plan.sft), Path(plan.baseline_eval), settings, run, devices)[0])
        done()

    def evaluate_run(cond: Condition):
        def job(devices: str | None) -> None:
            cond.eval_action, cond.eval_rc = evaluate(plan, cond.label, RunFolder(cond.run_dir).final_dir,
                                                      Path(cond.eval_dir), settings, run, devices)
            done()
        return job

    trained = [cond for cond in mine if run_state(Path(cond.run_dir)) == "completed"]
    for cond in mine:
        if cond not in trained or not cond.eval_dir:
            cond.eval_action = "none"
    jobs = [evaluate_baseline] if _completed(plan, plan.baseline_after) else []
    in_slots([*jobs, *(evaluate_run(cond) for cond in trained if cond.eval_dir)], slots)
    failed = baseline == ["failed"] or len(trained) < len(mine) or any(c.eval_action == "failed" for c in trained)
    outputs = summarize_and_plot(plan, run, n_resamples, interaction)
    return failed or "failed" in outputs, outputs


def train_planned(plan: Plan, conditions: list[Condition], run: Runner, slots: list[str] | None,
                  done: Callable[[], None], stage_slot: str | None = None,
                  after_stages: Callable[[], None] | None = None) -> None:
    """Train ``conditions`` in the order their dependencies ask: the stages one after another on
    ``stage_slot`` (the demo's pretraining and SFT on the reference machine's two threads), then
    ``after_stages()`` when every stage completed (the demo's time projection), then the seeded
    conditions side by side on ``slots`` (:func:`in_slots`). A condition whose stage (``after``) did
    not complete is not trained (``blocked``)."""

    def train(cond: Condition):
        def job(devices: str | None) -> None:
            if _completed(plan, cond.after):
                train_condition(plan, cond, run, devices)
            else:
                cond.action = "blocked"
                _say(f"{cond.label}: not trained: {cond.after} did not complete")
            done()
        return job

    stages = [cond for cond in conditions if cond.seed is None]
    for cond in stages:
        train(cond)(stage_slot)
    if after_stages is not None and all(_completed(plan, cond.label) for cond in stages):
        after_stages()
    in_slots([train(cond) for cond in conditions if cond.seed is not None], slots)


def _completed(plan: Plan, stage: str) -> bool:
    """True when ``stage`` is empty (nothing to wait for) or names a stage whose run completed."""
    return not stage or run_state(Path(_stage(plan, stage).run_dir)) == "completed"


def main(argv: list[str] | None = None, runner: Runner | None = None) -> int:
    """``minimind-trl sweep`` (see the module docstring). ``runner`` replaces the subprocess that
    runs each ``minimind-trl`` command (tests run them in-process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        return sweep(args, argv, runner or subprocess_runner(args.launcher))
    except (SweepError, FolderLockError) as exc:
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
