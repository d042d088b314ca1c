"""``training.bf16: auto``: what it resolves to, the fallback note, the manifest and the config."""

from __future__ import annotations

import pytest
import torch

from minimind_trl.trainer import precision
from minimind_trl.trainer.precision import NATIVE_BF16_ENV, resolve_precision, training_arguments
from minimind_trl.trainer.recipe import RecipeError, validate_recipe


def test_explicit_values_win_over_detection(monkeypatch):
    for forced in ("0", "1"):
        monkeypatch.setenv(NATIVE_BF16_ENV, forced)
        assert resolve_precision(True, use_cpu=True).bf16 is True
        assert resolve_precision(False, use_cpu=True).bf16 is False
        assert resolve_precision(True, use_cpu=True).reason == "set in the recipe"


def test_auto_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setenv(NATIVE_BF16_ENV, "1")
    chosen = resolve_precision("auto", use_cpu=True)
    assert (chosen.bf16, chosen.device, chosen.requested) == (True, "cpu", "auto")
    assert chosen.log_line() == (f"precision: bf16 autocast, fp32 master weights on cpu (training.bf16=auto: "
                                 f"{NATIVE_BF16_ENV}=1)")


def test_auto_falls_back_to_fp32_with_a_one_line_note(monkeypatch):
    monkeypatch.setenv(NATIVE_BF16_ENV, "0")
    chosen = resolve_precision("auto", use_cpu=True)
    assert chosen.bf16 is False
    line = chosen.log_line()
    assert "\n" not in line and line.startswith("precision: fp32 on cpu (training.bf16=auto:")
    assert "emulated, slower than fp32" in line


def test_detection_reads_the_cpu_instructions(monkeypatch):
    monkeypatch.delenv(NATIVE_BF16_ENV, raising=False)
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert precision.cpu_bf16_instructions() == (False, "the CPU has neither AVX512-BF16 nor AMX-BF16")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert precision.cpu_bf16_instructions() == (True, "the CPU has AVX512-BF16")
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(precision, "_cpuinfo_flags", lambda: {"fp", "asimd", "bf16"})
    assert precision.cpu_bf16_instructions()[0] is True
    monkeypatch.setattr(precision, "_cpuinfo_flags", lambda: {"fp", "asimd"})
    assert precision.cpu_bf16_instructions()[0] is False
    monkeypatch.setattr(precision.platform, "machine", lambda: "riscv64")
    assert precision.cpu_bf16_instructions() == (False, "no bf16 detection for CPU architecture 'riscv64'")


def test_a_bad_override_is_refused(monkeypatch):
    monkeypatch.setenv(NATIVE_BF16_ENV, "yes")
    with pytest.raises(ValueError, match=f"{NATIVE_BF16_ENV} must be 0 or 1"):
        resolve_precision("auto", use_cpu=True)


def _recipe(**training) -> dict:
    return validate_recipe({"kind": "sft", "model": {"preset": "tiny"}, "data": {"path": "x"},
                            "training": {"use_cpu": True, **training}})


def test_unset_means_auto_and_the_recipe_keeps_what_was_asked(monkeypatch):
    unset, auto = _recipe(), _recipe(bf16="auto")
    assert "bf16" not in unset["training"] and auto["training"]["bf16"] == "auto"
    for forced, expected in (("1", True), ("0", False)):
        monkeypatch.setenv(NATIVE_BF16_ENV, forced)
        for recipe in (unset, auto):
            fields, chosen = training_arguments(recipe)
            assert fields["bf16"] is expected and chosen.bf16 is expected
            assert recipe["training"].get("bf16") in (None, "auto")  # not resolved in place


@pytest.mark.parametrize("value", ["maybe", 1, 0, "true"])
def test_only_true_false_or_auto(value):
    with pytest.raises(RecipeError, match="training.bf16 must be true, false or auto"):
        _recipe(bf16=value)
