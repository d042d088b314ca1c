"""Replay + update with the prefix-shared policy pass on and off, in the same run.

What is measured
----------------
A random-weight MiniMind scores GRPO-shaped micro-batches: ``prompts`` distinct prompts of
``prompt_len`` tokens whose first ``preamble_len`` tokens are the same for all (the shared system
turn with the tool list), each repeated for ``G`` trajectories; completion lengths drawn uniformly
in ``[completion_len / 2, completion_len]`` and right-padded (TRL's layout). Two passes, on the same
batch and weights:

* ``plain``: TRL's pass, one padded ``[prompt | completion]`` row per trajectory through the fused
  LM head (what ``training.prefix_sharing: false`` runs);
* ``shared``: :mod:`minimind_trl.trainer.policy_pass` (layout built inside the timing, as the
  trainer does on every pass).

Phases (median of ``--repeats``, device-synchronised): ``replay`` (no-grad forward: the old-log-prob
pass) and ``update`` (forward + ``compute_policy_loss`` + backward). Per rollout the trainer runs one
replay and K updates: ``rollout = replay + K * update`` (K=4). Peak memory (RSS high-water mark on
CPU, ``max_memory_allocated`` on GPU) of one update per path. Also printed: the largest per-token
log-prob difference between the paths.

Workloads (``--workloads``): ``demo80`` / ``demo160`` (demo preset, 8 prompts x G=4, 272-token
prompts with a 250-token shared preamble, completions up to 80 / 160); ``real-demo`` (demo preset,
768-token completions) and ``real-minimind3`` (minimind-3 size, 768-token completions; on CPU 2
prompts x G=4 to keep it within minutes, ``--real-prompts``).

Targets: replay + update at least 2.5x faster with sharing on the demo shapes; no slower on the
real-protocol shapes; peak memory not higher.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import (  # noqa: E402
    PeakMemory,
    build_model,
    common_parser,
    environment,
    measure,
    print_table,
    print_targets,
    setup,
    write_json,
)
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from minimind_trl.objectives import ObjectiveConfig, PolicyBatch, compute_advantages, compute_policy_loss  # noqa: E402
from minimind_trl.trainer.policy_pass import build_layout, install_shared_forward  # noqa: E402

TARGET_DEMO_SPEEDUP = 2.5
K = 4
WORKLOADS = {
    # name: (preset, prompts, group size, prompt length, shared preamble, completion length)
    "demo80": ("demo", 8, 4, 272, 250, 80),
    "demo160": ("demo", 8, 4, 272, 250, 160),
    "real-demo": ("demo", 8, 4, 272, 250, 768),
    "real-minimind3": ("minimind-3", 8, 4, 272, 250, 768),
}


def make_batch(prompts: int, group: int, prompt_len: int, preamble: int, completion_len: int, vocab: int,
               device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Shared preamble + distinct prompt tails; G completions per prompt of random lengths."""
    g = torch.Generator().manual_seed(seed)
    rows = prompts * group
    head = torch.randint(21, vocab, (1, preamble), generator=g).expand(prompts, preamble)
    tail = torch.randint(21, vocab, (prompts, prompt_len - preamble), generator=g)
    prompt = torch.cat([head, tail], 1).repeat_interleave(group, 0)  # (B, P)
    completion = torch.randint(21, vocab, (rows, completion_len), generator=g)
    lengths = torch.randint(completion_len // 2, completion_len + 1, (rows,), generator=g)
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (rows,), generator=g).float()
    batch = {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion * completion_mask, "completion_mask": completion_mask,
        "advantages": compute_advantages(rewards, group, "zscore"),
    }
    return {k: v.to(device) for k, v in batch.items()}


