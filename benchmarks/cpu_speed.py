"""RL on a CPU: precision, threads, side-by-side jobs, where bf16's time goes, evaluation by batch
size, and the full demo's projected wall time (issue 37 item 5). Prints tables, writes JSON.

What is measured (each training configuration in a fresh child process, so the thread count is
set before torch loads; the demo RL recipe from the demo's SFT start, learning rate 0 so every
rollout samples the start's policy and all configurations do comparable work):

* ``rollout``    seconds per rollout (generation: the trainer's ``rollout_seconds``; update:
                 ``update_seconds``; medians over the rollouts after the first) for fp32 and bf16
                 (``training.bf16``) on 1 and 2 threads;
* ``oldpass``    the old-log-prob pass of one replay rollout, in one process, alternating: the
                 separate pass over every micro-batch with entropies (before session 22) against
                 this code's (update 0's micro-batches keep their own log-probs; no entropies),
                 bf16 as ``training.bf16: auto`` picks, 1 and 2 threads; medians of 5 repeats,
                 and each one's share of the rollout measured in the same process;
* ``attention``  the update's forward and backward over one rollout's micro-batches, in one process,
                 in rotated order: fp32, bf16, and bf16 with the shared pass's attention in fp32
                 (``training.cast_attention_to_fp32``), 1 and 2 threads; medians of 6 repeats;
* ``head``       the same forward and backward over one rollout with the LM head's log-probs as
                 TRL's chunked kernel computes them on a CPU (before session 24) and as this code's
                 CPU head does (``minimind_trl.trainer.head_logprobs``: the same numbers), fp32 and
                 bf16, 1 and 2 threads, rotated order, medians of 6; the log-probs and gradients of
                 both heads must be identical;
* ``jobs``       one 2-thread job against two 1-thread jobs side by side (``sweep --jobs 2``):
                 rollouts per minute of the machine;
* ``matmul``     GFLOP/s of the demo model's MLP and LM-head matmuls, fp32 and bf16, 1 and 2 threads
                 (the peak the update could reach);
* ``profile``    where a bf16 update and decode spend their time (torch profiler, ops grouped:
                 matmul, attention, casts, log-softmax, elementwise, indexing, other), the matmul
                 share against the measured bf16 peak;
* ``eval``       frozen greedy evaluation of the demo SFT checkpoint on the test split by batch size
                 (wall and CPU seconds; the texts must be identical across batch sizes);
* ``projection`` the full demo (12 RL runs x 60 rollouts, 13 evaluations of 600 questions) from the
                 figures above: as it ran before (fp32, 2 threads, one job at a time, eval batch 50)
                 and with the defaults (``training.bf16: auto``, ``--jobs 2``, the best eval batch).

Usage: ``python benchmarks/cpu_speed.py --demo runs/demo [--parts rollout,jobs,...] [--steps 5]
[--output out.json]``. ``--quick``: the smoke recipe on a tiny model and generated data, two steps,
a few questions (checks that the script runs; not a measurement). Measure on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import REPO, environment, print_table, write_json  # noqa: E402

from minimind_trl.trainer import policy_pass  # noqa: E402
from minimind_trl.trainer.head_logprobs import trl_log_probs  # noqa: E402
from minimind_trl.trainer.precision import cpu_bf16_instructions  # noqa: E402
from minimind_trl.trainer.rollout_state import ReplayPosition  # noqa: E402

PARTS = ("rollout", "oldpass", "attention", "head", "jobs", "matmul", "profile", "eval", "projection")
FULL_DEMO = {"runs": 12, "rollouts": 60, "evaluations": 13, "questions": 600}  # demo --full-rl, K = 1
REFERENCE_PRETRAIN_SFT_S = 447.0 + 144.0  # minimind_trl.demo.REFERENCE_SECONDS: pretrain + SFT
OP_GROUPS = {  # profiler op name -> group (first match by substring)
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"),
    "attention": ("scaled_dot_product", "flash_attention", "aten::_softmax", "aten::softmax"),
    "casts": ("aten::copy_", "aten::_to_copy", "aten::to"),
    "log_softmax": ("ChunkedLogProb", "aten::_log_softmax", "aten::log_softmax", "aten::exp", "aten::logsumexp"),
    "indexing": ("aten::index", "aten::gather", "aten::scatter", "aten::index_put", "aten::_index_put_impl_"),
    "elementwise": ("aten::mul", "aten::add", "aten::sub", "aten::div", "aten::pow", "aten::silu", "aten::rsqrt",
                    "aten::neg", "aten::cat", "aten::where", "aten::fill_", "aten::sum", "aten::mean"),
}


# ------------------------------------------------------------------------------ child processes


STEP_FIELDS = ("rollout", "update", "rollout_seconds", "old_logp_seconds", "update_seconds", "completion_tokens_mean",
               "onpolicy/logp_abs_diff_mean")


def _recipe(config: dict) -> dict:
    """The resolved recipe a child trains: the demo RL recipe (or the smoke one), frozen."""
    from minimind_trl.trainer.recipe import load_recipe

    overrides = [*config["overrides"], f"training.bf16={str(config['bf16']).lower()}",
                 f"training.max_steps={config['steps']}", "training.learning_rate=0", "training.save_strategy=no",
                 "training.disable_tqdm=true", "training.warmup_steps=0"]
    return load_recipe(config["recipe"], overrides)


def _trainer(config: dict, out: str):
    """The trainer a child runs: the resolved recipe's split, model and tokenizer, writing to ``out``."""
    from minimind_trl.trainer import build

    recipe = _recipe(config)
    rows, _ = build.load_split(recipe["data"])
    return build.build_trainer(recipe, build.training_config(recipe, out), build.build_model(recipe["model"]),
                               build.build_tokenizer(recipe), rows)


