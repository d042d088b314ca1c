"""One call on a GPU machine: every figure the project still lacks from a device, in one JSON file.

Run through ``benchmarks/device_check.sh`` (which picks the interpreter and adds a hard
``timeout``). Parts, in this order (the most wanted first, so that a run cut by the time guard
still has them):

* ``environment``: GPU, CUDA, torch / transformers / TRL / accelerate versions, git commit;
* ``bf16_update0``: a real GRPO run (``minimind-trl train``'s code path, through
  ``step_breakdown.py``) with ``training.bf16: true``, K=2, 2 steps, on tasks from
  ``generate_tasks``, with ``training.prefix_sharing`` true and false; the first update of a
  rollout must have ``max_abs_log_ratio`` exactly 0 (old log-probs from the same weights);
* ``attention``: SDPA vs flash attention logits (bf16, minimind-3 size, random ids) when a flash
  path is importable, else "not installed"; also SDPA bf16 vs fp32 as the scale of bf16 noise;
* ``grpo_64m``: 10 rollouts of GRPO at minimind-3 size (random init, K=4, 2 prompts x 4), the
  step breakdown and the update-0 ratio;
* ``rollout`` / ``update`` / ``policy_pass`` / ``mfu``: ``rollout.py``, ``update.py``,
  ``policy_pass.py`` and ``mfu.py`` (``main(argv)``) at minimind-3 and minimind-3-moe sizes with
  small repeat counts;
* ``engines``: a 2-step GRPO run per training rollout engine when ``MiniMindGRPOConfig`` has a
  ``rollout_engine`` field, else "engine option not available";
* ``zero3_ranks``: on a machine with 2 or more GPUs, 2 GRPO steps of the MoE preset with
  ``beta > 0`` under ``accelerate launch`` of the shipped ZeRO-3 config on 2 ranks (else
  "needs 2 GPUs").

Every part is wrapped: an error is recorded (type, message, traceback tail) and the next part
runs. Time guard: no part starts after ``--time-limit`` seconds (default 420, counted from the
shell script's start), and a part still running at ``--hard-limit`` (465) is interrupted; either
way the section says so. The JSON is rewritten after every part, so a killed run keeps what it
did. ``--quick``: tiny presets on the CPU, one short run each (a smoke check, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402

import mfu  # noqa: E402
import policy_pass  # noqa: E402
import rollout  # noqa: E402
import step_breakdown  # noqa: E402
import torch  # noqa: E402
import update  # noqa: E402
from _common import REPO, _jsonable, build_model, environment, print_table, print_targets  # noqa: E402
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available  # noqa: E402

from minimind_trl.trainer import build  # noqa: E402
from minimind_trl.trainer.config import MiniMindGRPOConfig  # noqa: E402
from minimind_trl.trainer.recipe import SCHEMA  # noqa: E402
from minimind_trl.trainer.recorder import read_metrics  # noqa: E402

SECTIONS = ("environment", "bf16_update0", "attention", "grpo_64m", "rollout", "update", "policy_pass", "mfu",
            "engines", "zero3_ranks")
ZERO3_TIMEOUT_S = 240  # two ranks that deadlock fail the part instead of eating the call
ENGINES = ("minimind", "trl")


class TimeUp(BaseException):
    """Raised by the hard-limit alarm inside a part (a BaseException: no `except Exception` eats it)."""


class Unavailable(Exception):
    """A part that cannot run here: ``status`` is recorded instead of "ok", with what was measured."""

    def __init__(self, status: str, value: Any = None):
        super().__init__(status)
        self.status, self.value = status, value


@dataclasses.dataclass
class Context:
    quick: bool
    device: torch.device
    threads: int | None
    work: Path
    t0: float
    presets: tuple[str, ...]
    files: dict[str, Path] = dataclasses.field(default_factory=dict)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def flags(self) -> list[str]:
        """--device / --threads for the benchmark scripts."""
        return ["--device", str(self.device), *(["--threads", str(self.threads)] if self.threads else [])]


# ------------------------------------------------------------------------------------ GRPO runs


def grpo_run(ctx: Context, tag: str, steps: int, sets: list[str]) -> dict[str, Any]:
    """A GRPO run through ``step_breakdown.main`` (the ``minimind-trl train`` path) with the smoke
    recipe and ``sets``; returns its step breakdown, metrics records and the trainer's settings."""
    run_dir = ctx.work / tag
    seen: dict[str, Any] = {}
    original = build.build_trainer

    def capture(*args: Any, **kwargs: Any) -> Any:
        trainer = original(*args, **kwargs)
        seen.update(mixed_precision=str(trainer.accelerator.mixed_precision), device=str(trainer.accelerator.device),
                    bf16=trainer.args.bf16, prefix_sharing=trainer.args.prefix_sharing,
                    num_iterations=trainer.args.num_iterations,
                    rollout_engine=getattr(trainer.args, "rollout_engine", None))
        return trainer

    base = ["training.bf16=true", "training.save_strategy=no", "model.dtype=float32", "rollout.group_size=4",
            "rollout.prompts_per_rollout=2", f"rollout.max_completion_length={8 if ctx.quick else 64}",
            f"training.use_cpu={str(ctx.device.type == 'cpu').lower()}"]
    argv = ["--steps", str(steps), "--run-dir", str(run_dir), "--num-tasks", "32",
            *(["--threads", str(ctx.threads)] if ctx.threads else [])]
    for item in base + sets:
        argv += ["--set", item]
    build.build_trainer = capture
    tempdir, tempfile.tempdir = tempfile.tempdir, str(ctx.work)  # step_breakdown's data folder: ours to delete
    try:
        payload = step_breakdown.main(argv)
    finally:
        build.build_trainer, tempfile.tempdir = original, tempdir
    records = read_metrics(run_dir / "metrics.jsonl")
    update0 = [r["max_abs_log_ratio"] for r in records if r.get("update") == 0]
    keys = ("step", "rollout", "update", "max_abs_log_ratio", "ratio_min", "ratio_max", "clip_fraction", "loss",
            "rollout_seconds", "old_logp_seconds", "update_seconds", "generation_tokens_per_second",
            "update_tokens_per_second", "completion_tokens_mean")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"trainer": seen, "overrides": payload["source"]["overrides"],
            "preset": payload["recipe"]["model"]["preset"],
            # None when there is no update-0 record or one was not finite (written as null)
            "update0_max_abs_log_ratio": None if not update0 or None in update0 else max(update0),
            "records": [{k: r.get(k) for k in keys} for r in records],
            "steps": payload["steps"], "totals": payload["totals"], "training_wall_s": payload["training_wall_s"],
            "training_memory": payload["training_memory"], "targets": payload["targets"]}