def plain_logps(model: Any, batch: dict[str, torch.Tensor], amp: Any) -> torch.Tensor:
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    keep = batch["completion_ids"].size(1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    with amp():
        return model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[:, -keep:]


def shared_logps(model: Any, batch: dict[str, torch.Tensor], amp: Any) -> torch.Tensor:
    layout = build_layout(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
    with amp():
        return model(prefix_layout=layout).log_probs


def run_workload(name: str, args: Any, device: torch.device, dtype: torch.dtype, amp: Any) -> dict[str, Any]:
    preset, prompts, group, prompt_len, preamble, completion_len = WORKLOADS[name]
    if name == "real-minimind3" and device.type == "cpu":
        prompts = args.real_prompts
    if args.quick:
        preset, prompts, group, prompt_len, preamble, completion_len = "tiny", 2, 2, 12, 8, 8
    model, info = build_model(preset, device, dtype, seed=args.seed)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    install_shared_forward(model)
    model.train()
    batch = make_batch(prompts, group, prompt_len, preamble, completion_len, model.config.vocab_size, device,
                       args.seed)
    mask = batch["completion_mask"].bool()
    config = ObjectiveConfig.preset("grpo")
    with torch.no_grad():
        old = plain_logps(model, batch, amp)
        difference = float((shared_logps(model, batch, amp) - old)[mask].abs().max())

    out: dict[str, Any] = {"workload": name, "preset": preset, "parameters": info["active_parameters"],
                           "rows": prompts * group, "prompt_len": prompt_len, "preamble_len": preamble,
                           "completion_len": completion_len, "completion_tokens": int(mask.sum()),
                           "max_abs_logp_difference": difference}
    for path, fn in (("plain", plain_logps), ("shared", shared_logps)):
        def replay(fn=fn):
            with torch.no_grad():
                fn(model, batch, amp)

        def update(fn=fn):
            model.zero_grad(set_to_none=True)
            logps = fn(model, batch, amp)
            compute_policy_loss(PolicyBatch(logps, old, batch["advantages"], mask), config).loss.backward()

        timings = {"replay": measure(replay, device, repeats=args.repeats, warmup=args.warmup),
                   "update": measure(update, device, repeats=args.repeats, warmup=args.warmup)}
        model.zero_grad(set_to_none=True)
        with PeakMemory(device) as memory:
            update()
        model.zero_grad(set_to_none=True)
        replay_s, update_s = timings["replay"]["median_s"], timings["update"]["median_s"]
        out[path] = {"replay_s": replay_s, "update_s": update_s, "rollout_s": replay_s + K * update_s,
                     "update_peak_mib": memory.peak_mib, "update_delta_mib": memory.as_dict().get("delta_mib"),
                     "timings": timings}
    out["speedup"] = out["plain"]["rollout_s"] / out["shared"]["rollout_s"]
    out["memory_ratio"] = (out["shared"]["update_peak_mib"] or 0) / max(out["plain"]["update_peak_mib"] or 1, 1e-9)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="demo80,demo160,real-demo,real-minimind3",
                        help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--real-prompts", type=int, default=2, help="prompts of real-minimind3 on CPU (G=4 each)")
    parser.add_argument("--amp", default="auto", choices=["auto", "none", "bf16"],
                        help="autocast; auto = bf16 autocast over fp32 weights on GPU, none on CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if args.quick:
        names, args.repeats, args.warmup = names[:1], 1, 0
    if args.dtype == "auto":
        args.dtype = "float32"
    device, dtype = setup(args)
    use_amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16) if use_amp else nullcontext()

    results = [run_workload(name, args, device, dtype, amp) for name in names]
    print_table(f"Replay + K={K} updates per rollout, prefix sharing off vs on (median of {args.repeats}; seconds)",
                ["workload", "rows", "P", "C", "plain replay", "plain update", "shared replay", "shared update",
                 "rollout speed-up", "plain peak MiB", "shared peak MiB", "max |dlogp|"],
                [[r["workload"], r["rows"], r["prompt_len"], r["completion_len"], r["plain"]["replay_s"],
                  r["plain"]["update_s"], r["shared"]["replay_s"], r["shared"]["update_s"], r["speedup"],
                  r["plain"]["update_peak_mib"], r["shared"]["update_peak_mib"], r["max_abs_logp_difference"]]
                 for r in results])
    targets = []
    for r in results:
        demo = r["workload"].startswith("demo")
        need = TARGET_DEMO_SPEEDUP if demo else 1.0
        targets.append({"name": f"{r['workload']}: replay + {K} updates, shared vs plain",
                        "measured": f"{r['speedup']:.2f}x", "target": f">= {need:g}x",
                        "pass": None if args.quick else r["speedup"] >= need})
        if r["plain"]["update_peak_mib"] and r["shared"]["update_peak_mib"]:
            targets.append({"name": f"{r['workload']}: update peak memory, shared vs plain",
                            "measured": f"{r['memory_ratio']:.2f}x", "target": "<= 1.00x",
                            "pass": None if args.quick else r["memory_ratio"] <= 1.0})
    print_targets(targets)
    payload = {"benchmark": "policy_pass", "what": "prefix-shared vs plain policy passes; see the docstring",
               "quick": args.quick, "environment": environment(device), "amp": "bf16" if use_amp else "none",
               "settings": {k: v for k, v in vars(args).items() if k != "output"}, "results": results,
               "targets": targets}
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
