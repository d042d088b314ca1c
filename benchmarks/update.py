"""Cost of the policy update: forward+backward tokens/s, old-log-prob replay, our loss vs TRL's.

What is measured
----------------
A random-weight MiniMind scores random completions (``rows = prompts x group size`` rows of
``prompt_len + completion_len`` random token ids, all unmasked), the way the trainer does: TRL's
fused LM head (``trl.trainer.utils.add_fused_lm_head``) returns per-token log-probs and entropies
of the completion tokens only. Phases (each timed with a device sync, median of ``--repeats``):

* ``replay``: the no-grad old-log-prob pass (what the trainer runs once per rollout for K > 1);
* ``update``: forward + ``minimind_trl.objectives.compute_policy_loss`` + backward;
* ``optimizer``: one AdamW step on the resulting gradients;
* ``step``: zero_grad + update + optimizer step.

Loss overhead: our ``compute_policy_loss`` (``--objective``, default grpo) against TRL's stock
GRPO loss, i.e. ``trl.GRPOTrainer._compute_loss`` itself (``loss_type="grpo"``, token-level
ratio, epsilon 0.2, beta 0, its diagnostics included) called on a minimal stand-in for the
trainer whose log-prob function returns the same tensors, on identical inputs (old log-probs =
current ones + N(0, 0.1) noise so that clipping happens). Timed: the loss alone (forward; and
forward + backward into a leaf tensor), and the full step (model forward + loss + backward).
The two losses agree numerically for grpo (checked, ``loss_abs_diff``).

Memory: peak RSS on CPU (VmHWM, reset per phase), ``torch.cuda.max_memory_allocated`` on GPU,
per phase. Scaling grid: update time and peak memory over completion lengths x group sizes, with
``numpy.polyfit`` slopes (seconds and MiB per completion token / per row) and log-log exponents.
FLOP/s: ``6 * N * tokens`` for the update and ``2 * N * tokens`` for the replay (N = active
parameters, tied embedding once; tokens = rows x (prompt + completion)).

Target: our loss within 5% of TRL's stock loss time (loss alone and full step).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import (  # noqa: E402
    PRESETS,
    PeakMemory,
    build_model,
    common_parser,
    environment,
    fit_line,
    int_list,
    measure,
    measure_interleaved,
    print_table,
    print_targets,
    setup,
    write_json,
)
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from minimind_trl.objectives import ObjectiveConfig, PolicyBatch, compute_advantages, compute_policy_loss  # noqa: E402

TARGET_LOSS_OVERHEAD = 0.05


# ------------------------------------------------------------------------------------- inputs


def make_batch(prompts: int, group_size: int, prompt_len: int, completion_len: int, vocab: int,
               device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Random prompt/completion ids (ids >= 21: no special tokens), full masks, z-score advantages."""
    generator = torch.Generator().manual_seed(seed)
    rows = prompts * group_size
    prompt = torch.randint(21, vocab, (prompts, prompt_len), generator=generator).repeat_interleave(group_size, 0)
    completion = torch.randint(21, vocab, (rows, completion_len), generator=generator)
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    batch = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": torch.ones_like(completion),
        "advantages": compute_advantages(rewards, group_size, "zscore"),
    }
    return {k: v.to(device) for k, v in batch.items()}


def policy_logps(model: Any, batch: dict[str, torch.Tensor], amp: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies [B, C] of the completion tokens (fused LM head)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-keep] = -100
    with amp():
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


# ------------------------------------------------------------------------------- TRL stock loss