def part_bf16_update0(ctx: Context) -> dict[str, Any]:
    preset = "tiny" if ctx.quick else "minimind-3"
    out = {}
    for sharing in (True, False):
        run = grpo_run(ctx, f"bf16_sharing_{sharing}", 2, [f"model.preset={preset}", "training.num_iterations=2",
                                                           f"training.prefix_sharing={str(sharing).lower()}"])
        out[f"prefix_sharing_{str(sharing).lower()}"] = {k: run[k] for k in ("trainer", "preset",
                                                                             "update0_max_abs_log_ratio", "records")}
    values = [v["update0_max_abs_log_ratio"] for v in out.values()]
    out["targets"] = [{"name": "bf16 update-0 max_abs_log_ratio, prefix sharing on and off",
                       "measured": str(values), "target": "exactly 0", "pass": all(v == 0.0 for v in values)}]
    return out


def part_grpo_64m(ctx: Context) -> dict[str, Any]:
    k, rollouts = (2, 1) if ctx.quick else (4, 10)
    run = grpo_run(ctx, "grpo_64m", k * rollouts, [f"model.preset={'tiny' if ctx.quick else 'minimind-3'}",
                                                   f"training.num_iterations={k}"])
    run["rollouts"] = rollouts
    run["targets"].append({"name": "update-0 max_abs_log_ratio", "measured": str(run["update0_max_abs_log_ratio"]),
                           "target": "exactly 0", "pass": run["update0_max_abs_log_ratio"] == 0.0})
    return run


def part_engines(ctx: Context) -> dict[str, Any]:
    if "rollout_engine" not in {f.name for f in dataclasses.fields(MiniMindGRPOConfig)}:
        raise Unavailable("engine option not available")
    key = "rollout.engine" if "engine" in SCHEMA["rollout"] else "training.rollout_engine"
    out: dict[str, Any] = {"recipe_key": key, "runs": []}
    for preset in (("tiny",) if ctx.quick else ctx.presets):
        seconds = {}
        for engine in ENGINES:
            run = grpo_run(ctx, f"engine_{preset}_{engine}", 2, [f"model.preset={preset}",
                                                                 "training.num_iterations=1", f"{key}={engine}"])
            last = run["records"][-1]  # step 2: past the first rollout's warm-up
            seconds[engine] = last["rollout_seconds"]
            out["runs"].append({"preset": preset, "engine": engine, "trainer": run["trainer"],
                                "records": run["records"], "steps": run["steps"]})
        out["runs"].append({"preset": preset, "trl_over_minimind_rollout_seconds_step2":
                            seconds["trl"] / seconds["minimind"] if seconds["minimind"] else None})
    return out


