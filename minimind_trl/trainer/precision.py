"""``training.bf16``: true, false or ``auto`` (the default), resolved once per run.

``auto`` means bf16 autocast with fp32 master weights wherever the hardware multiplies bf16
natively, fp32 elsewhere:

* on a GPU (``use_cpu`` false and CUDA present): bf16 when the GPU supports it
  (``torch.cuda.is_bf16_supported()``), which is what the GPU recipes asked for before ``auto``;
* on a CPU: bf16 when the CPU has bf16 multiply instructions (x86: AVX512-BF16 or AMX-BF16,
  i.e. AMD Zen 4 and later, Intel Cooper Lake / Sapphire Rapids and later; Arm: the v8.6 BF16
  extension); otherwise fp32, with a one-line note. Without those instructions oneDNN emulates
  bf16 by conversions, which is slower than fp32.

The environment variable ``MINIMIND_TRL_NATIVE_BF16`` (``0`` or ``1``) overrides the CPU
detection, for tests and for a user who knows better. An explicit ``true`` / ``false`` in the recipe
always wins. The recipe keeps what was asked (``auto`` is hashed as ``auto``); the run manifest's
``precision`` and the run's first log line say what it resolved to and why.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

AUTO = "auto"
BF16_VALUES = (True, False, AUTO)
NATIVE_BF16_ENV = "MINIMIND_TRL_NATIVE_BF16"
_ARM_BF16_FLAG = "bf16"  # /proc/cpuinfo "Features" word of the Armv8.6 BF16 extension


@dataclass(frozen=True)
class Precision:
    """What ``training.bf16`` resolved to: ``requested`` (true / false / auto), ``bf16`` (the
    TrainingArguments value), ``device`` (cpu / cuda), ``reason`` (one line, for the log) and
    ``attention_fp32`` (the policy passes' attention runs in fp32 under bf16:
    ``training.cast_attention_to_fp32`` set and bf16 chosen; in fp32 the setting changes nothing)."""

    requested: bool | str
    bf16: bool
    device: str
    reason: str
    attention_fp32: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    def log_line(self) -> str:
        what = "bf16 autocast, fp32 master weights" if self.bf16 else "fp32"
        if self.attention_fp32:
            what += ", attention in fp32 (training.cast_attention_to_fp32)"
        return f"precision: {what} on {self.device} (training.bf16={_spelled(self.requested)}: {self.reason})"


def _spelled(value: bool | str) -> str:
    return value if isinstance(value, str) else str(value).lower()


def cpu_bf16_instructions() -> tuple[bool, str]:
    """(native bf16 multiply on this CPU, what was found). ``MINIMIND_TRL_NATIVE_BF16`` overrides."""
    forced = os.environ.get(NATIVE_BF16_ENV)
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"{NATIVE_BF16_ENV} must be 0 or 1, got {forced!r}")
        return forced == "1", f"{NATIVE_BF16_ENV}={forced}"
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        found = [name for name, probe in (("AMX-BF16", torch.cpu._is_amx_tile_supported),
                                          ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported)) if probe()]
        if found:
            return True, f"the CPU has {' and '.join(found)}"
        return False, "the CPU has neither AVX512-BF16 nor AMX-BF16"
    if machine in ("aarch64", "arm64"):
        if _ARM_BF16_FLAG in _cpuinfo_flags():
            return True, "the CPU has the Arm BF16 extension"
        return False, "the CPU lacks the Arm BF16 extension"
    return False, f"no bf16 detection for CPU architecture {machine!r}"


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def resolve_precision(requested: bool | str, use_cpu: bool) -> Precision:
    """The :class:`Precision` of ``training.bf16 = requested`` on this machine (module docstring)."""
    on_gpu = not use_cpu and torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    if requested is True or requested is False:
        return Precision(requested, requested, device, "set in the recipe")
    if requested != AUTO:
        raise ValueError(f"training.bf16 must be true, false or {AUTO!r}, got {requested!r}")
    if on_gpu:
        supported = torch.cuda.is_bf16_supported()
        return Precision(requested, supported, device, "the GPU supports bf16" if supported
                         else "the GPU does not support bf16")
    native, found = cpu_bf16_instructions()
    if native:
        return Precision(requested, True, device, found)
    return Precision(requested, False, device, f"{found}: bf16 would be emulated, slower than fp32")


def training_arguments(recipe: dict) -> tuple[dict, Precision]:
    """The recipe's ``training`` fields for the kind's config class, with ``bf16`` resolved
    (unset = ``auto``), and the :class:`Precision` it resolved to."""
    training = dict(recipe["training"])
    precision = resolve_precision(training.get("bf16", AUTO), bool(training.get("use_cpu", False)))
    if precision.bf16 and training.get("cast_attention_to_fp32", False):
        precision = replace(precision, attention_fp32=True)
    training["bf16"] = precision.bf16
    return training, precision