class _SingleProcess:
    """What TRL's ``_compute_loss`` asks of the accelerator, for one process (identity)."""

    num_processes = 1

    @staticmethod
    def gather(tensor):
        return tensor

    gather_for_metrics = gather

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def trl_stock_loss(model: Any, forward: Any, epsilon: float = 0.2) -> Any:
    """``f(inputs) -> loss``: ``trl.GRPOTrainer._compute_loss`` (loss_type grpo, token-level
    ratio, beta 0) on a stand-in trainer whose log-prob function is ``forward()``."""
    fake = types.SimpleNamespace(
        model=model,
        accelerator=_SingleProcess(),
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False),
        loss_type="grpo",
        importance_sampling_level="token",
        epsilon_low=epsilon,
        epsilon_high=epsilon,
        beta=0.0,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (*forward(), None),
    )

    def loss(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        fake._metrics["train"].clear()
        return GRPOTrainer._compute_loss(fake, model, inputs)

    return loss


def our_loss(config: Any, forward: Any) -> Any:
    """``f(inputs) -> loss``: ``compute_policy_loss`` on ``forward()``'s log-probs."""
    def loss(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        logps, _ = forward()
        mask = inputs["completion_mask"].bool()
        return compute_policy_loss(PolicyBatch(logps, inputs["old_per_token_logps"], inputs["advantages"], mask),
                                   config).loss

    return loss


# ------------------------------------------------------------------------------------ phases


def phase_timings(model: Any, batch: dict[str, torch.Tensor], config: Any, optimizer: Any, amp: Any,
                  device: torch.device, repeats: int, warmup: int, memory: bool = True,
                  names: tuple[str, ...] = ("replay", "update", "optimizer", "step")) -> dict[str, Any]:
    """Replay, update (fwd + loss + bwd), optimizer and full-step timings and peak memory."""
    mask = batch["completion_mask"].bool()
    model.train()
    with torch.no_grad():
        old, _ = policy_logps(model, batch, amp)
    old = old.detach()

    def replay():
        with torch.no_grad():
            policy_logps(model, batch, amp)

    def update():
        model.zero_grad(set_to_none=True)
        logps, _ = policy_logps(model, batch, amp)
        compute_policy_loss(PolicyBatch(logps, old, batch["advantages"], mask), config).loss.backward()

    def opt_step():
        optimizer.step()

    def step():
        update()
        optimizer.step()

    out: dict[str, Any] = {}
    for name, fn in (("replay", replay), ("update", update), ("optimizer", opt_step), ("step", step)):
        if name not in names:
            continue
        out[name] = measure(fn, device, repeats=repeats, warmup=warmup)
        if memory:  # one more call, from no gradients (the optimizer step: from fresh ones)
            model.zero_grad(set_to_none=True)
            if name == "optimizer":
                update()
            with PeakMemory(device) as mem:
                fn()
            out[name]["memory"] = mem.as_dict()
    model.zero_grad(set_to_none=True)
    return out


def loss_comparison(model: Any, batch: dict[str, torch.Tensor], objective: str, amp: Any,
                    device: torch.device, repeats: int, warmup: int, min_time: float) -> dict[str, Any]:
    """Our ``compute_policy_loss`` vs TRL's stock ``_compute_loss`` on identical inputs."""
    config = ObjectiveConfig.preset(objective)
    model.train()
    with torch.no_grad():
        logps0, entropy0 = policy_logps(model, batch, amp)
    generator = torch.Generator().manual_seed(1)
    noise = 0.1 * torch.randn(logps0.shape, generator=generator).to(logps0.device, logps0.dtype)
    inputs = {**batch, "old_per_token_logps": (logps0 + noise).float()}
    leaf = logps0.detach().float().clone().requires_grad_(True)
    entropy = entropy0.detach().float()

    def leaf_forward():
        return leaf, entropy

    def model_forward():
        return policy_logps(model, batch, amp)

    losses = {
        "ours": (our_loss(config, leaf_forward), our_loss(config, model_forward)),
        "trl": (trl_stock_loss(model, leaf_forward), trl_stock_loss(model, model_forward)),
    }
    values, grads = {}, {}
    for name, (loss_leaf, _) in losses.items():
        leaf.grad = None
        value = loss_leaf(inputs)
        value.backward()
        values[name], grads[name] = float(value.detach()), leaf.grad.detach().clone()
    leaf.grad = None

    result: dict[str, Any] = {"objective": objective,
                              "trl_reference": "trl.GRPOTrainer._compute_loss, loss_type='grpo'",
                              "loss_ours": values["ours"], "loss_trl": values["trl"],
                              "loss_abs_diff": abs(values["ours"] - values["trl"]),
                              "grad_max_abs_diff": float((grads["ours"] - grads["trl"]).abs().max()),
                              "ours": {}, "trl": {}}

    def forward_only(loss_leaf):
        with torch.no_grad():
            loss_leaf(inputs)

    def forward_backward(loss_leaf):
        leaf.grad = None
        loss_leaf(inputs).backward()

    def full(loss_model):
        model.zero_grad(set_to_none=True)
        loss_model(inputs).backward()

    kinds = (("loss_forward", forward_only, 0, min_time), ("loss_forward_backward", forward_backward, 0, min_time),
             ("full_step", full, 1, 0.0))
    for key, run, which, at_least in kinds:
        fns = {name: (lambda run=run, f=pair[which]: run(f)) for name, pair in losses.items()}
        for name, timing in measure_interleaved(fns, device, repeats=repeats, warmup=warmup,
                                                min_time=at_least).items():
            result[name][key] = timing
    model.zero_grad(set_to_none=True)
    for key in ("loss_forward", "loss_forward_backward", "full_step"):
        result[f"{key}_ratio"] = result["ours"][key]["median_s"] / result["trl"][key]["median_s"]
    return result


def scaling_grid(model: Any, vocab: int, prompts: int, prompt_len: int, lengths: list[int], groups: list[int],
                 config: Any, optimizer: Any, amp: Any, device: torch.device, repeats: int, warmup: int,
                 n_params: int, seed: int) -> dict[str, Any]:
    """Update (and replay) time and peak memory over completion lengths x group sizes, with fits."""
    points = []
    for group in groups:
        for length in lengths:
            batch = make_batch(prompts, group, prompt_len, length, vocab, device, seed)
            timings = phase_timings(model, batch, config, optimizer, amp, device, repeats, warmup, memory=False,
                                    names=("replay", "update"))
            with PeakMemory(device) as mem:
                model.zero_grad(set_to_none=True)
                logps, _ = policy_logps(model, batch, amp)
                compute_policy_loss(PolicyBatch(logps, logps.detach(), batch["advantages"],
                                                batch["completion_mask"].bool()), config).loss.backward()
            model.zero_grad(set_to_none=True)
            tokens = prompts * group * (prompt_len + length)
            points.append({"group_size": group, "completion_len": length, "rows": prompts * group,
                           "tokens": tokens, "update_s": timings["update"]["median_s"],
                           "replay_s": timings["replay"]["median_s"],
                           "update_tokens_per_s": tokens / timings["update"]["median_s"],
                           "update_flops_per_s": 6.0 * n_params * tokens / timings["update"]["median_s"],
                           "update_peak_mib": mem.peak_mib, "update_delta_mib": mem.delta_mib})
    mid_group = groups[len(groups) // 2]
    mid_length = lengths[len(lengths) // 2]
    by_length = [p for p in points if p["group_size"] == mid_group]
    by_group = [p for p in points if p["completion_len"] == mid_length]
    fits = {
        f"update_s_vs_completion_len_at_G{mid_group}": fit_line([p["completion_len"] for p in by_length],
                                                                [p["update_s"] for p in by_length]),
        f"update_s_vs_group_size_at_L{mid_length}": fit_line([p["group_size"] for p in by_group],
                                                            [p["update_s"] for p in by_group]),
        f"update_delta_mib_vs_completion_len_at_G{mid_group}": fit_line(
            [p["completion_len"] for p in by_length], [p["update_delta_mib"] or 0.0 for p in by_length]),
        f"update_delta_mib_vs_group_size_at_L{mid_length}": fit_line(
            [p["group_size"] for p in by_group], [p["update_delta_mib"] or 0.0 for p in by_group]),
        "update_s_vs_tokens": fit_line([p["tokens"] for p in points], [p["update_s"] for p in points]),
        "update_delta_mib_vs_tokens": fit_line([p["tokens"] for p in points],
                                               [p["update_delta_mib"] or 0.0 for p in points]),
    }
    return {"prompts": prompts, "prompt_len": prompt_len, "points": points, "fits": fits}


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                        help="MiniMind size (random weights); auto = demo on CPU, minimind-3 on GPU")
    parser.add_argument("--objective", default="grpo", help="our objective preset (grpo, cispo, dr_grpo, gspo)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per batch")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--grid-completion-lens", type=int_list, default=[64, 128, 256])
    parser.add_argument("--grid-group-sizes", type=int_list, default=[4, 8, 16])
    parser.add_argument("--no-grid", action="store_true", help="skip the scaling grid")
    parser.add_argument("--amp", default="auto", choices=["auto", "none", "bf16"],
                        help="autocast; auto = bf16 autocast over fp32 weights on GPU, none on CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--loss-min-time", type=float, default=1.0,
                        help="seconds to spend at least on each loss-only timing (they are short)")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.prompts, args.group_size, args.prompt_len, args.completion_len = "tiny", 2, 2, 8, 8
        args.grid_completion_lens, args.grid_group_sizes, args.repeats, args.loss_min_time = [8, 16], [2, 4], 1, 0.1
    if args.dtype == "auto":
        args.dtype = "float32"  # master weights; mixed precision through --amp
    device, dtype = setup(args)
    preset = args.preset if args.preset != "auto" else ("minimind-3" if device.type == "cuda" else "demo")
    use_amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16) if use_amp else nullcontext()


    model, model_info = build_model(preset, device, dtype, seed=args.seed)
    model_info["amp"] = "bf16" if use_amp else "none"
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    n_params = model_info["active_parameters"]
    vocab = model.config.vocab_size
    config = ObjectiveConfig.preset(args.objective)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch = make_batch(args.prompts, args.group_size, args.prompt_len, args.completion_len, vocab, device, args.seed)
    rows = args.prompts * args.group_size
    tokens = rows * (args.prompt_len + args.completion_len)
    print(f"update benchmark: {preset} ({n_params:,} parameters, {model_info['dtype']}, amp {model_info['amp']}) "
          f"on {device}; {rows} rows x ({args.prompt_len} + {args.completion_len}) tokens, objective {args.objective}")

    phases = phase_timings(model, batch, config, optimizer, amp, device, args.repeats, args.warmup)
    flops = {"update": 6.0, "replay": 2.0, "step": 6.0}
    table = []
    for name, timing in phases.items():
        seconds = timing["median_s"]
        timing["tokens_per_s"] = tokens / seconds if name != "optimizer" else None
        timing["achieved_flops_per_s"] = flops[name] * n_params * tokens / seconds if name in flops else None
        table.append([name, seconds, timing["min_s"], timing["tokens_per_s"],
                      None if timing["achieved_flops_per_s"] is None else timing["achieved_flops_per_s"] / 1e9,
                      timing["memory"]["peak_mib"], timing["memory"]["delta_mib"]])
    replay_ratio = phases["replay"]["median_s"] / phases["update"]["median_s"]
    print_table(f"Phases ({tokens:,} tokens a batch; median of {args.repeats})",
                ["phase", "median s", "min s", "tokens/s", "GFLOP/s", "peak MiB", "delta MiB"], table)
    print(f"old-log-prob replay / update (fwd+bwd): {replay_ratio:.3f}; "
          f"replay / full step: {phases['replay']['median_s'] / phases['step']['median_s']:.3f}")

    comparison = loss_comparison(model, batch, args.objective, amp, device, args.repeats, args.warmup,
                                 args.loss_min_time)
    print_table(f"Our loss ({args.objective}) vs TRL stock GRPO loss, identical inputs (median s)",
                ["timing", "ours", "TRL", "ours / TRL"],
                [[key, comparison["ours"][key]["median_s"], comparison["trl"][key]["median_s"],
                  comparison[f"{key}_ratio"]] for key in ("loss_forward", "loss_forward_backward", "full_step")])
    print(f"loss values: ours {comparison['loss_ours']:.6g}, TRL {comparison['loss_trl']:.6g} "
          f"(|diff| {comparison['loss_abs_diff']:.2g}; max |grad diff| {comparison['grad_max_abs_diff']:.2g})")

    grid = None
    if not args.no_grid:
        grid = scaling_grid(model, vocab, args.prompts, args.prompt_len, args.grid_completion_lens,
                            args.grid_group_sizes, config, optimizer, amp, device, args.repeats, args.warmup,
                            n_params, args.seed)
        print_table("Scaling grid (update = fwd + loss + bwd; delta = peak minus level before)",
                    ["G", "L", "rows", "tokens", "update s", "replay s", "tokens/s", "peak MiB", "delta MiB"],
                    [[p["group_size"], p["completion_len"], p["rows"], p["tokens"], p["update_s"], p["replay_s"],
                      p["update_tokens_per_s"], p["update_peak_mib"], p["update_delta_mib"]]
                     for p in grid["points"]])
        print_table("Fits (numpy.polyfit, degree 1; exponent from log-log)",
                    ["fit", "slope", "intercept", "exponent"],
                    [[name, f["slope"], f["intercept"], f["loglog_exponent"]] for name, f in grid["fits"].items()])

    targets = []
    for key, label in (("loss_forward_backward", "loss alone (fwd+bwd)"), ("full_step", "full step")):
        ratio = comparison[f"{key}_ratio"]
        targets.append({"name": f"our loss vs TRL stock loss, {label}", "measured": f"{ratio:.3f}x",
                        "target": f"<= {1 + TARGET_LOSS_OVERHEAD:.2f}x", "pass": ratio <= 1 + TARGET_LOSS_OVERHEAD})
    if args.objective == "grpo":
        same = comparison["loss_abs_diff"] <= 1e-5 * max(1.0, abs(comparison["loss_trl"]))
        targets.append({"name": "our grpo loss equals TRL's on identical inputs",
                        "measured": f"|diff| {comparison['loss_abs_diff']:.2g}", "target": "<= 1e-5",
                        "pass": same})
    print_targets(targets)

    payload = {
        "benchmark": "update",
        "what": "policy update cost on random completions; see the module docstring",
        "quick": args.quick,
        "environment": environment(device),
        "model": {**model_info, "preset": preset},
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "batch": {"rows": rows, "tokens": tokens, "prompt_len": args.prompt_len,
                  "completion_len": args.completion_len},
        "objective": dataclasses.asdict(config),
        "phases": phases,
        "replay_over_update": replay_ratio,
        "replay_over_step": phases["replay"]["median_s"] / phases["step"]["median_s"],
        "loss_comparison": comparison,
        "grid": grid,
        "targets": targets,
    }
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
