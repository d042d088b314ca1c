"""Model FLOP utilisation of the update and the rollout against this machine's measured matmul peak.

What is measured
----------------
* Peak: the best rate of a large dense square matmul timed here (``torch.mm``; fp32 on CPU,
  size 2048 by default; bf16 on GPU, size 8192; ``--matmul-dtype``/``--matmul-size`` to change),
  ``2 * n**3`` FLOPs a call. On a GPU the fp32 (TF32 allowed) rate is reported too, for reference.
* Update: ``6 * N * tokens / seconds`` of forward + loss + backward (``update.py``'s ``update``
  phase, N = active parameters with the tied embedding once, tokens = rows x (prompt + completion)).
* Rollout: ``2 * N * tokens / seconds`` of the batched multi-turn rollout (``rollout.py``,
  scripted turns, distinct prompts), with tokens = the positions every forward computes (prompts,
  tool turns and decode steps, pads included); the decode-only figure counts the generated tokens
  alone.

MFU = achieved / peak. Either measures both workloads itself (one setting each), or takes the
achieved rates from earlier ``update.py`` / ``rollout.py`` JSON outputs (``--update-json``,
``--rollout-json``), so that ``run_all.sh`` does not run them twice. The 6N/2N rules ignore
attention's own FLOPs (small at these lengths) and count the LM head for every token although the
update's fused head scores completion tokens only; they are the usual approximations.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rollout as bench  # noqa: E402
import torch  # noqa: E402
import update  # noqa: E402
from _common import (  # noqa: E402
    DTYPES,
    PRESETS,
    build_model,
    common_parser,
    environment,
    matmul_peak,
    print_table,
    setup,
    write_json,
)
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from minimind_trl.conversation import task_prompt  # noqa: E402
from minimind_trl.data import generate_tasks  # noqa: E402
from minimind_trl.envs.protocol import prompt_ids_for  # noqa: E402
from minimind_trl.envs.tools import default_registry  # noqa: E402
from minimind_trl.objectives import ObjectiveConfig  # noqa: E402
from minimind_trl.tokenization import load_tokenizer  # noqa: E402


def measure_update(preset: str, device: torch.device, args: Any) -> dict[str, Any]:
    use_amp = device.type == "cuda" and not args.no_amp
    model, info = build_model(preset, device, torch.float32, seed=args.seed)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16) if use_amp else nullcontext()

    batch = update.make_batch(args.prompts, args.group_size, args.prompt_len, args.completion_len,
                              model.config.vocab_size, device, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    phases = update.phase_timings(model, batch, ObjectiveConfig.preset("grpo"), optimizer, amp, device,
                                  args.repeats, 1, memory=False, names=("replay", "update"))
    tokens = args.prompts * args.group_size * (args.prompt_len + args.completion_len)
    n = info["active_parameters"]
    out = {"source": "measured", "preset": preset, "active_parameters": n, "tokens": tokens,
           "amp": "bf16" if use_amp else "none"}
    for name, factor in (("update", 6.0), ("replay", 2.0)):
        out[f"{name}_s"] = phases[name]["median_s"]
        out[f"{name}_flops_per_s"] = factor * n * tokens / phases[name]["median_s"]
    del model, optimizer
    return out


def measure_rollout(preset: str, device: torch.device, dtype: torch.dtype, args: Any) -> dict[str, Any]:
    tokenizer, registry = load_tokenizer(), default_registry()
    model, info = build_model(preset, device, dtype, seed=args.seed)
    tasks = generate_tasks(args.batch_size, args.seed)
    prompts = [prompt_ids_for(tokenizer, *task_prompt(task)) for task in tasks]
    scripts = [[tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                for text in bench.turn_scripts(task, registry, args.tool_turns, 0)] for task in tasks]
    n = info["active_parameters"]
    for _ in range(2):  # the first is a warm-up
        result, _ = bench.run_case("batched", model, tokenizer, tasks, 1, registry, scripts, prompts, args.tool_turns,
                                   args.batch_size, 256, device, n)
    return {"source": "measured", "preset": preset, "active_parameters": n, "batch_size": args.batch_size,
            "tool_turns": args.tool_turns, "dtype": info["dtype"], "seconds": result["seconds"],
            "flops_per_s": result["achieved_flops_per_s"], "decode_flops_per_s": result["decode_flops_per_s"]}


def from_update_json(path: str) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    phases = data["phases"]
    return {"source": path, "preset": data["model"]["preset"], "active_parameters": data["model"]["active_parameters"],
            "tokens": data["batch"]["tokens"], "amp": data["model"].get("amp"),
            "update_s": phases["update"]["median_s"], "update_flops_per_s": phases["update"]["achieved_flops_per_s"],
            "replay_s": phases["replay"]["median_s"], "replay_flops_per_s": phases["replay"]["achieved_flops_per_s"]}


def from_rollout_json(path: str) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    batched = [r for r in data["results"] if r["kind"] == "batched"]
    best = max(batched, key=lambda r: (r.get("samples_per_task", 1) == 1, r["batch_size"], r["tool_turns"]))
    return {"source": path, "preset": data["model"]["preset"], "active_parameters": data["model"]["active_parameters"],
            "batch_size": best["batch_size"], "tool_turns": best["tool_turns"], "dtype": data["model"]["dtype"],
            "seconds": best["seconds"], "flops_per_s": best["achieved_flops_per_s"],
            "decode_flops_per_s": best["decode_flops_per_s"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                        help="auto = demo on CPU, minimind-3 on GPU")
    parser.add_argument("--matmul-size", type=int, default=None, help="square matmul size (default 2048 CPU, 8192 GPU)")
    parser.add_argument("--matmul-dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto = float32 on CPU, bfloat16 on GPU")
    parser.add_argument("--update-json", default=None, help="take the update rate from this update.py output")
    parser.add_argument("--rollout-json", default=None, help="take the rollout rate from this rollout.py output")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="rollout batch size")
    parser.add_argument("--tool-turns", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-amp", action="store_true", help="no bf16 autocast for the update on GPU")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.prompts, args.group_size, args.prompt_len, args.completion_len = "tiny", 2, 2, 8, 8
        args.batch_size, args.repeats, args.matmul_size = 2, 1, args.matmul_size or 1024
    device, dtype = setup(args)
    preset = args.preset if args.preset != "auto" else ("minimind-3" if device.type == "cuda" else "demo")
    mm_dtype = None if args.matmul_dtype == "auto" else DTYPES[args.matmul_dtype]
    quick_time = 0.0 if args.quick else 1.0

    peak = matmul_peak(device, mm_dtype, args.matmul_size, min_time=quick_time)
    peaks = {"main": peak}
    if device.type == "cuda" and peak["dtype"] != "float32":
        peaks["float32_tf32"] = matmul_peak(device, torch.float32, args.matmul_size, min_time=quick_time)
    print(f"matmul peak on {device}: {peak['peak_flops_per_s'] / 1e9:,.1f} GFLOP/s "
          f"({peak['dtype']}, {peak['size']}x{peak['size']}, {peak['threads']} threads)")

    upd = from_update_json(args.update_json) if args.update_json else measure_update(preset, device, args)
    rol = from_rollout_json(args.rollout_json) if args.rollout_json else measure_rollout(preset, device, dtype, args)
    best = peak["peak_flops_per_s"]
    rows = [
        ["update (6N, fwd+bwd)", upd["preset"], upd["update_flops_per_s"] / 1e9, upd["update_flops_per_s"] / best],
        ["replay (2N, no grad)", upd["preset"], upd["replay_flops_per_s"] / 1e9, upd["replay_flops_per_s"] / best],
        ["rollout (2N, prefill+decode)", rol["preset"], rol["flops_per_s"] / 1e9, rol["flops_per_s"] / best],
        ["rollout (2N, decode only)", rol["preset"], rol["decode_flops_per_s"] / 1e9, rol["decode_flops_per_s"] / best],
    ]
    print_table(f"MFU against the measured {peak['dtype']} matmul peak ({best / 1e9:,.1f} GFLOP/s)",
                ["workload", "preset", "GFLOP/s", "MFU"], rows)
    payload = {
        "benchmark": "mfu",
        "quick": args.quick,
        "environment": environment(device),
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "matmul_peak": peaks,
        "update": {**upd, "mfu": upd["update_flops_per_s"] / best, "replay_mfu": upd["replay_flops_per_s"] / best},
        "rollout": {**rol, "mfu": rol["flops_per_s"] / best, "decode_mfu": rol["decode_flops_per_s"] / best},
    }
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