def child_rollout(config: dict) -> dict:
    """Train ``config['steps']`` frozen steps; per step the trainer's own phase timings."""
    from minimind_trl.trainer.recorder import read_metrics

    if config.get("head") == "trl":  # this child process only
        policy_pass.lm_head_log_probs = trl_log_probs
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(config, out)
        profile = config.get("profile")
        started = time.perf_counter()
        if profile:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                trainer.train()
            groups = _group_ops(prof.key_averages())
        else:
            trainer.train()
            groups = None
        wall = time.perf_counter() - started
        records = read_metrics(Path(out) / "metrics.jsonl")
    return {"threads": torch.get_num_threads(), "mixed_precision": trainer.accelerator.mixed_precision,
            "wall_s": wall, "steps": [{k: r.get(k) for k in STEP_FIELDS} for r in records], "profile": groups}


def child_oldpass(config: dict) -> dict:
    """Train ``config['steps']`` frozen steps, then time the old-log-prob pass over the last
    rollout's buffer both ways, alternating (``config['repeats']`` each): ``separate`` scores every
    micro-batch with entropies, ``kept`` only those first served after an optimizer step (what
    :meth:`_freeze_old_logps` runs now)."""
    from minimind_trl.trainer.recorder import read_metrics

    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(config, out)
        trainer.train()
        records = read_metrics(Path(out) / "metrics.jsonl")
    buffer, model = trainer._buffered_inputs, trainer.model_wrapped
    trainer.step_state.position = ReplayPosition.of_micro_step(0, trainer.args)  # as when a rollout is frozen
    kept = trainer._old_pass_indices(len(buffer))
    ways = {"separate": (range(len(buffer)), True), "kept": (kept, False)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with torch.no_grad():
        for _ in range(config["repeats"]):
            for name, (indices, entropy) in ways.items():
                started = time.perf_counter()
                for index in indices:
                    trainer._policy_forward(model, buffer[index], keep_topk=True, compute_entropy=entropy)
                seconds[name].append(time.perf_counter() - started)
    rollout = per_rollout({"steps": [{k: r.get(k) for k in STEP_FIELDS} for r in records]})["rollout_s"]
    return {"threads": torch.get_num_threads(), "mixed_precision": trainer.accelerator.mixed_precision,
            "micro_batches": len(buffer), "kept_micro_batches": len(kept), "rollout_s": rollout,
            **{f"{name}_s": statistics.median(values) for name, values in seconds.items()}}


def child_attention(config: dict) -> dict:
    """Train ``config['steps']`` frozen bf16 steps, then time forward + backward of every micro-batch
    of the last rollout's buffer (one pass over the rollout: an update without its optimizer step),
    three ways in :func:`_rotated_passes` (the machine's speed drifts by ~10% within a minute, and a
    fixed order showed position effects): ``fp32`` (autocast off), ``bf16`` and
    ``bf16_fp32_attention`` (``cast_attention_to_fp32``); ``config['repeats']`` each, medians."""
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer({**config, "bf16": True}, out)
        trainer.train()
    autocast = trainer.accelerator.autocast
    ways = {"fp32": (contextlib.nullcontext, False), "bf16": (autocast, False), "bf16_fp32_attention": (autocast, True)}

    def setup(name: str) -> None:
        trainer.accelerator.autocast, trainer.args.cast_attention_to_fp32 = ways[name]

    try:
        seconds, _ = _rotated_passes(trainer, list(ways), setup, config["repeats"])
    finally:  # the trainer's own autocast and setting back, whatever happened
        trainer.accelerator.autocast, trainer.args.cast_attention_to_fp32 = autocast, False
    return {"threads": torch.get_num_threads(), "micro_batches": len(trainer._buffered_inputs),
            **{f"{name}_s": value for name, value in seconds.items()}}


def _rotated_passes(trainer, names: list[str], setup, repeats: int) -> tuple[dict[str, float], dict[str, tuple]]:
    """Forward + backward over every micro-batch of the trainer's last rollout buffer, once per
    way and repeat, the order rotated each repeat (the machine's speed drifts; a fixed order showed
    position effects); ``setup(name)`` switches the trainer to a way first. Returns each way's
    median seconds and its last micro-batch's (log-probs, parameter gradients)."""
    buffer, model = trainer._buffered_inputs, trainer.model_wrapped
    seconds: dict[str, list[float]] = {name: [] for name in names}
    last: dict[str, tuple] = {}
    model.train()
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            setup(name)
            started = time.perf_counter()
            for batch in buffer:
                logps = trainer._policy_forward(model, batch)[0]
                logps.sum().backward()
            seconds[name].append(time.perf_counter() - started)
            last[name] = (logps.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
            model.zero_grad(set_to_none=True)
    return {name: statistics.median(values) for name, values in seconds.items()}, last


def child_head(config: dict) -> dict:
    """As :func:`child_attention`, four ways: {fp32, bf16} x {TRL's chunked kernel, this code's CPU
    head} for the LM head's log-probs; also whether both heads give identical log-probs and
    gradients (the last micro-batch's, each precision)."""
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer({**config, "bf16": True}, out)
        trainer.train()
    autocast, own_head = trainer.accelerator.autocast, policy_pass.lm_head_log_probs
    heads = {"trl": trl_log_probs, "cpu": own_head}
    ways = {f"{precision}_{head}": (precision, head) for precision in ("fp32", "bf16") for head in heads}

    def setup(name: str) -> None:
        precision, head = ways[name]
        trainer.accelerator.autocast = autocast if precision == "bf16" else contextlib.nullcontext
        policy_pass.lm_head_log_probs = heads[head]

    try:
        seconds, last = _rotated_passes(trainer, list(ways), setup, config["repeats"])
    finally:  # the trainer's own autocast and head back, whatever happened
        trainer.accelerator.autocast, policy_pass.lm_head_log_probs = autocast, own_head
    identical = {precision: torch.equal(last[f"{precision}_trl"][0], last[f"{precision}_cpu"][0])
                 and all(torch.equal(a, b) for a, b in zip(last[f"{precision}_trl"][1], last[f"{precision}_cpu"][1]))
                 for precision in ("fp32", "bf16")}
    return {"threads": torch.get_num_threads(), "micro_batches": len(trainer._buffered_inputs),
            "identical": identical, **{f"{name}_s": value for name, value in seconds.items()}}


def _group_ops(averages) -> dict[str, float]:
    """Self CPU seconds per op group (:data:`OP_GROUPS`; ``other`` for the rest)."""
    groups = dict.fromkeys([*OP_GROUPS, "other"], 0.0)
    for event in averages:
        name = event.key
        group = next((g for g, keys in OP_GROUPS.items() if any(k in name for k in keys)), "other")
        groups[group] += event.self_cpu_time_total / 1e6
    return groups


def child_eval(config: dict) -> dict:
    """Greedy evaluation rollouts of ``config['questions']`` test questions at each batch size."""
    from minimind_trl.data.splits import read_split
    from minimind_trl.envs.rollout import rollout
    from minimind_trl.envs.tools import default_registry
    from minimind_trl.modeling.checkpoints import load_checkpoint_tokenizer, load_model, resolve_checkpoint

    info = resolve_checkpoint(config["checkpoint"])
    model, tokenizer = load_model(info, "cpu"), load_checkpoint_tokenizer(info, config.get("tokenizer"))[0]
    tasks = read_split(config["splits"], "test")[: config["questions"]]
    results = []
    for batch in config["batch_sizes"]:
        cpu, wall = time.process_time(), time.perf_counter()
        trajectories = rollout(model, tokenizer, tasks, default_registry(), max_tool_turns=3, max_new_tokens=96,
                               batch_size=batch, progress=False)
        texts = hashlib.sha256("\x00".join(t.text for t in trajectories).encode()).hexdigest()
        results.append({"batch_size": batch, "wall_s": time.perf_counter() - wall,
                        "cpu_s": time.process_time() - cpu, "texts_sha256": texts})
    return {"threads": torch.get_num_threads(), "questions": len(tasks), "results": results}


def spawn(kind: str, config: dict, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    return subprocess.Popen([sys.executable, __file__, "--child", kind, "--config", json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def collect(process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"child failed ({process.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_child(kind: str, config: dict, threads: int) -> dict:
    return collect(spawn(kind, config, threads))


# ------------------------------------------------------------------------------------- the parts


def per_rollout(result: dict) -> dict[str, float]:
    """Median generation and update seconds per rollout, over the rollouts after the first.

    A rollout's update time sums its K optimizer steps (one record each; only update 0 carries the
    generation time), so a recipe with replay is measured per rollout, not per step."""
    rollouts: dict[int, dict] = {}
    for s in result["steps"]:
        row = rollouts.setdefault(s["rollout"], {"generation": 0.0, "update": 0.0, "gap": None})
        row["generation"] += s["rollout_seconds"] or 0.0
        row["update"] += s["update_seconds"] + (s["old_logp_seconds"] or 0.0)
        if s["update"] == 0:
            row["gap"] = s["onpolicy/logp_abs_diff_mean"]
    ordered = [rollouts[k] for k in sorted(rollouts)]
    ordered = ordered[1:] or ordered
    generation = statistics.median(r["generation"] for r in ordered)
    update = statistics.median(r["update"] for r in ordered)
    gaps = [r["gap"] for r in ordered if r["gap"] is not None]
    return {"generation_s": generation, "update_s": update, "rollout_s": generation + update,
            "onpolicy_logp_abs_diff_mean": statistics.fmean(gaps) if gaps else None}


ATTENTIONS = ("sdpa", "eager", "sdpa-fp32", "eager-fp32")
"""``--attention`` values: the kernel (``model.config.attn_implementation``), and with ``-fp32`` the
shared pass's attention cast to fp32 under bf16 (``training.cast_attention_to_fp32``; bf16 rows only,
since in fp32 it changes nothing)."""


HEADS = ("cpu", "trl")
"""``--heads`` values: the LM head's log-probs as this code computes them on a CPU
(``head_logprobs``, the default) or with TRL's chunked kernel (the code before session 24)."""


def part_rollout(base: dict, attentions: tuple[str, ...] = ("sdpa",), heads: tuple[str, ...] = ("cpu",)) -> dict:
    """fp32 and bf16 on 1 and 2 threads, for each of ``attentions`` (:data:`ATTENTIONS`) and
    ``heads`` (:data:`HEADS`); rows are named ``precision/threads``, with ``/<attention>`` unless
    sdpa and ``/trl-head`` for TRL's kernel; each against fp32 sdpa on the same threads, with
    either head (and against fp32 with TRL's head when measured)."""
    table = {}
    for head, attention in ((h, a) for h in heads for a in attentions):
        kernel, cast = attention.removesuffix("-fp32"), attention.endswith("-fp32")
        for bf16 in (True,) if cast else (False, True):
            for threads in (1, 2):
                config = {**base, "bf16": bf16, "head": head,
                          "overrides": [*base["overrides"], f"model.config.attn_implementation={kernel}",
                                        f"training.cast_attention_to_fp32={str(cast).lower()}"]}
                result = run_child("rollout", config, threads)
                name = (f"{'bf16' if bf16 else 'fp32'}/{threads}t" + ("" if attention == "sdpa" else f"/{attention}")
                        + ("" if head == "cpu" else "/trl-head"))
                table[name] = {**per_rollout(result), "mixed_precision": result["mixed_precision"],
                               "attention": kernel, "cast_attention_to_fp32": cast, "head": head}

    def versus(name: str, seconds: float, suffix: str = "") -> str:
        fp32 = table.get("fp32/" + name.split("/")[1] + suffix)  # fp32 SDPA on the same threads, if measured
        return f"{fp32['rollout_s'] / seconds:.2f}x" if fp32 else "-"

    rows = [[name, f"{r['generation_s']:.2f}", f"{r['update_s']:.2f}", f"{r['rollout_s']:.2f}",
             versus(name, r["rollout_s"]), versus(name, r["rollout_s"], "/trl-head"),
             "-" if r["onpolicy_logp_abs_diff_mean"] is None else f"{r['onpolicy_logp_abs_diff_mean']:.1e}"]
            for name, r in table.items()]
    print_table(f"Seconds per rollout ({Path(base['recipe']).name}, frozen)",
                ["config", "generation s", "update s", "rollout s", "vs fp32", "vs fp32, TRL head", "sampler gap"],
                rows)
    return table


def part_oldpass(base: dict, bf16: bool, repeats: int) -> dict:
    """:func:`child_oldpass` on 1 and 2 threads (``base['steps']`` optimizer steps; the last
    rollout's buffer is timed)."""
    table = {}
    for threads in (1, 2):
        result = run_child("oldpass", {**base, "bf16": bf16, "repeats": repeats}, threads)
        table[f"{'bf16' if bf16 else 'fp32'}/{threads}t"] = result
    rows = [[name, f"{r['kept_micro_batches']} of {r['micro_batches']}", f"{r['separate_s']:.3f}",
             f"{r['kept_s']:.3f}", f"{r['separate_s'] - r['kept_s']:.3f}",
             f"{(r['separate_s'] - r['kept_s']) / r['rollout_s']:.1%}"] for name, r in table.items()]
    print_table(f"Old-log-prob pass per rollout ({Path(base['recipe']).name}; medians of {repeats}, alternating)",
                ["config", "micro-batches scored now", "separate s", "this code s", "saved s",
                 "saved / rollout"], rows)
    return table


def part_attention(base: dict, repeats: int) -> dict:
    """:func:`child_attention` on 1 and 2 threads."""
    table = {f"{threads}t": run_child("attention", {**base, "repeats": repeats}, threads) for threads in (1, 2)}
    rows = [[name, str(r["micro_batches"]), f"{r['fp32_s']:.3f}", f"{r['bf16_s']:.3f}",
             f"{r['bf16_fp32_attention_s']:.3f}", f"{r['fp32_s'] / r['bf16_s']:.2f}x",
             f"{r['fp32_s'] / r['bf16_fp32_attention_s']:.2f}x"] for name, r in table.items()]
    print_table(f"Forward + backward over one rollout ({Path(base['recipe']).name}; medians of {repeats}, "
                "rotated order)", ["threads", "micro-batches", "fp32 s", "bf16 s", "bf16, fp32 attention s",
                                 "bf16 vs fp32", "bf16 fp32-attention vs fp32"], rows)
    return table


def part_head(base: dict, repeats: int) -> dict:
    """:func:`child_head` on 1 and 2 threads."""
    table = {f"{threads}t": run_child("head", {**base, "repeats": repeats}, threads) for threads in (1, 2)}
    rows = [[name, str(r["micro_batches"]), f"{r['fp32_trl_s']:.3f}", f"{r['fp32_cpu_s']:.3f}",
             f"{r['bf16_trl_s']:.3f}", f"{r['bf16_cpu_s']:.3f}", f"{r['fp32_trl_s'] / r['bf16_trl_s']:.2f}x",
             f"{r['fp32_trl_s'] / r['bf16_cpu_s']:.2f}x", str(r["identical"]["fp32"] and r["identical"]["bf16"])]
            for name, r in table.items()]
    print_table(f"Forward + backward over one rollout by LM head ({Path(base['recipe']).name}; medians of {repeats}, "
                "rotated order)", ["threads", "micro-batches", "fp32 TRL head s", "fp32 CPU head s", "bf16 TRL head s",
                                 "bf16 CPU head s", "bf16 TRL vs fp32 TRL", "bf16 CPU vs fp32 TRL",
                                 "identical"], rows)
    return table


def part_jobs(base: dict, bf16: bool) -> dict:
    config = {**base, "bf16": bf16}
    started = time.perf_counter()
    one = run_child("rollout", config, 2)
    one_wall = time.perf_counter() - started
    started = time.perf_counter()
    both = [collect(p) for p in [spawn("rollout", config, 1), spawn("rollout", config, 1)]]
    two_wall = time.perf_counter() - started
    steps = base["steps"]
    result = {"bf16": bf16, "one_job_2_threads": {"wall_s": one_wall, "rollouts_per_min": 60 * steps / one_wall,
                                                  **per_rollout(one)},
              "two_jobs_1_thread": {"wall_s": two_wall, "rollouts_per_min": 60 * 2 * steps / two_wall,
                                    "per_job": [per_rollout(r) for r in both]}}
    result["throughput_ratio"] = result["two_jobs_1_thread"]["rollouts_per_min"] / result["one_job_2_threads"][
        "rollouts_per_min"]
    print_table("One job or two side by side", ["setup", "wall s (process start included)", "rollouts / min"],
                [["one job, 2 threads", f"{one_wall:.1f}", f"{result['one_job_2_threads']['rollouts_per_min']:.2f}"],
                 ["two jobs, 1 thread each", f"{two_wall:.1f}",
                  f"{result['two_jobs_1_thread']['rollouts_per_min']:.2f}"]])
    print(f"two jobs side by side: {result['throughput_ratio']:.2f}x the throughput of one 2-thread job")
    return result


def part_matmul(quick: bool) -> dict:
    shapes = {"mlp 8192x256 @ 256x704": (8192, 256, 704), "lm head 8192x256 @ 256x6400": (8192, 256, 6400),
              "decode mlp 96x256 @ 256x704": (96, 256, 704)}
    if quick:
        shapes = {"small 256x64 @ 64x128": (256, 64, 128)}
    saved = torch.get_num_threads()
    table = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, (m, k, n) in shapes.items():
                for dtype in (torch.float32, torch.bfloat16):
                    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
                    for _ in range(3):
                        a @ b
                    reps, started = 0, time.perf_counter()
                    while reps < 5 or time.perf_counter() - started < (0.05 if quick else 0.5):
                        a @ b
                        reps += 1
                    seconds = (time.perf_counter() - started) / reps
                    table[f"{name}/{str(dtype).split('.')[1]}/{threads}t"] = 2 * m * k * n / seconds / 1e9
    finally:
        torch.set_num_threads(saved)
    print_table("Matmul throughput", ["matmul / dtype / threads", "GFLOP/s"],
                [[k, f"{v:.0f}"] for k, v in table.items()])
    return table


def part_profile(base: dict, matmul: dict | None) -> dict:
    result = run_child("rollout", {**base, "bf16": True, "profile": True}, 2)
    groups = result["profile"]
    total = sum(groups.values())
    print_table("Where a bf16 step's time goes", ["op group (bf16, 2 threads)", "self CPU s", "share"],
                [[g, f"{s:.2f}", f"{s / total:.0%}"] for g, s in sorted(groups.items(), key=lambda x: -x[1])])
    out = {"self_cpu_s": groups, "total_s": total, "per_rollout": per_rollout(result)}
    if matmul:
        peak = max(v for k, v in matmul.items() if "bfloat16/2t" in k)
        out["bf16_peak_gflops_2t"] = peak
        print(f"matmuls take {groups['matmul'] / total:.0%} of the profiled time; the rest (attention, casts, the "
              f"{'6400'}-way log-softmax, elementwise and indexing ops) is memory- and dispatch-bound, which is "
              f"what keeps bf16 from its {peak:.0f} GFLOP/s matmul peak")
    return out


def part_eval(checkpoint: str, splits: str, tokenizer: str | None, questions: int, batch_sizes: list[int]) -> dict:
    result = run_child("eval", {"checkpoint": checkpoint, "splits": splits, "tokenizer": tokenizer,
                                "questions": questions, "batch_sizes": batch_sizes}, 2)
    rows = result["results"]
    result["texts_identical"] = len({r["texts_sha256"] for r in rows}) == 1
    print_table("Greedy evaluation by batch size", ["batch size", "wall s", "CPU s", "s per 600 questions"],
                [[r["batch_size"], f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
                  f"{r['wall_s'] * 600 / result['questions']:.1f}"] for r in rows])
    print(f"texts identical across batch sizes: {result['texts_identical']}")
    return result


def part_projection(results: dict) -> dict:
    """The full demo's wall time: before (fp32, 2 threads, one job, eval batch 50) and now."""
    rollout, jobs, evaluation = results.get("rollout"), results.get("jobs"), results.get("eval")
    if not (rollout and evaluation):
        return {}
    eval_by_batch = {r["batch_size"]: r["wall_s"] * FULL_DEMO["questions"] / evaluation["questions"]
                     for r in evaluation["results"]}
    demo = FULL_DEMO
    before_rl = demo["runs"] * demo["rollouts"] * rollout["fp32/2t"]["rollout_s"]
    before_eval = demo["evaluations"] * eval_by_batch.get(50, min(eval_by_batch.values()))
    speedup_jobs = jobs["throughput_ratio"] if jobs else 1.0
    now_rl = demo["runs"] * demo["rollouts"] * rollout["bf16/2t"]["rollout_s"] / max(speedup_jobs, 1.0)
    now_eval = demo["evaluations"] * min(eval_by_batch.values())
    projection = {"before_s": REFERENCE_PRETRAIN_SFT_S + before_rl + before_eval,
                  "now_s": REFERENCE_PRETRAIN_SFT_S + now_rl + now_eval,
                  "parts": {"before_rl_s": before_rl, "before_eval_s": before_eval, "now_rl_s": now_rl,
                            "now_eval_s": now_eval, "jobs_throughput_ratio": speedup_jobs}}
    projection["speedup"] = projection["before_s"] / projection["now_s"]
    print(f"full demo (pretraining + SFT at the reference's {REFERENCE_PRETRAIN_SFT_S:.0f} s, 12 RL runs x 60 "
          f"rollouts, 13 evaluations): before {projection['before_s'] / 3600:.2f} h, now "
          f"{projection['now_s'] / 3600:.2f} h ({projection['speedup']:.2f}x)")
    return projection


# ------------------------------------------------------------------------------------------ main


def _quick_paths(work: Path) -> dict:
    import step_breakdown

    from minimind_trl.modeling import MiniMindForCausalLM, get_preset, save_for_hub
    from minimind_trl.tokenization import load_tokenizer

    splits = step_breakdown.make_task_folder(work / "data", 40, 0)
    torch.manual_seed(0)
    checkpoint = save_for_hub(MiniMindForCausalLM(get_preset("tiny")), load_tokenizer(), work / "tiny")
    return {"recipe": str(REPO / "recipes" / "smoke_grpo.yaml"), "splits": str(splits), "checkpoint": str(checkpoint),
            "tokenizer": None, "overrides": [f"data.path={splits}", "model.preset=null", f"model.path={checkpoint}",
                                             "data.verify=false", "training.num_iterations=1"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", default="runs/demo", help="a demo folder (data/splits, tokenizer, runs/sft/final)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo" / "rl.yaml"),
                        help="the RL recipe the rollout, jobs and profile parts train (default: the demo's K = 1 "
                             "recipe; recipes/demo/rl_replay.yaml is the demo's default, K = 4 as 4 minibatches)")
    parser.add_argument("--steps", type=int, default=5,
                        help="optimizer steps per training configuration (rollouts x K; K = 1: rollouts)")
    parser.add_argument("--attention", default="sdpa",
                        help="comma-separated attentions the rollout part measures: sdpa, eager "
                             "(model.config.attn_implementation), sdpa-fp32, eager-fp32 (bf16 with the "
                             "shared pass's attention in fp32: training.cast_attention_to_fp32)")
    parser.add_argument("--heads", default="cpu",
                        help="comma-separated LM heads the rollout part measures: cpu (this code's, the "
                             "default), trl (TRL's chunked kernel, as before session 24; same numbers)")
    parser.add_argument("--eval-questions", type=int, default=600)
    parser.add_argument("--eval-batch-sizes", default="50,150,300,600")
    parser.add_argument("--output", default=None)
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks that the script runs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = {"rollout": child_rollout, "oldpass": child_oldpass, "attention": child_attention,
                  "head": child_head, "eval": child_eval}[args.child](json.loads(args.config))
        print(json.dumps(result))
        return result
    attentions = tuple(a for a in args.attention.split(",") if a)
    heads = tuple(h for h in args.heads.split(",") if h)
    if not heads or set(heads) - set(HEADS):
        parser.error(f"--heads: choose one or more of {HEADS}")
    if set(attentions) - set(ATTENTIONS):
        parser.error(f"unknown attention(s) {sorted(set(attentions) - set(ATTENTIONS))}; choose from {ATTENTIONS}")
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {PARTS}")
    with tempfile.TemporaryDirectory() as work:
        if args.quick:
            paths = _quick_paths(Path(work))
            steps, questions, batches = 2, 4, [2, 4]
        else:
            demo = Path(args.demo)
            splits, sft, tokenizer = demo / "data" / "splits", demo / "runs" / "sft" / "final", demo / "tokenizer"
            paths = {"recipe": str(Path(args.recipe).resolve()), "splits": str(splits),
                     "checkpoint": str(sft), "tokenizer": str(tokenizer),
                     "overrides": [f"data.path={splits}", f"model.path={sft}", f"tokenizer.path={tokenizer}"]}
            steps, questions = args.steps, args.eval_questions
            batches = [int(b) for b in args.eval_batch_sizes.split(",")]
        base = {"recipe": paths["recipe"], "overrides": paths["overrides"], "steps": steps}
        results: dict[str, Any] = {}
        if "rollout" in parts:
            results["rollout"] = part_rollout(base, attentions, heads)
        if "oldpass" in parts:
            results["oldpass"] = part_oldpass(base, bf16=cpu_bf16_instructions()[0], repeats=2 if args.quick else 5)
        if "attention" in parts:
            results["attention"] = part_attention(base, repeats=2 if args.quick else 6)
        if "head" in parts:
            results["head"] = part_head(base, repeats=2 if args.quick else 6)
        if "jobs" in parts:
            results["jobs"] = part_jobs(base, bf16=cpu_bf16_instructions()[0])  # what training.bf16: auto picks
        if "matmul" in parts:
            results["matmul"] = part_matmul(args.quick)
        if "profile" in parts:
            results["profile"] = part_profile(base, results.get("matmul"))
        if "eval" in parts:
            results["eval"] = part_eval(paths["checkpoint"], paths["splits"], paths["tokenizer"], questions, batches)
        if "projection" in parts:
            results["projection"] = part_projection(results)
    payload = {"benchmark": "cpu_speed", "quick": args.quick, "environment": environment(torch.device("cpu")),
               "results": results}
    if args.output:
        write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
