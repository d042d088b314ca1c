"""The README's "Use with other tools" commands, run as written on tiny dense and MoE run folders."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minimind_trl.modeling import MOE_EXPERT_PARAMETERS, save_for_hub

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Use with other tools\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_script(code: str, cwd: Path, name: str) -> str:
    path = cwd / f"{name}.py"
    path.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=cwd, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_readme_tool_commands_run_as_written(preset, tmp_path, make_tiny_model, tokenizer):
    export, load, trl_sft, lora = readme_blocks()
    run_dir = tmp_path / "runs" / "e0_sft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"kind": "sft", "recipe": {"kind": "sft"},
                                                       "recipe_sha256": "0f" * 32, "seed": 42}))
    save_for_hub(make_tiny_model(moe=preset == "tiny-moe"), tokenizer, run_dir / "final")

    out = run_script(export + lora + lora_checks(preset), tmp_path, "export_and_lora")
    assert "trainable params" in out and "checks passed" in out
    for fmt in ("minimind", "qwen3"):
        assert "0f" * 32 in (tmp_path / "export" / fmt / "README.md").read_text()

    out = run_script(load + LOAD_CHECKS, tmp_path, "load")
    qwen_class = "Qwen3MoeForCausalLM" if preset == "tiny-moe" else "Qwen3ForCausalLM"
    assert f"classes MiniMindForCausalLM {qwen_class}" in out

    if preset == "tiny":  # TRL's stock SFTTrainer on the qwen3 export: two steps, a finite loss
        out = run_script(trl_sft + TRL_CHECKS, tmp_path, "trl_sft")
        assert "trained 2 steps" in out


def lora_checks(preset: str) -> str:
    targets = list(MOE_EXPERT_PARAMETERS) if preset == "tiny-moe" else None
    return (
        "\nassert type(merged).__name__ == 'MiniMindForCausalLM'\n"
        "assert not any('lora' in name for name in merged.state_dict())\n"
        f"assert peft_model.peft_config['default'].target_parameters == {targets!r}\n"
        "print('checks passed')\n"
    )


LOAD_CHECKS = """
import sys
import torch
assert not any(name.startswith("minimind_trl") for name in sys.modules)
ids = torch.tensor([[1, 5, 300, 42, 7]])
with torch.no_grad():
    torch.testing.assert_close(model(ids).logits, qwen(ids).logits, atol=1e-5, rtol=1e-5)
print("classes", type(model).__name__, type(qwen).__name__)
"""


TRL_CHECKS = """
import math
import sys
assert not any(name.startswith("minimind_trl") for name in sys.modules)
losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
assert trainer.state.global_step == 2 and losses and all(math.isfinite(float(v)) for v in losses)
print("trained", trainer.state.global_step, "steps")
"""
