"""MiniMind as a registered transformers model: config, dense/MoE model, presets, checkpoints, export
(Hub folders: `save_for_hub`; a GGUF file for llama.cpp: `save_gguf`).

Importing this package registers `MiniMindConfig` (model_type "minimind") with `AutoConfig` and
`MiniMindForCausalLM` / `MiniMindModel` / `MiniMindForSequenceClassification` with `AutoModelForCausalLM` /
`AutoModel` / `AutoModelForSequenceClassification`, so folders written
by `save_pretrained` load with the standard `from_pretrained`. It also registers PEFT's default
LoRA targets for "minimind" (`peft_targets`).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .configuration_minimind import MiniMindConfig
from .gguf_export import save_gguf
from .hub import qwen3_config, save_for_hub
from .modeling_minimind import (
    MiniMindForCausalLM,
    MiniMindForSequenceClassification,
    MiniMindModel,
    MiniMindPreTrainedModel,
    router_aux_loss,
)
from .native import load_native_checkpoint, native_key_shapes, save_native_checkpoint
from .peft_targets import LORA_TARGET_MODULES, MOE_EXPERT_PARAMETERS, lora_targets, register_peft_defaults
from .presets import PRESETS, count_parameters, get_preset

AutoConfig.register(MiniMindConfig.model_type, MiniMindConfig, exist_ok=True)
AutoModel.register(MiniMindConfig, MiniMindModel, exist_ok=True)
AutoModelForCausalLM.register(MiniMindConfig, MiniMindForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(MiniMindConfig, MiniMindForSequenceClassification, exist_ok=True)
register_peft_defaults()

__all__ = [
    "LORA_TARGET_MODULES",
    "MOE_EXPERT_PARAMETERS",
    "PRESETS",
    "MiniMindConfig",
    "MiniMindForCausalLM",
    "MiniMindForSequenceClassification",
    "MiniMindModel",
    "MiniMindPreTrainedModel",
    "count_parameters",
    "get_preset",
    "load_native_checkpoint",
    "lora_targets",
    "native_key_shapes",
    "qwen3_config",
    "register_peft_defaults",
    "router_aux_loss",
    "save_for_hub",
    "save_gguf",
    "save_native_checkpoint",
]
