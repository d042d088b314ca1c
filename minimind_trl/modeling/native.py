"""Upstream MiniMind `.pth` checkpoints (e.g. `full_sft_768.pth`) <-> `MiniMindForCausalLM`.

A native checkpoint is a plain state dict, fp16, holding both tied keys (`model.embed_tokens.weight`
and `lm_head.weight`, equal). Key names equal ours except the MoE experts, which upstream keeps per
expert and we keep fused the Qwen3-MoE way:

    native  model.layers.{i}.mlp.experts.{e}.gate_proj.weight  [I, H]
            model.layers.{i}.mlp.experts.{e}.up_proj.weight    [I, H]
            model.layers.{i}.mlp.experts.{e}.down_proj.weight  [H, I]
    ours    model.layers.{i}.mlp.experts.gate_up_proj  [E, 2I, H] = stack_e(cat(gate_e, up_e))
            model.layers.{i}.mlp.experts.down_proj     [E, H, I]  = stack_e(down_e)

The router `model.layers.{i}.mlp.gate.weight` [E, H] is the same in both.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from .configuration_minimind import MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM


def native_key_shapes(config: MiniMindConfig) -> dict[str, tuple[int, ...]]:
    """Every key of an upstream checkpoint for `config`, in upstream's order, with its shape."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        shapes[prefix + "self_attn.q_proj.weight"] = (q_width, hidden)
        shapes[prefix + "self_attn.k_proj.weight"] = (kv_width, hidden)
        shapes[prefix + "self_attn.v_proj.weight"] = (kv_width, hidden)
        shapes[prefix + "self_attn.o_proj.weight"] = (hidden, q_width)
        shapes[prefix + "self_attn.q_norm.weight"] = (head_dim,)
        shapes[prefix + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[prefix + "input_layernorm.weight"] = (hidden,)
        shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)
        if config.use_moe:
            width = config.moe_intermediate_size
            shapes[prefix + "mlp.gate.weight"] = (config.num_experts, hidden)
            for e in range(config.num_experts):
                shapes[prefix + f"mlp.experts.{e}.gate_proj.weight"] = (width, hidden)
                shapes[prefix + f"mlp.experts.{e}.down_proj.weight"] = (hidden, width)
                shapes[prefix + f"mlp.experts.{e}.up_proj.weight"] = (width, hidden)
        else:
            width = config.intermediate_size
            shapes[prefix + "mlp.gate_proj.weight"] = (width, hidden)
            shapes[prefix + "mlp.down_proj.weight"] = (hidden, width)
            shapes[prefix + "mlp.up_proj.weight"] = (width, hidden)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def check_native_state_dict(state_dict: dict[str, torch.Tensor], config: MiniMindConfig) -> None:
    """Raise one ValueError listing every missing, unexpected and mis-shaped key (and unequal tied keys)."""
    expected = native_key_shapes(config)
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    misshaped = [
        f"{key} {tuple(state_dict[key].shape)} (expected {shape})"
        for key, shape in expected.items()
        if key in state_dict and tuple(state_dict[key].shape) != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {missing}")
    if unexpected:
        problems.append(f"unexpected keys: {unexpected}")
    if misshaped:
        problems.append(f"mis-shaped keys: {misshaped}")
    tied = ("model.embed_tokens.weight", "lm_head.weight")
    if (
        not problems
        and config.tie_word_embeddings
        and not torch.equal(state_dict[tied[0]].float(), state_dict[tied[1]].float())
    ):
        problems.append(f"tie_word_embeddings=True but {tied[0]} and {tied[1]} differ")
    if problems:
        raise ValueError("native MiniMind checkpoint does not match the config: " + "; ".join(problems))


def native_to_hf_state_dict(state_dict: dict[str, torch.Tensor], config: MiniMindConfig) -> dict[str, torch.Tensor]:
    """Upstream keys -> our keys (fuses per-expert MoE weights); validates first."""
    check_native_state_dict(state_dict, config)
    converted = {key: value for key, value in state_dict.items() if ".mlp.experts." not in key}
    if config.use_moe:
        for i in range(config.num_hidden_layers):
            prefix = f"model.layers.{i}.mlp.experts."
            experts = range(config.num_experts)
            converted[prefix + "gate_up_proj"] = torch.stack([
                torch.cat([state_dict[f"{prefix}{e}.gate_proj.weight"], state_dict[f"{prefix}{e}.up_proj.weight"]])
                for e in experts
            ])
            converted[prefix + "down_proj"] = torch.stack(
                [state_dict[f"{prefix}{e}.down_proj.weight"] for e in experts]
            )
    return converted


def hf_to_native_state_dict(
    state_dict: dict[str, torch.Tensor], config: MiniMindConfig, dtype: torch.dtype | None = torch.float16
) -> dict[str, torch.Tensor]:
    """Our keys -> upstream keys in upstream order (splits fused experts, writes both tied keys).

    Each tensor is a fresh contiguous copy in `dtype` (None keeps the model's dtype).
    """
    if config.tie_word_embeddings:
        state_dict = {**state_dict, "lm_head.weight": state_dict["model.embed_tokens.weight"]}
    native: dict[str, torch.Tensor] = {}
    for key in native_key_shapes(config):
        if ".mlp.experts." in key:
            experts, expert, name, _ = key.rsplit(".", 3)  # "model.layers.{i}.mlp.experts", "{e}", name, "weight"
            if name == "down_proj":
                tensor = state_dict[experts + ".down_proj"][int(expert)]
            else:
                gate, up = state_dict[experts + ".gate_up_proj"][int(expert)].chunk(2, dim=0)
                tensor = gate if name == "gate_proj" else up
        else:
            tensor = state_dict[key]
        tensor = tensor.detach().to("cpu", dtype=dtype or tensor.dtype)
        native[key] = tensor.clone(memory_format=torch.contiguous_format)
    return native


def load_native_checkpoint(
    path: str | os.PathLike, config: MiniMindConfig, dtype: torch.dtype = torch.float32
) -> MiniMindForCausalLM:
    """Build `MiniMindForCausalLM(config)` in `dtype` (eval mode) with the weights of an upstream `.pth`."""
    if not isinstance(config, MiniMindConfig):
        raise ValueError(f"load_native_checkpoint: config must be a MiniMindConfig (got {type(config).__name__})")
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state_dict, dict):
        raise ValueError(f"load_native_checkpoint: {path} holds a {type(state_dict).__name__}, not a state dict")
    converted = native_to_hf_state_dict(state_dict, config)
    model = MiniMindForCausalLM(config)
    model.load_state_dict(converted, strict=True)
    return model.to(dtype).eval()


def save_native_checkpoint(
    model: MiniMindForCausalLM, path: str | os.PathLike, dtype: torch.dtype | None = torch.float16
) -> Path:
    """Write `model` as an upstream `.pth` (fp16 by default); atomic (temp file, then rename)."""
    path = Path(path)
    native = hf_to_native_state_dict(model.state_dict(), model.config, dtype=dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        torch.save(native, temp_name)
        os.replace(temp_name, path)
    finally:
        if os.path.exists(temp_name):
            os.remove(temp_name)
    return path


__all__ = [
    "check_native_state_dict",
    "hf_to_native_state_dict",
    "load_native_checkpoint",
    "native_key_shapes",
    "native_to_hf_state_dict",
    "save_native_checkpoint",
]