def part_zero3_ranks(ctx: Context) -> dict[str, Any]:
    """Two GPUs: ``accelerate launch`` of accelerate_configs/deepspeed_zero3.yaml on 2 ranks, 2 GRPO
    steps of the MoE preset with ``beta > 0`` (issue 25 H): finishes, the figures of both steps."""
    if ctx.quick or ctx.device.type != "cuda" or torch.cuda.device_count() < 2:
        raise Unavailable("needs 2 GPUs (tests/trainer/test_deepspeed_ranks.py covers 2 CPU ranks)")
    data = step_breakdown.make_task_folder(ctx.work / "zero3_data", 64, 0)
    run_dir = ctx.work / "zero3_run"
    accelerate = Path(sys.executable).with_name("accelerate")
    sets = ["model.preset=minimind-3-moe", "objective.beta=0.04", "training.max_steps=2", "training.bf16=true",
            "training.save_strategy=no", "rollout.group_size=4", "rollout.prompts_per_rollout=4",
            "rollout.max_completion_length=64", f"data.path={data}"]
    command = [str(accelerate), "launch", "--config_file", "accelerate_configs/deepspeed_zero3.yaml",
               "--num_processes", "2", "-m", "minimind_trl.cli", "train", "recipes/smoke_grpo.yaml",
               "--output-dir", str(run_dir), *[arg for item in sets for arg in ("--set", item)]]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=ZERO3_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    wall = time.perf_counter() - start
    records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    keys = ("step", "kl", "loss", "rollout_seconds", "update_seconds", "generation_tokens_per_second",
            "completion_tokens_mean")
    finished = process.returncode == 0 and len(records) == 2
    return {"command": command, "returncode": process.returncode, "wall_s": wall,
            "records": [{k: r.get(k) for k in keys} for r in records], "output_tail": output[-3000:],
            "targets": [{"name": "2-rank ZeRO-3 GRPO (MoE, beta 0.04) finishes", "measured": f"{wall:.0f} s, "
                         f"rc {process.returncode}", "target": f"2 steps within {ZERO3_TIMEOUT_S} s",
                         "pass": finished}]}


# ------------------------------------------------------------------------------------ attention


