"""Shared helpers of the benchmark scripts: device choice, timing, peak memory, matmul peak, output.

Not a test module and not part of the installed package. Each script puts this folder on
``sys.path`` (running ``python benchmarks/<script>.py`` does that already) and imports from here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from minimind_trl.modeling import MiniMindForCausalLM, count_parameters, get_preset

REPO = Path(__file__).resolve().parent.parent
PRESETS = ("tiny", "tiny-moe", "demo", "minimind-3", "minimind-3-moe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The offline defaults of the project's tests: a failing hub call would otherwise retry for 25-45 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ------------------------------------------------------------------------------------- arguments


def common_parser(description: str) -> argparse.ArgumentParser:
    """Flags every script shares: --device, --dtype, --threads, --output, --quick, --seed."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="model dtype; auto = float32 on CPU, bfloat16 on GPU")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write the results as JSON to this file")
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings (seconds on a CPU): checks that the script runs, not a measurement")
    return parser


def int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]."""
    values = [int(part) for part in str(text).split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    return values


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """Apply --threads/--seed; return (device, dtype). ``--quick`` runs on one thread unless
    --threads says otherwise (on a loaded machine, several threads can be 10x slower)."""
    if args.quick and not args.threads:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls, as training would
    return device, resolve_dtype(args.dtype, device)


# ------------------------------------------------------------------------------------------ timing


def sync(device: torch.device | str | None = None) -> None:
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: torch.device, repeats: int = 3, warmup: int = 1,
            min_time: float = 0.0) -> dict[str, Any]:
    """Run ``fn`` ``warmup`` times untimed, then at least ``repeats`` times (and until ``min_time``
    seconds have been spent) timed with a device sync around each call.
    Returns ``{"median_s", "min_s", "mean_s", "runs", "times_s"}``."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats or spent < min_time:
        start = time.perf_counter()
        fn()
        sync(device)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
        if len(times) >= 1000:
            break
    return summarize(times)


