"""Search RL settings for the demo on the val split: each cell trains from the demo's SFT start.

    python scripts/demo_rl_search.py --demo-dir runs/demo --output-dir runs/rl_search \
        --cell "t07_k2:objective.preset=grpo,rollout.temperature=0.7,training.num_iterations=2" \
        --cell "base:objective.preset=grpo"

A cell is ``NAME:KEY=VALUE,KEY=VALUE,...``: ``--set`` items applied on top of
``recipes/demo/rl.yaml`` (plus the demo's start, data, tokenizer and ``--seed``). Each cell is
trained once (finished runs are reused, so the command can be rerun with more cells into the same
folder), then evaluated greedily on the **val** split (never the test split) with the demo's
decoding settings. The table (``search.md`` / ``search.json``) gives, per cell: val success, the
paired difference to the SFT start on the same val questions with its question-level bootstrap CI,
questions fixed / broken, the half-width of that CI (differences smaller than about this cannot be
told apart on this many questions), the training reward and the success reward (sampled pass@1 at
the training temperature) of the first and last quarter of the rollouts, and the training wall time.

``--hard-pool N`` first evaluates the SFT start greedily on the first N training questions and
writes ``OUTPUT/hard_split``, a split folder (with its manifest) whose ``train.jsonl`` holds the
questions it fails; a cell trains on them with ``data.path=OUTPUT/hard_split``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from minimind_trl import demo, sweep
from minimind_trl.data import prepare_splits
from minimind_trl.eval.stats import paired_difference_ci
from minimind_trl.fsio import read_jsonl, write_json_atomic, write_jsonl_atomic, write_text_atomic
from minimind_trl.metric_names import REWARD_MEAN, reward_func_mean_key


def _cell(text: str) -> tuple[str, list[str]]:
    name, _, items = text.partition(":")
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"cell name must be alphanumeric (with _ or -): {text!r}")
    return name, [item for item in items.split(",") if item]


def _successes(eval_dir: Path) -> np.ndarray:
    return np.array([float(bool(r["success"])) for r in read_jsonl(eval_dir / "records.jsonl")])


def _quarters(run_dir: Path, key: str) -> tuple[float | None, float | None]:
    """Mean of ``key`` over the first and the last quarter of the rollouts (one value per rollout)."""
    per_rollout: dict[int, float] = {}
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        if record.get(key) is not None:
            per_rollout.setdefault(int(record["rollout"]), float(record[key]))
    values = [per_rollout[r] for r in sorted(per_rollout)]
    if not values:
        return None, None
    q = max(1, len(values) // 4)
    return float(np.mean(values[:q])), float(np.mean(values[-q:]))


def evaluate(out: Path, name: str, checkpoint: Path, splits: Path, split: str, limit: int | None = None) -> Path:
    """``out/eval/NAME``: the demo's greedy evaluation of ``checkpoint`` on ``split`` (its first
    ``limit`` questions) by the sweep's rule (an evaluation of the same weights and settings is reused)."""
    plan = sweep.Plan(protocol="rl_search", recipes_dir=str(demo.RECIPE_DIR), data=str(splits), sft=str(checkpoint),
                      out=str(out), seeds=[], overrides=[], logs_dir=str(out / "logs"))
    settings = {**demo.eval_settings(demo.SIZES["full"]), "split": split, "limit": limit}
    eval_dir = out / "eval" / name
    action, _ = sweep.evaluate(plan, name, checkpoint, eval_dir, settings, sweep.subprocess_runner())
    if action == "failed":
        raise SystemExit(f"demo_rl_search.py: evaluating {checkpoint} failed; see {out / 'logs' / name}.eval.log")
    return eval_dir


def train_cell(demo_dir: Path, out: Path, name: str, items: list[str], seed: int, split: str) -> str:
    """Train cell ``name`` into ``out/runs/NAME`` (log ``out/logs/train_NAME.log``) as a condition of
    the sweep's planner: ``recipes/demo/rl.yaml`` from the demo's SFT start, on its data and tokenizer,
    with ``items`` last. A finished run of the same recipe is reused, one of another refused, and so is
    an evaluation folder of other weights; it trains on the demo's stage slot (two threads). Returns
    the planned action (``skip``: trained earlier)."""
    plan = sweep.Plan(protocol="rl_search", recipes_dir=str(demo.RECIPE_DIR), data=str(demo_dir / demo.SPLITS),
                      sft=str(demo_dir / "runs" / demo.SFT / "final"), out=str(out), seeds=[seed],
                      overrides=[f"tokenizer.path={demo_dir / demo.TOKENIZER}"],
                      baseline_eval=str(out / "eval" / f"sft_{split}"), logs_dir=str(out / "logs"))
    cell = sweep.Condition(name=name, seed=seed, recipe=str(demo.RECIPE_DIR / "rl.yaml"),
                           run_dir=str(out / "runs" / name), eval_dir=str(out / "eval" / f"{name}_{split}"),
                           overrides=items, log=str(out / "logs" / f"train_{name}.log"))
    plan.conditions = [cell]
    settings = {**demo.eval_settings(demo.SIZES["full"]), "split": split}
    try:
        sweep.check_plan(plan, settings, "use another --output-dir or cell name")
    except sweep.SweepError as exc:
        raise SystemExit(f"demo_rl_search.py: {exc}") from None
    action = cell.action
    sweep.train_condition(plan, cell, sweep.subprocess_runner(), demo.STAGE_SLOT)
    if cell.action in ("failed", "stopped"):
        raise SystemExit(f"demo_rl_search.py: training {name} did not complete; see {cell.log}")
    return action