def part_attention(ctx: Context) -> dict[str, Any]:
    preset, length = ("tiny", 64) if ctx.quick else ("minimind-3", 1024)

    def logits(dtype: torch.dtype, attn: str) -> torch.Tensor:
        model, _ = build_model(preset, ctx.device, dtype, seed=0, attn_implementation=attn)
        with torch.no_grad():
            result = model(input_ids=ids).logits.float()
        del model
        return result

    ids = torch.randint(21, 6400, (4, length), generator=torch.Generator().manual_seed(0)).to(ctx.device)
    sdpa = logits(torch.bfloat16, "sdpa")
    out: dict[str, Any] = {"preset": preset, "shape": list(ids.shape), "dtype": "bfloat16",
                           "sdpa_bf16_vs_sdpa_fp32_max_abs": float((sdpa - logits(torch.float32, "sdpa")).abs().max()),
                           "logit_abs_max": float(sdpa.abs().max()), "flash": {}}
    candidates = [name for name, ok in (("flash_attention_2", is_flash_attn_2_available()),
                                        ("flash_attention_3", is_flash_attn_3_available()),
                                        ("kernels-community/flash-attn2", importlib.util.find_spec("kernels")))
                  if ok]
    for name in candidates:
        try:
            diff = (logits(torch.bfloat16, name) - sdpa).abs()
            out["flash"][name] = {"max_abs_logit_difference": float(diff.max()), "mean_abs": float(diff.mean())}
        except Exception as exc:  # noqa: BLE001 - one implementation failing is a result
            out["flash"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    if not candidates:
        out["flash"] = "not installed"
        raise Unavailable("not installed", out)
    return out


# ------------------------------------------------------------------------------ benchmark scripts


def without_environment(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "environment"}


def part_rollout(ctx: Context) -> dict[str, Any]:
    settings = (["--batch-sizes", "2", "--samples-per-task", "1,2", "--num-tasks", "2", "--naive-tasks", "1",
                 "--max-new-tokens", "128", "--no-warmup"] if ctx.quick else
                ["--batch-sizes", "32", "--samples-per-task", "1,8", "--naive-tasks", "8"])
    out = {}
    for preset in ctx.presets:
        path = ctx.work / f"rollout_{preset}.json"
        payload = rollout.main(["--preset", preset, "--tool-turns", "1", "--task-mix", "all", "--repeats", "1",
                                *settings, *ctx.flags(), "--output", str(path)])
        ctx.files[f"rollout_{preset}"] = path
        out[preset] = without_environment(payload)
    return out


def part_update(ctx: Context) -> dict[str, Any]:
    settings = (["--prompts", "2", "--group-size", "2", "--prompt-len", "8", "--completion-len", "8",
                 "--grid-completion-lens", "8,16", "--grid-group-sizes", "2", "--repeats", "1",
                 "--loss-min-time", "0.05"] if ctx.quick else
                ["--grid-completion-lens", "128,512", "--grid-group-sizes", "4,16", "--repeats", "3",
                 "--loss-min-time", "0.3"])
    out = {}
    for preset in ctx.presets:
        path = ctx.work / f"update_{preset}.json"
        payload = update.main(["--preset", preset, *settings, *ctx.flags(), "--output", str(path)])
        out[preset] = without_environment(payload)
        ctx.files[f"update_{preset}"] = path
    return out


def part_policy_pass(ctx: Context) -> dict[str, Any]:
    if ctx.quick:
        return without_environment(policy_pass.main(["--quick", *ctx.flags()]))
    # the MoE size with real-minimind3's shapes, as one more workload of the script
    shapes = policy_pass.WORKLOADS["real-minimind3"][1:]
    policy_pass.WORKLOADS.setdefault("real-minimind3-moe", ("minimind-3-moe", *shapes))
    return without_environment(policy_pass.main(["--workloads", "demo80,real-minimind3,real-minimind3-moe",
                                             "--repeats", "3", *ctx.flags()]))


def part_mfu(ctx: Context) -> dict[str, Any]:
    out = {}
    for preset in ctx.presets:
        argv = ["--preset", preset, "--repeats", "3", *(["--quick"] if ctx.quick else []), *ctx.flags()]
        for kind in ("update", "rollout"):  # rates from the parts above when they ran, else measured here
            if f"{kind}_{preset}" in ctx.files and ctx.files[f"{kind}_{preset}"].is_file():
                argv += [f"--{kind}-json", str(ctx.files[f"{kind}_{preset}"])]
        out[preset] = without_environment(mfu.main(argv))
    return out


# ------------------------------------------------------------------------------------ environment


def part_environment(ctx: Context) -> dict[str, Any]:
    out = environment(ctx.device)
    for name in ("accelerate", "flash_attn", "kernels", "deepspeed", "peft", "datasets"):
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out.update(cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        out.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30,
                   compute_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count())
    for key, command in (("nvidia_smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                          "--format=csv,noheader"]), ("git_commit", ["git", "rev-parse", "HEAD"])):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=10, cwd=REPO)
            out[key] = done.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            out[key] = None
    return out


PARTS: dict[str, Callable[[Context], Any]] = {
    "environment": part_environment, "bf16_update0": part_bf16_update0, "attention": part_attention,
    "grpo_64m": part_grpo_64m, "rollout": part_rollout, "update": part_update, "policy_pass": part_policy_pass,
    "mfu": part_mfu, "engines": part_engines, "zero3_ranks": part_zero3_ranks,
}


# ------------------------------------------------------------------------------------------- main


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(report), indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def default_output() -> str:
    out = os.environ.get("OUT")
    return str(Path(out) / "device_check.json") if out else str(REPO / "benchmarks" / "results" / "device_check.json")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", default=None,
                        help="JSON file (default: $OUT/device_check.json, else benchmarks/results/device_check.json)")
    parser.add_argument("--quick", action="store_true", help="tiny presets on the CPU: a smoke check (seconds)")
    parser.add_argument("--time-limit", type=float, default=420.0, help="no part starts after this many seconds")
    parser.add_argument("--hard-limit", type=float, default=465.0, help="a part still running then is interrupted")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (--quick: 1)")
    parser.add_argument("--parts", default=",".join(SECTIONS), help="comma-separated subset of the parts")
    args = parser.parse_args(argv)
    t0 = float(os.environ.get("DEVICE_CHECK_T0") or time.time())
    output = Path(args.output or default_output())
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    elif not args.quick:
        print("device_check: no CUDA device; the full check at 64M sizes will be slow and cut by the time guard")
    ctx = Context(args.quick, device, threads, Path(tempfile.mkdtemp(prefix="device_check_")), t0,
                  ("tiny", "tiny-moe") if args.quick else ("minimind-3", "minimind-3-moe"))
    wanted = [name for name in args.parts.split(",") if name]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {list(SECTIONS)}")
    report: dict[str, Any] = {
        "benchmark": "device_check", "quick": args.quick, "device": str(device), "output": str(output),
        "time_limit_s": args.time_limit, "hard_limit_s": args.hard_limit,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0)), "elapsed_s": None, "complete": False,
        "sections": {name: {"status": "pending" if name in wanted else "not requested"} for name in SECTIONS},
        "targets": [],
    }
    running = {"in_part": False}

    def alarm(signum: int, frame: Any) -> None:
        if running["in_part"]:
            raise TimeUp()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(args.hard_limit - ctx.elapsed(), 0.01))
    try:
        for name in wanted:
            section = report["sections"][name]
            if name != "environment" and ctx.elapsed() > min(args.time_limit, args.hard_limit):
                section.update(status="skipped: time", reason=f"{ctx.elapsed():.0f} s had passed "
                                                              f"(limit {min(args.time_limit, args.hard_limit):g} s)")
                continue
            print(f"\n===== device_check: {name} (at {ctx.elapsed():.0f} s)", flush=True)
            start = time.perf_counter()
            try:
                running["in_part"] = True  # the alarm interrupts only the part itself (it fires once)
                try:
                    value = PARTS[name](ctx)
                finally:
                    running["in_part"] = False
                section.update(status="ok", value=value)
            except Unavailable as exc:
                section.update(status=exc.status, value=exc.value, reason=exc.status)
            except TimeUp:
                section.update(status="interrupted: time",
                               reason=f"still running at the hard limit ({args.hard_limit:g} s)")
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded; the next part runs
                section.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:2000],
                               traceback=traceback.format_exc()[-4000:])
            finally:
                section["seconds"] = time.perf_counter() - start
                report["elapsed_s"] = ctx.elapsed()
                write(output, report)
        signal.setitimer(signal.ITIMER_REAL, 0)
        report["targets"] = collect_targets(report["sections"], args.quick)
        report["complete"] = all(report["sections"][n]["status"] not in ("pending", "skipped: time",
                                                                        "interrupted: time") for n in wanted)
        report["elapsed_s"] = ctx.elapsed()
        write(output, report)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(ctx.work, ignore_errors=True)
    summary(report)
    print(f"\nwrote {output}")
    return report


