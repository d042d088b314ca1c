"""scripts/check_vllm.py: clear exit 2 when vLLM is missing or the export cannot be served; the
comparison and its exit codes, with a stand-in `vllm` module that decodes with transformers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minimind_trl.modeling import save_for_hub

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_vllm.py"

# A stand-in for vLLM's LLM / SamplingParams API (the calls the script makes), decoding greedily
# with transformers; FAKE_VLLM_FLIP=1 changes the first new token of every prompt.
FAKE_VLLM = '''
import os
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM


class SamplingParams:
    def __init__(self, temperature, max_tokens):
        assert temperature == 0.0
        self.max_tokens = max_tokens


class LLM:
    def __init__(self, model, dtype, max_model_len, seed):
        assert dtype == "float32"
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    def generate(self, prompts, params):
        outputs = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            with torch.no_grad():
                new = self.model.generate(torch.tensor([ids]), max_new_tokens=params.max_tokens, do_sample=False)
            new = new[0, len(ids):].tolist()
            if os.environ.get("FAKE_VLLM_FLIP"):
                new[0] = (new[0] + 1) % 6400
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=new)]))
        return outputs
'''


@pytest.fixture
def export(tmp_path, make_tiny_model, tokenizer):
    """export(fmt="qwen3", moe=False, **config_overrides) -> a tiny model's Hub folder in that format."""

    def write(fmt: str = "qwen3", moe: bool = False, **overrides) -> Path:
        return save_for_hub(make_tiny_model(moe, **overrides), tokenizer, tmp_path / f"export_{fmt}", format=fmt)

    return write


def run(tmp_path: Path, folder: Path, vllm_source: str | None, *extra: str, **env) -> subprocess.CompletedProcess:
    path = tmp_path / "site"
    path.mkdir(exist_ok=True)
    if vllm_source is not None:
        (path / "vllm.py").write_text(vllm_source, encoding="utf-8")
    return subprocess.run([sys.executable, str(SCRIPT), "--model", str(folder), "--max-new-tokens", "6", *extra],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(path),
                               **env})


def test_vllm_not_installed_exits_2_with_a_clear_message(tmp_path, export):
    blocked = 'raise ModuleNotFoundError("No module named \'vllm\'", name="vllm")\n'  # whatever is installed
    result = run(tmp_path, export(head_dim=32), blocked)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("check_vllm.py: vLLM is not installed")
    assert "pip install vllm" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt,overrides,message", [
    ("qwen3", {}, "head_dim 16 < 32"),
    ("minimind", {"head_dim": 32}, "--format qwen3"),
])
def test_unservable_exports_exit_2(tmp_path, export, fmt, overrides, message):
    result = run(tmp_path, export(fmt, **overrides), FAKE_VLLM)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("moe", [False, True])
def test_same_greedy_ids_exit_0_and_a_difference_exit_1(tmp_path, export, moe):
    folder = export(head_dim=32, moe=moe)
    same = run(tmp_path, folder, FAKE_VLLM)
    assert same.returncode == 0, same.stderr[-2000:]
    assert "3/3 prompts give the same greedy ids" in same.stdout
    flipped = run(tmp_path, folder, FAKE_VLLM, "--prompt", "What is 2 + 2?", FAKE_VLLM_FLIP="1")
    assert flipped.returncode == 1 and "DIFFER at new token 0" in flipped.stdout
    assert "0/1 prompts give the same greedy ids" in flipped.stdout