def hard_split(out: Path, sft: Path, splits: Path, pool: int) -> Path:
    """``out/hard_split``: the first ``pool`` training questions that the SFT start fails (greedy)."""
    folder = out / "hard_split"
    if (folder / "manifest.json").is_file():
        return folder
    eval_dir = evaluate(out, f"sft_train{pool}", sft, splits, "train", limit=pool)
    failed = {r["id"] for r in read_jsonl(eval_dir / "records.jsonl") if not r["success"]}
    tasks = [task for task in read_jsonl(splits / "train.jsonl") if task["id"] in failed]
    source = out / "hard_src" / "hard.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(source, tasks)
    prepare_splits([source], folder, seed=42, sizes=[len(tasks), 0, 0])
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", default="runs/demo")
    parser.add_argument("--output-dir", default="runs/rl_search")
    parser.add_argument("--cell", type=_cell, action="append", required=True, help="NAME:KEY=VALUE,...")
    parser.add_argument("--seed", type=int, default=42, help="RL seed of every cell")
    parser.add_argument("--split", default="val", choices=["val", "train"])
    parser.add_argument("--hard-pool", type=int, default=None, metavar="N",
                        help="write OUTPUT/hard_split: the first N training questions the SFT start fails")
    args = parser.parse_args(argv)
    demo_dir, out = Path(args.demo_dir), Path(args.output_dir)
    splits, tokenizer, sft = demo_dir / "data" / "splits", demo_dir / "tokenizer", demo_dir / "runs" / "sft" / "final"
    for needed in (splits / "manifest.json", tokenizer / "tokenizer.json", sft / "config.json"):
        if not needed.is_file():
            raise SystemExit(f"demo_rl_search.py: {needed} is missing; run `minimind-trl demo` first")
    if args.hard_pool:
        print(f"hard split: {hard_split(out, sft, splits, args.hard_pool)}", flush=True)
    result_file = out / "search.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {"cells": {}}
    base = _successes(evaluate(out, f"sft_{args.split}", sft, splits, args.split))
    result["sft"] = {"split": args.split, "questions": int(base.size), "success": float(base.mean())}
    for name, items in args.cell:
        run_dir = out / "runs" / name
        started = time.time()
        trained = train_cell(demo_dir, out, name, items, args.seed, args.split) == "skip"
        train_s = None if trained else round(time.time() - started, 1)
        values = _successes(evaluate(out, f"{name}_{args.split}", run_dir / "final", splits, args.split))
        ci = paired_difference_ci(values, base)
        reward = _quarters(run_dir, REWARD_MEAN)
        sampled = _quarters(run_dir, reward_func_mean_key("success_reward"))
        previous = result["cells"].get(name, {})
        result["cells"][name] = {
            "overrides": items, "seed": args.seed, "success": float(values.mean()),
            "delta": ci.estimate, "ci": [ci.low, ci.high], "half_width": (ci.high - ci.low) / 2,
            "fixed": int(((values == 1) & (base == 0)).sum()), "broken": int(((values == 0) & (base == 1)).sum()),
            "reward_first_last": reward, "sampled_success_first_last": sampled,
            "train_s": train_s if train_s is not None else previous.get("train_s"),
        }
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(result_file, result)
        write_text_atomic(out / "search.md", render(result))
        print(render(result), flush=True)
    return 0


def _pair(values) -> str:
    if not values or values[0] is None:
        return "–"
    return f"{values[0]:.3f} → {values[1]:.3f}"


def render(result: dict) -> str:
    sft = result["sft"]
    lines = [f"# RL settings on the {sft['split']} split ({sft['questions']} questions; SFT {sft['success']:.3f})", "",
             "| cell | overrides | seed | success | Δ vs SFT [95% CI] | fixed / broken | CI half-width | "
             "train reward first → last | sampled success first → last | train s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in result["cells"].items():
        lines.append(
            f"| {name} | {' '.join(c['overrides'])} | {c['seed']} | {c['success']:.3f} | {c['delta']:+.3f} "
            f"[{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | {c['fixed']} / {c['broken']} | {c['half_width']:.3f} | "
            f"{_pair(c['reward_first_last'])} | {_pair(c['sampled_success_first_last'])} | {c['train_s'] or '–'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
