"""``training.bf16: auto``: what it resolves to, the fallback note, the manifest and the config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minimind_trl.trainer import precision
from minimind_trl.trainer.precision import NATIVE_BF16_ENV, resolve_precision, training_arguments
from minimind_trl.trainer.recipe import RecipeError, load_recipe, validate_recipe


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


def _grpo_recipe(**training) -> dict:
    return validate_recipe({"kind": "grpo", "model": {"preset": "tiny"}, "data": {"path": "x"},
                            "rollout": {"group_size": 2, "tool_names": ["calculate_math"]},
                            "rewards": ["success_reward"], "training": {"use_cpu": True, **training}})


def test_fp32_attention_is_named_only_where_it_acts(monkeypatch):
    recipe = _grpo_recipe(bf16="auto", cast_attention_to_fp32=True)
    monkeypatch.setenv(NATIVE_BF16_ENV, "1")
    fields, chosen = training_arguments(recipe)
    assert fields["bf16"] is True and fields["cast_attention_to_fp32"] is True and chosen.attention_fp32
    assert chosen.log_line() == ("precision: bf16 autocast, fp32 master weights, attention in fp32 "
                                 f"(training.cast_attention_to_fp32) on cpu (training.bf16=auto: {NATIVE_BF16_ENV}=1)")
    assert chosen.as_dict()["attention_fp32"] is True  # the manifest's precision block
    monkeypatch.setenv(NATIVE_BF16_ENV, "0")  # fp32: the setting changes nothing, so the log does not name it
    chosen = training_arguments(recipe)[1]
    assert not chosen.attention_fp32 and "attention" not in chosen.log_line()
    monkeypatch.setenv(NATIVE_BF16_ENV, "1")
    assert not training_arguments(_grpo_recipe(bf16="auto"))[1].attention_fp32


DEMO_RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "demo"


def test_the_demo_recipes_train_with_fp32_attention_and_the_published_study_runs_keep_theirs(monkeypatch):
    """The demo's three RL recipes default to bf16 with fp32 attention (its parity table is in
    docs/demo_results.md); the study recipes whose published runs were made in bf16 before that default
    pin the attention those runs used, so that rerunning them reproduces them."""
    monkeypatch.setenv(NATIVE_BF16_ENV, "1")
    for name in ("rl.yaml", "rl_replay.yaml", "rl_replay_passes.yaml"):
        assert training_arguments(load_recipe(DEMO_RECIPES / name))[1].attention_fp32, name
    study = {path: training_arguments(load_recipe(path))[1] for path in (DEMO_RECIPES / "study").glob("k4_*/*.yaml")}
    in_bf16 = {path: chosen for path, chosen in study.items() if chosen.bf16}
    assert {path.parent.name for path in in_bf16} == {"k4_control", "k4_minibatch", "k4_passes"}
    for path, chosen in in_bf16.items():
        assert not chosen.attention_fp32, path
