"""Choose the demo's RL learning rate on the val split, across several pretraining/SFT starts.

    python scripts/demo_lr_select.py --demo-dir runs/demo --output-dir runs/demo_lr \
        --start-seeds 42,43 --objectives grpo,dr_grpo --lrs 3e-6,1e-5,3e-5 --rollouts 6

Reuses the demo's data, splits and tokenizer (``--demo-dir``, made by ``minimind-trl demo``). A
start is pretraining + SFT with the demo's recipes and that seed (same data); the start whose seed
is the demo's (``--demo-seed``, 42) is the demo's own SFT checkpoint. From every start, each
(objective, learning rate, rollouts) cell trains the demo RL recipe with RL seed ``--rl-seed`` and
is evaluated greedily on the **val** split (never the test split). Every start's SFT is evaluated
on val and test, and so is every RL cell of the chosen setting, so the test-split spread across
starts is shown next to the choice, not used for it.

Choice: the (learning rate, rollouts) with the highest val ``task_success`` averaged over starts
and objectives; ties go to the smaller learning rate, then fewer rollouts. Written to
``OUTPUT/lr_selection.json`` and ``.md``. Finished runs and evals are reused, so the command can be
rerun with more grid values into the same folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from minimind_trl import demo
from minimind_trl.fsio import write_json_atomic, write_text_atomic


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _success(eval_dir: Path) -> float:
    return json.loads((eval_dir / "metrics.json").read_text(encoding="utf-8"))["task_success"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", default="runs/demo")
    parser.add_argument("--output-dir", default="runs/demo_lr")
    parser.add_argument("--demo-seed", type=int, default=42, help="the seed the demo folder was made with")
    parser.add_argument("--start-seeds", type=_ints, default=[42, 43])
    parser.add_argument("--objectives", default="grpo,dr_grpo")
    parser.add_argument("--lrs", type=_floats, default=[3e-6, 1e-5, 3e-5])
    parser.add_argument("--rollouts", type=_ints, default=[demo.SIZES["full"].rl_rollouts])
    parser.add_argument("--rl-seed", type=int, default=42)
    args = parser.parse_args(argv)
    size = demo.SIZES["full"]
    demo_dir, out = Path(args.demo_dir), Path(args.output_dir)
    splits, tokenizer = demo_dir / "data" / "splits", demo_dir / "tokenizer"
    for needed in (splits / "manifest.json", tokenizer / "tokenizer.json", demo_dir / "data" / "sft" / "train.jsonl"):
        if not needed.is_file():
            raise SystemExit(f"demo_lr_select.py: {needed} is missing; run `minimind-trl demo` first")
    objectives = [o for o in args.objectives.split(",") if o]
    started = time.time()
    starts: dict[int, Path] = {}
    for seed in args.start_seeds:
        if seed == args.demo_seed and (demo_dir / "runs" / "sft" / "final").is_dir():
            starts[seed] = demo_dir / "runs" / "sft" / "final"
            continue
        where = out / f"start{seed}"
        pretrained = demo.stage_train(where, "pretrain", demo.RECIPE_DIR / "pretrain.yaml",
                                      demo.pretrain_overrides(demo_dir / "data", tokenizer, size, seed), resume=True)
        starts[seed] = demo.stage_train(where, "sft", demo.RECIPE_DIR / "sft.yaml",
                                        demo.sft_overrides(demo_dir / "data", pretrained, tokenizer, size, seed),
                                        resume=True)
    result: dict = {"rl_seed": args.rl_seed, "starts": {}, "cells": [], "updates_per_rollout": demo.UPDATES_PER_ROLLOUT}
    for seed, sft in starts.items():
        where = out / f"start{seed}"
        result["starts"][seed] = {
            "sft": str(sft),
            "sft_val": _success(demo.stage_eval(where, "sft_val", sft, splits, tokenizer, size, True, split="val")),
            "sft_test": _success(demo.stage_eval(where, "sft_test", sft, splits, tokenizer, size, True)),
        }
        for rollouts in args.rollouts:
            for lr in args.lrs:
                for objective in objectives:
                    name = f"{objective}_lr{lr:g}_r{rollouts}"
                    overrides = demo.rl_overrides(sft, splits, tokenizer, (f"objective.preset={objective}",
                                                                           f"training.learning_rate={lr}"),
                                                  rollouts, args.rl_seed)
                    final = demo.stage_train(where, name, demo.RECIPE_DIR / "rl.yaml", overrides, resume=True)
                    val = demo.stage_eval(where, f"{name}_val", final, splits, tokenizer, size, True, split="val")
                    result["cells"].append({"start": seed, "objective": objective, "lr": lr, "rollouts": rollouts,
                                            "run": str(final.parent), "val": _success(val)})
    settings = sorted({(c["lr"], c["rollouts"]) for c in result["cells"]})
    means = {s: statistics.mean(c["val"] - result["starts"][c["start"]]["sft_val"] for c in result["cells"]
                                if (c["lr"], c["rollouts"]) == s) for s in settings}
    chosen = max(settings, key=lambda s: (round(means[s], 9), -s[0], -s[1]))
    result["val_gain_by_setting"] = [{"lr": lr, "rollouts": r, "mean_val_gain_over_sft": means[(lr, r)]}
                                     for lr, r in settings]
    result["chosen"] = {"lr": chosen[0], "rollouts": chosen[1]}
    for cell in result["cells"]:  # the chosen setting on the test split: the spread across starts
        if (cell["lr"], cell["rollouts"]) == chosen:
            where = out / f"start{cell['start']}"
            name = Path(cell["run"]).name
            cell["test"] = _success(demo.stage_eval(where, f"{name}_test", Path(cell["run"]) / "final", splits,
                                                    tokenizer, size, True))
    result["seconds"] = round(time.time() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "lr_selection.json", result)
    write_text_atomic(out / "lr_selection.md", render(result))
    print(render(result))
    return 0


def render(result: dict) -> str:
    """The selection as Markdown: each start's SFT, every cell's val success, the choice, its test spread."""
    lines = ["# RL learning rate chosen on the val split", "",
             f"RL seed {result['rl_seed']}; {result['updates_per_rollout']} updates per rollout.", "",
             "| start (pretrain/SFT seed) | SFT val | SFT test |", "|---|---|---|"]
    for seed, start in result["starts"].items():
        lines.append(f"| {seed} | {start['sft_val']:.3f} | {start['sft_test']:.3f} |")
    lines += ["", "| start | objective | lr | rollouts | val | val - SFT val | test (chosen setting) |",
              "|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        gain = c["val"] - result["starts"][c["start"]]["sft_val"]
        test = f"{c['test']:.3f}" if "test" in c else ""
        lines.append(f"| {c['start']} | {c['objective']} | {c['lr']:g} | {c['rollouts']} | {c['val']:.3f} | "
                     f"{gain:+.3f} | {test} |")
    lines += ["", "| lr | rollouts | mean val gain over SFT (starts x objectives) |", "|---|---|---|"]
    for row in result["val_gain_by_setting"]:
        lines.append(f"| {row['lr']:g} | {row['rollouts']} | {row['mean_val_gain_over_sft']:+.3f} |")
    chosen = result["chosen"]
    lines += ["", f"Chosen: lr {chosen['lr']:g}, {chosen['rollouts']} rollouts "
                  f"({chosen['rollouts'] * result['updates_per_rollout']} updates).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
