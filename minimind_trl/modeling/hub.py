"""Export a model as a Hugging Face folder, either as MiniMind (custom code) or as plain Qwen3.

`format="minimind"`: `save_pretrained` output (safetensors, fused experts) plus an `auto_map` in
config.json and copies of `configuration_minimind.py` / `modeling_minimind.py`, so a process that
never imported this package loads it with
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

`format="qwen3"`: a `qwen3` (dense) or `qwen3_moe` folder that stock transformers loads as
`Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` with identical logits (same RoPE dict, YaRN included).
MoE experts are written per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), the layout of
Qwen3-MoE checkpoints on the Hub. Note that Qwen3-MoE's own load-balancing loss differs from
MiniMind's (see `modeling_minimind`), which matters only when training the exported model.

Both write generation_config.json (bos 1, eos 2, pad 0 by default) and, when given, the tokenizer.
Writing is atomic: everything goes to a temporary folder beside `out_dir`, which is then renamed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3MoeConfig

from .configuration_minimind import MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM
from .native import hf_to_native_state_dict

CODE_FILES = ("configuration_minimind.py", "modeling_minimind.py")
AUTO_MAP = {
    "AutoConfig": "configuration_minimind.MiniMindConfig",
    "AutoModel": "modeling_minimind.MiniMindModel",
    "AutoModelForCausalLM": "modeling_minimind.MiniMindForCausalLM",
}


def qwen3_config(config: MiniMindConfig, dtype: torch.dtype | None = None) -> Qwen3Config | Qwen3MoeConfig:
    """The `Qwen3Config` (dense) or `Qwen3MoeConfig` (MoE) describing the same network."""
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        use_cache=config.use_cache,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=dict(config.rope_parameters),
        attention_bias=False,
        attention_dropout=config.dropout,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        dtype=dtype,
    )
    if not config.use_moe:
        return Qwen3Config(**common, architectures=["Qwen3ForCausalLM"])
    return Qwen3MoeConfig(
        **common,
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=config.norm_topk_prob,
        router_aux_loss_coef=config.router_aux_loss_coef,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        architectures=["Qwen3MoeForCausalLM"],
    )


def _write_minimind(model: MiniMindForCausalLM, folder: Path) -> None:
    model.save_pretrained(folder)
    config_path = folder / "config.json"
    config_dict = json.loads(config_path.read_text(encoding="utf-8"))
    config_dict["auto_map"] = AUTO_MAP
    config_path.write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    source_dir = Path(__file__).resolve().parent
    for name in CODE_FILES:
        shutil.copyfile(source_dir / name, folder / name)


def _write_qwen3(model: MiniMindForCausalLM, folder: Path) -> None:
    dtype = next(model.parameters()).dtype
    weights = hf_to_native_state_dict(model.state_dict(), model.config, dtype=None)
    if model.config.tie_word_embeddings:
        del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    qwen3_config(model.config, dtype=dtype).save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def _replace_folder(new: Path, target: Path) -> None:
    """Put `new` at `target` by renames: readers see the old folder, briefly none, or the new one,
    never a half-written one. An existing `target` is moved aside first and deleted afterwards."""
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, old / target.name)
    try:
        os.replace(new, target)
    except OSError:
        os.replace(old / target.name, target)  # put the previous export back
        raise
    finally:
        if target.exists():  # never delete the previous export while it is not back in place
            shutil.rmtree(old, ignore_errors=True)


def save_for_hub(model: MiniMindForCausalLM, tokenizer, out_dir: str | os.PathLike, format: str = "minimind") -> Path:
    """Write `model` (and `tokenizer`, unless None) to `out_dir` as `format` "minimind" or "qwen3"."""
    writers = {"minimind": _write_minimind, "qwen3": _write_qwen3}
    if format not in writers:
        raise ValueError(f"save_for_hub: format must be one of {sorted(writers)} (got {format!r})")
    if not isinstance(model, MiniMindForCausalLM):
        raise ValueError(f"save_for_hub: model must be a MiniMindForCausalLM (got {type(model).__name__})")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        writers[format](model, temp)
        if tokenizer is not None:
            tokenizer.save_pretrained(temp)
        _replace_folder(temp, out_dir)
    finally:
        if temp.exists():
            shutil.rmtree(temp)
    return out_dir


__all__ = ["save_for_hub", "qwen3_config"]
