"""PEFT defaults for MiniMind: which modules and parameters LoRA adapts.

`register_peft_defaults()` (run on import of `minimind_trl.modeling`) adds model_type "minimind"
to PEFT's table of default LoRA targets, so `LoraConfig(task_type="CAUSAL_LM")` without
`target_modules` adapts every attention and MLP projection (`LORA_TARGET_MODULES`).

MoE experts are fused `nn.Parameter`s (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
[E, H, I]), not `nn.Linear`s, so module names never reach them: a MoE model's default (or an
explicit gate/up/down list) adapts attention only. PEFT reaches them through `target_parameters`;
`lora_targets(config)` gives the complete pair for a dense or MoE config. The router stays frozen.
"""

from __future__ import annotations

from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULT_LORA_TARGETS

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_MODULES = LORA_TARGET_MODULES[:4]
MOE_EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def register_peft_defaults() -> bool:
    """Register the default LoRA target modules for model_type "minimind" (an existing entry is kept);
    True once registered (peft is a required dependency)."""
    PEFT_DEFAULT_LORA_TARGETS.setdefault("minimind", list(LORA_TARGET_MODULES))
    return True


def lora_targets(config) -> dict:
    """`LoraConfig` keyword arguments reaching every projection: all linear projections (dense), or
    attention plus the fused expert tensors (MoE, whose MLP has no linear projections)."""
    if getattr(config, "use_moe", False):
        return {"target_modules": list(ATTENTION_MODULES), "target_parameters": list(MOE_EXPERT_PARAMETERS)}
    return {"target_modules": list(LORA_TARGET_MODULES), "target_parameters": None}


__all__ = ["LORA_TARGET_MODULES", "MOE_EXPERT_PARAMETERS", "lora_targets", "register_peft_defaults"]
