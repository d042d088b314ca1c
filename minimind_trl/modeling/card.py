"""The model card (README.md) that `save_for_hub` writes into every exported folder.

Front matter as the Hub reads it (license, library_name, pipeline_tag, tags, base_model when
given); the body: preset, architecture and parameter counts, the training run (recipe, data hashes,
versions, from the run's `manifest.json`) when there is one, evaluation metrics when given, and
how to load the folder's format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from .presets import PRESETS, count_parameters, get_preset

_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "use_moe", "num_experts", "num_experts_per_tok",
               "moe_intermediate_size")


def preset_name(config) -> str | None:
    """The preset whose network `config` describes (RoPE settings aside), or None."""
    for name in PRESETS:
        preset = get_preset(name)
        if all(getattr(preset, key) == getattr(config, key) for key in _SHAPE_KEYS):
            return name
    return None


def read_manifest(manifest: dict | str | os.PathLike | None) -> dict | None:
    """A run manifest given as a dict, a manifest.json path or a run folder (None stays None)."""
    if manifest is None or isinstance(manifest, dict):
        return manifest
    path = Path(manifest)
    if path.is_dir():
        path = path / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _load_snippet(format: str, repo_id: str, with_tokenizer: bool) -> str:
    remote = ", trust_remote_code=True" if format == "minimind" else ""
    lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             f'model = AutoModelForCausalLM.from_pretrained("{repo_id}"{remote})']
    if with_tokenizer:
        # AutoTokenizer reads config.json too, whose auto_map names the remote code: without the flag
        # it asks "run the custom code? [y/N]" and, declined, warns about a model of type ``
        lines += [f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}"{remote})',
                  'messages = [{"role": "user", "content": "What is 12 * 7?"}]',
                  "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
                  'return_dict=True, return_tensors="pt")',
                  "output = model.generate(**inputs, max_new_tokens=32, do_sample=False)",
                  'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:]))']
    return "\n".join(lines)


def _portable(value: Any) -> Any:
    """``value`` with every absolute path shortened to ``…/PARENT/NAME`` (recursively in lists and dicts):
    a card is published, and the machine's folders are nobody's business and no use to a reader."""
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_portable(item) for item in value]
    if isinstance(value, str) and (value.startswith(("/", "~")) or (len(value) > 2 and value[1:3] in (":\\", ":/"))):
        return "…/" + "/".join(Path(value.replace("\\", "/")).parts[-2:])
    return value


def _training_section(manifest: dict) -> list[str]:
    manifest = _portable(manifest)
    recipe, data = manifest.get("recipe", {}), manifest.get("data") or {}
    rows = [("kind", manifest.get("kind")), ("description", recipe.get("description")),
            ("recipe sha256", manifest.get("recipe_sha256")), ("seed", manifest.get("seed")),
            ("world size", manifest.get("world_size")),
            ("initial model", (manifest.get("initial_model") or {}).get("path")),
            ("data", f"{data.get('path')} (split {data.get('split')}, {data.get('rows')} rows)" if data else None),
            ("data file sha256", data.get("file_sha256")), ("split manifest sha256", data.get("manifest_sha256")),
            ("git commit", (manifest.get("git") or {}).get("commit")),
            ("versions", ", ".join(f"{k} {v}" for k, v in (manifest.get("versions") or {}).items() if v))]
    lines = ["## Training", "", "From the run's `manifest.json`:", "", "| | |", "|---|---|"]
    lines += [f"| {key} | `{value}` |" for key, value in rows if value not in (None, "")]
    if manifest.get("objective"):
        lines += ["", f"Objective: `{json.dumps(manifest['objective'], sort_keys=True)}`"]
    if recipe:
        lines += ["", "<details><summary>Resolved recipe</summary>", "", "```yaml",
                  yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True).rstrip(), "```", "", "</details>"]
    return lines + [""]


def model_card(model, format: str, *, manifest: dict | None = None, metrics: dict[str, Any] | None = None,
               base_model: str | None = None, repo_id: str = ".", with_tokenizer: bool = True) -> str:
    """README.md text for `model` exported as `format` ("minimind" or "qwen3")."""
    config = model.config
    moe = config.use_moe
    architecture = "qwen3_moe" if moe else "qwen3"
    front = {"license": "apache-2.0", "library_name": "transformers", "pipeline_tag": "text-generation",
             "tags": ["minimind", "minimind-trl", architecture, "tool-use", *(["moe"] if moe else [])]}
    if base_model:
        front["base_model"] = base_model
    preset = preset_name(config)
    total = count_parameters(model)
    params = f"{total:,}" + (f" total, {count_parameters(model, active=True):,} active per token" if moe else "")
    shape = (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads "
             f"({config.num_key_value_heads} KV, head_dim {config.head_dim}), vocab {config.vocab_size}")
    shape += (f", {config.num_experts} experts of width {config.moe_intermediate_size}, "
              f"top-{config.num_experts_per_tok}" if moe else f", FFN {config.intermediate_size}")
    rope = config.rope_parameters
    title = "MiniMind-3-MoE" if moe else "MiniMind-3"
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# {title} ({preset or 'custom'} size), exported by minimind-trl", "",
             "| | |", "|---|---|", f"| preset | `{preset or 'custom'}` |", f"| parameters | {params} |",
             f"| shape | {shape} |", f"| RoPE | {rope['rope_type']}, theta {rope['rope_theta']:g} |",
             f"| format | `{format}` |", ""]
    if manifest:
        lines += _training_section(manifest)
    if metrics:
        lines += ["## Evaluation", "", "| metric | value |", "|---|---|"]
        lines += [f"| {name} | {value:.4g} |" if isinstance(value, float) else f"| {name} | {value} |"
                  for name, value in metrics.items()] + [""]
    how = ("MiniMind's own code ships in this folder (`configuration_minimind.py`, `modeling_minimind.py`): "
           "load it with `trust_remote_code=True` (transformers 5.24), no minimind-trl needed."
           if format == "minimind" else
           f"A plain `{architecture}` folder: stock transformers (and servers that read Qwen3 folders) load it "
           "without custom code; the logits equal MiniMind's.")
    where = "inside this folder (or with its Hub id)" if repo_id == "." else f"with `{repo_id}`"
    lines += ["## How to load", "", how, f"Run {where}:", "",
              "```python", _load_snippet(format, repo_id, with_tokenizer), "```", ""]
    if not with_tokenizer:
        lines += ["No tokenizer was exported with these weights: use `minimind_trl.tokenization.load_tokenizer()`.", ""]
    return "\n".join(lines)


__all__ = ["model_card", "preset_name", "read_manifest"]
