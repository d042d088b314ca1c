"""The whole RL step before and after: TRL's generation and pass vs the minimind engine and the
prefix-shared pass, in one run, on one recipe and start (default: the demo recipe).

What is measured
----------------
``benchmarks/step_breakdown.py`` trains the recipe for ``--steps`` optimizer steps once per
configuration (same recipe, model, data, seed):

* ``before``        ``rollout.engine: trl``, ``training.prefix_sharing: false`` (TRL's padded
                    ``generate`` in its tool loop; one padded row per trajectory in every pass);
* ``shared``        ``rollout.engine: trl``, ``training.prefix_sharing: true``;
* ``after``         ``rollout.engine: minimind``, ``training.prefix_sharing: true`` (the defaults);

Per rollout (K steps share one rollout): ``rollout`` (generation, tool calls, rewards: the
trainer's ``rollout_seconds``), ``old_logp`` (the frozen replay) and ``update`` (the K updates'
forward + backward), and the measured wall time of the K steps; the first rollout is a warm-up and
left out when there are two or more. Speed-ups are against ``before``.

Each configuration samples its own completions, so the work differs between them: the table gives
the model tokens each sampled per rollout, and the rollout ratio per sampled token as a second
figure. With ``--frozen`` (learning rate 0) no configuration's policy moves away from the start,
so all of them sample one distribution at every rollout.

Usage (the demo's start): ``python benchmarks/rl_step.py --recipe recipes/demo/rl.yaml --set
model.path=runs/demo/runs/sft/final --set data.path=runs/demo/data/splits --set
tokenizer.path=runs/demo/tokenizer --steps 8``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_breakdown  # noqa: E402
import torch  # noqa: E402
from _common import environment, print_table, print_targets, write_json  # noqa: E402

CONFIGS = {
    # TRL's pass runs the model's own attention, so the fp32-attention option is off there
    "before": ["rollout.engine=trl", "training.prefix_sharing=false", "training.cast_attention_to_fp32=false"],
    "shared": ["rollout.engine=trl", "training.prefix_sharing=true"],
    "after": ["rollout.engine=minimind", "training.prefix_sharing=true"],
}
TARGET_ROLLOUT = 3.0  # training rollout, minimind engine vs TRL's loop
TARGET_STEP = 2.0  # whole RL step, after vs before
PHASE_KEYS = ("rollout", "reward", "old_logp", "update", "measured")
WORKLOAD_KEYS = ("action_tokens", "completion_tokens_max")
FROZEN = ["training.learning_rate=0"]  # --frozen: every rollout samples the start's policy


def per_rollout(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Sum each phase per rollout; the mean over rollouts after the first (when there are two),
    and ``rollout_each``: the rollout seconds of each averaged rollout (single rollouts move a lot:
    each samples other completions, and costs what its longest turns cost). The workload,
    ``action_tokens`` (model tokens sampled) and ``completion_tokens_max``, is the rollout's own
    figure (each of its steps repeats it), averaged the same way."""
    rollouts: dict[int, dict[str, float]] = {}
    for step in steps:
        acc = rollouts.setdefault(step["rollout_index"], dict.fromkeys(PHASE_KEYS, 0.0))
        for key in PHASE_KEYS:
            acc[key] += step[key]
        for key in WORKLOAD_KEYS:
            acc.setdefault(key, step.get(key, 0.0))
    if not rollouts:
        return None
    for acc in rollouts.values():
        acc["rollout"] += acc.pop("reward")  # the trainer's rollout_seconds: generation + tools + rewards
    kept = sorted(rollouts)[1:] if len(rollouts) > 1 else sorted(rollouts)
    mean: dict[str, Any] = {key: sum(rollouts[r][key] for r in kept) / len(kept) for key in rollouts[kept[0]]}
    mean["rollouts_averaged"] = len(kept)
    mean["rollout_each"] = [rollouts[r]["rollout"] for r in kept]
    return mean


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--recipe", default="recipes/demo/rl.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--frozen", action="store_true",
                        help="learning rate 0: every configuration samples the start's policy at every rollout, "
                             "so the rollout figures compare the engines on one distribution of completions")
    parser.add_argument("--quick", action="store_true", help="the smoke recipe, 2 steps: checks that it runs")
    args = parser.parse_args(argv)

    names = [n for n in args.configs.split(",") if n]
    if args.quick:
        names = [n for n in names if n in ("before", "after")]
    results: dict[str, Any] = {}
    for name in names:
        argv_one = ["--steps", str(args.steps), "--device", "cpu"] if not args.quick else ["--quick"]
        if not args.quick:
            argv_one += ["--recipe", args.recipe]
        if args.threads:
            argv_one += ["--threads", str(args.threads)]
        for item in [*args.overrides, *(FROZEN if args.frozen else []), *CONFIGS[name]]:
            argv_one += ["--set", item]
        try:
            out = step_breakdown.main(argv_one)
        except Exception as error:  # noqa: BLE001 - a configuration that does not run is a result
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        results[name] = {"per_rollout": per_rollout(out["steps"]), "steps": out["steps"],
                         "training_wall_s": out["training_wall_s"]}
    base = (results.get("before") or {}).get("per_rollout")
    rows, targets = [], []
    for name in names:
        mean = (results[name] or {}).get("per_rollout")
        if mean is None:
            rows.append([name, results[name].get("error", "no steps")[:60], *[None] * 8])
            continue
        speedup = base["measured"] / mean["measured"] if base else None
        spread = f"{min(mean['rollout_each']):.2f}-{max(mean['rollout_each']):.2f}"
        per_1k = 1000 * mean["rollout"] / mean["action_tokens"] if mean["action_tokens"] else None
        rows.append([name, mean["rollout"], spread, mean["action_tokens"], per_1k, mean["old_logp"], mean["update"],
                     mean["measured"], speedup, base["rollout"] / mean["rollout"] if base else None])
    print_table("Per rollout (K optimizer steps; seconds; first rollout left out as warm-up when possible; "
                "model tokens: sampled per rollout)",
                ["config", "rollout", "single rollouts", "model tokens", "rollout s / 1k tokens", "old_logp",
                 "updates", "measured", "step speed-up", "rollout speed-up"], rows)
    after = (results.get("after") or {}).get("per_rollout")
    trl = (results.get("shared") or {}).get("per_rollout") or base
    if after and trl:
        ratio = trl["rollout"] / after["rollout"]
        targets.append({"name": "training rollout: minimind engine vs TRL's loop", "measured": f"{ratio:.2f}x",
                        "target": f">= {TARGET_ROLLOUT:g}x", "pass": None if args.quick else ratio >= TARGET_ROLLOUT})
        if after["action_tokens"] and trl["action_tokens"]:  # the same, for the workloads each one sampled
            ratio = (trl["rollout"] / trl["action_tokens"]) / (after["rollout"] / after["action_tokens"])
            targets.append({"name": "training rollout per sampled model token (a figure, not the target)",
                            "measured": f"{ratio:.2f}x", "target": "-", "pass": None})
    if after and base:
        ratio = base["measured"] / after["measured"]
        targets.append({"name": "whole RL step: after vs before", "measured": f"{ratio:.2f}x",
                        "target": f">= {TARGET_STEP:g}x", "pass": None if args.quick else ratio >= TARGET_STEP})
    print_targets(targets)
    payload = {"benchmark": "rl_step", "quick": args.quick, "environment": environment(_cpu()),
               "settings": {k: v for k, v in vars(args).items() if k != "output"}, "configs": CONFIGS,
               "results": results, "targets": targets}
    write_json(args.output, payload)
    return payload


def _cpu():
    return torch.device("cpu")


if __name__ == "__main__":
    main()