def collect_targets(sections: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    """The targets of every part that produced some, prefixed with where they come from. With
    --quick only the exact ones (update-0 ratio 0) are judged: the rest are no measurement."""
    found = []

    def walk(where: str, value: Any) -> None:
        if isinstance(value, dict):
            for target in value.get("targets") or []:
                judged = not quick or target["target"] == "exactly 0"
                found.append({**target, "name": f"{where}: {target['name']}",
                              "pass": target["pass"] if judged else None})
            for key, item in value.items():
                if key != "targets" and isinstance(item, dict):
                    walk(f"{where}/{key}", item)

    for name, section in sections.items():
        walk(name, section.get("value"))
    return found


def summary(report: dict[str, Any]) -> None:
    def headline(name: str, value: Any) -> str:
        if not isinstance(value, dict):
            return ""
        if name == "bf16_update0":
            return ", ".join(f"{k}: {v['update0_max_abs_log_ratio']}" for k, v in value.items() if k != "targets")
        if name == "grpo_64m":
            step = value["totals"]["measured"] / max(len(value["steps"]) - 1, 1)  # the first step is left out
            return f"update-0 ratio {value['update0_max_abs_log_ratio']}, mean step {step:.3f} s"
        if name == "attention":
            return f"flash: {value['flash']}; bf16 vs fp32 {value['sdpa_bf16_vs_sdpa_fp32_max_abs']:.3g}"
        if name == "mfu":
            return ", ".join(f"{p}: update {v['update']['mfu']:.3f}, rollout {v['rollout']['mfu']:.4f}"
                             for p, v in value.items())
        if name == "environment":
            return f"{value.get('gpu') or 'cpu'}, torch {value['torch']}, CUDA {value['cuda']}, trl {value['trl']}"
        return ""

    print_table(f"Device check ({report['elapsed_s']:.0f} s; {report['device']})",
                ["part", "status", "seconds", "headline"],
                [[name, s["status"], s.get("seconds"), headline(name, s.get("value")) or s.get("reason", "")[:100]]
                 for name, s in report["sections"].items()])
    print_targets(report["targets"])


if __name__ == "__main__":
    main()
