"""Named MiniMind sizes and parameter counting.

| preset           | hidden | layers | heads / KV | FFN  | params                                   |
|------------------|--------|--------|------------|------|------------------------------------------|
| `minimind-3`     | 768    | 8      | 8 / 4      | 2432 | 63,912,192                               |
| `minimind-3-moe` | 768    | 8      | 8 / 4      | 4 experts x 2432, top-1 | 198,416,640 total, 63,936,768 active |
| `tiny`           | 64     | 2      | 4 / 2      | 256  | 532,864 (tests)                          |
| `tiny-moe`       | 64     | 2      | 4 / 2      | 4 x 256, top-1 | 828,288 (tests)                |
| `demo`           | 256    | 4      | 8 / 4      | 832  | 4,983,296 (CPU demo)                     |

All keep vocab 6400 and the other upstream defaults (FFN width = ceil(hidden * pi / 64) * 64).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from .configuration_minimind import MiniMindConfig

_SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}

_EXTRA_KEYWORDS = {"attn_implementation", "experts_implementation", "output_router_logits"}

PRESETS: dict[str, dict[str, Any]] = {
    "minimind-3": {},
    "minimind-3-moe": {"use_moe": True},
    "tiny": dict(_SMALL),
    "tiny-moe": {**_SMALL, "use_moe": True},
    "demo": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4},
}


def get_preset(name: str, **overrides: Any) -> MiniMindConfig:
    """The `MiniMindConfig` of preset `name`, with any config field overridden by keyword.

    Besides config fields, `attn_implementation`, `experts_implementation` and (MoE)
    `output_router_logits` are accepted; any other keyword is a ValueError naming it.
    """
    if name not in PRESETS:
        raise ValueError(f"get_preset: unknown name {name!r}; choose one of {sorted(PRESETS)}")
    known = {field.name for field in dataclasses.fields(MiniMindConfig)} | _EXTRA_KEYWORDS
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"get_preset: unknown config fields {unknown}")
    return MiniMindConfig(**{**PRESETS[name], **overrides})


def count_parameters(model: nn.Module, active: bool = False) -> int:
    """Number of parameters, each shared tensor (the tied embedding / LM head) counted once.

    With `active=True`, only those a token uses: in every MoE layer the (E - k) experts it is not
    routed to are left out, i.e. minus (E - k) * (2*I*H + H*I) per layer. The router counts.
    Works on the meta device.
    """
    seen: set[int] = set()
    total = 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    if active:
        top_k = model.config.num_experts_per_tok
        for module in model.modules():
            if isinstance(module, Qwen3MoeExperts):
                per_expert = (module.gate_up_proj.numel() + module.down_proj.numel()) // module.num_experts
                total -= (module.num_experts - top_k) * per_expert
    return total


__all__ = ["PRESETS", "count_parameters", "get_preset"]