def measure_interleaved(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int = 3,
                        warmup: int = 1, min_time: float = 0.0) -> dict[str, dict[str, Any]]:
    """Like :func:`measure` for several functions compared with each other: rounds of one call
    of each, the order rotating every round, so that drifting machine load hits them alike."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    spent, rounds = 0.0, 0
    while rounds < repeats or spent < min_time * len(names):
        order = names[rounds % len(names):] + names[:rounds % len(names)]
        for name in order:
            start = time.perf_counter()
            fns[name]()
            sync(device)
            elapsed = time.perf_counter() - start
            times[name].append(elapsed)
            spent += elapsed
        rounds += 1
        if rounds >= 1000:
            break
    return {name: summarize(values) for name, values in times.items()}


def summarize(times: list[float]) -> dict[str, Any]:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "mean_s": statistics.fmean(times),
        "runs": len(times),
        "times_s": [round(t, 6) for t in times],
    }


# ------------------------------------------------------------------------------------------ memory


def _proc_status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            match = re.search(rf"^{key}:\s+(\d+)\s+kB", handle.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


@dataclass
class PeakMemory:
    """Peak memory of a phase. CPU: peak resident set size of the process (``/proc/self/status``
    VmHWM, reset at the start of the phase through ``/proc/self/clear_refs``; when the reset is not
    allowed, a 2 ms sampling thread of VmRSS). CUDA: ``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats`` (tensors only, not the caching allocator's reserve).

    ``peak_mib``: the phase's peak; ``delta_mib``: peak minus the level at the start of the phase
    (what the phase itself added); ``method``: how it was measured."""

    device: torch.device
    peak_mib: float | None = None
    start_mib: float | None = None
    delta_mib: float | None = None
    method: str = ""
    _samples: list[int] = field(default_factory=list)
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_mib = torch.cuda.memory_allocated(self.device) / 2**20
            self.method = "torch.cuda.max_memory_allocated"
            return self
        rss = _proc_status_kib("VmRSS")
        self.start_mib = None if rss is None else rss / 1024
        if _reset_rss_peak() and _proc_status_kib("VmHWM") is not None:
            self.method = "/proc/self/status VmHWM (reset via clear_refs)"
        else:
            self.method = "/proc/self/status VmRSS sampled every 2 ms"
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            value = _proc_status_kib("VmRSS")
            if value is not None:
                self._samples.append(value)
            self._stop.wait(0.002)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            self.peak_mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            value = _proc_status_kib("VmRSS")
            samples = self._samples + ([value] if value is not None else [])
            self.peak_mib = max(samples) / 1024 if samples else None
        else:
            value = _proc_status_kib("VmHWM")
            self.peak_mib = None if value is None else value / 1024
        if self.peak_mib is not None and self.start_mib is not None:
            self.delta_mib = self.peak_mib - self.start_mib

    def as_dict(self) -> dict[str, Any]:
        return {"peak_mib": _round(self.peak_mib), "start_mib": _round(self.start_mib),
                "delta_mib": _round(self.delta_mib), "method": self.method}


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# ------------------------------------------------------------------------------- matmul peak, fits


def matmul_peak(device: torch.device, dtype: torch.dtype | None = None, size: int | None = None,
                repeats: int = 5, min_time: float = 1.0) -> dict[str, Any]:
    """The machine's dense matmul rate measured here: ``C = A @ B`` with square ``size`` x ``size``
    operands, ``2 * size**3`` FLOPs a call, best of the timed calls. Default: fp32 on CPU
    (size 2048), bf16 on GPU (size 8192)."""
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if size is None:
        size = 8192 if device.type == "cuda" else 2048
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    timing = measure(lambda: torch.mm(a, b, out=out), device, repeats=repeats, warmup=2, min_time=min_time)
    flops = 2.0 * size**3
    return {"dtype": str(dtype).replace("torch.", ""), "size": size, "flops_per_call": flops,
            "peak_flops_per_s": flops / timing["min_s"], "median_flops_per_s": flops / timing["median_s"],
            "timing": timing, "threads": torch.get_num_threads()}


def fit_line(xs: Iterable[float], ys: Iterable[float]) -> dict[str, Any]:
    """Least-squares line (numpy.polyfit degree 1) and log-log exponent of ``ys`` against ``xs``."""
    x = np.asarray(list(xs), dtype=float)
    y = np.asarray(list(ys), dtype=float)
    if len(x) < 2 or len(set(x.tolist())) < 2:
        return {"slope": None, "intercept": None, "loglog_exponent": None, "points": len(x)}
    slope, intercept = np.polyfit(x, y, 1)
    exponent = None
    if (x > 0).all() and (y > 0).all():
        exponent = float(np.polyfit(np.log(x), np.log(y), 1)[0])
    return {"slope": float(slope), "intercept": float(intercept), "loglog_exponent": exponent,
            "points": len(x)}


# ------------------------------------------------------------------------------------------ models


def build_model(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0, **overrides: Any):
    """A random-weight MiniMind of ``preset`` on ``device`` in ``dtype`` (eval mode)."""
    torch.manual_seed(seed)
    config = get_preset(preset, **overrides)
    model = MiniMindForCausalLM(config).to(device=device, dtype=dtype)
    model.eval()
    info = {
        "preset": preset,
        "parameters": count_parameters(model),
        "active_parameters": count_parameters(model, active=True),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "use_moe": bool(getattr(config, "use_moe", False)),
        "dtype": str(dtype).replace("torch.", ""),
    }
    return model, info


# ------------------------------------------------------------------------------------------ output


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "loadavg_1m": _loadavg(),
        "command": [sys.executable, *sys.argv],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for name in ("transformers", "trl"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - optional information
            info[name] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    return value


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"\nwrote {path}")


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 10 ** -digits):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}"
    return str(value)


def print_table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def print_targets(targets: list[dict[str, Any]]) -> None:
    print("\nTargets")
    for target in targets:
        print(f"  [{verdict(target['pass'])}] {target['name']}: {target['measured']} (target {target['target']})")
