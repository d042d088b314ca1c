"""`MiniMindConfig`: the MiniMind-3 configuration, with the upstream keyword names and defaults.

Self-contained (imports only `transformers`), because `save_for_hub(format="minimind")` copies this
file next to the weights so the folder loads with `trust_remote_code=True` without this package.

Derived values, as upstream:

    head_dim                = hidden_size // num_attention_heads          (when not given)
    intermediate_size       = ceil(hidden_size * pi / 64) * 64            (768 -> 2432)
    moe_intermediate_size   = intermediate_size                           (when not given)

RoPE (rotate-half, base `rope_theta`) is stored in transformers' `rope_parameters` form, derived
from `rope_theta` and `inference_rope_scaling`. With `inference_rope_scaling=True` it is YaRN with
upstream's constants: factor s=16, original context 2048, beta_fast 32, beta_slow 1 and attention
factor 1.0 (transformers' default would be 0.1 ln(s) + 1). With d = head_dim, i = 0 .. d/2-1:

    freq_i  = theta^(-2i/d)
    low     = max(floor(d ln(2048 / (2 pi 32)) / (2 ln theta)), 0)
    high    = ceil(d ln(2048 / (2 pi 1)) / (2 ln theta))
    ramp_i  = clamp((i - low) / (high - low), 0, 1)
    freq'_i = freq_i (1 - ramp_i + ramp_i / s)

which is transformers' "yarn" rope type with `attention_factor=1.0` (checked against upstream's
logits in the tests). transformers caps `high` at d-1; the two agree whenever high < d/2, i.e. for
every rope_theta > 2048/(2 pi) ~ 326.

The Qwen3 / Qwen3-MoE building blocks the model reuses read a few more attributes; MiniMind fixes
them (no attention bias, no sliding window, every layer full attention and, for MoE, sparse).
`dropout` is applied as attention-probability dropout (`attention_dropout`); upstream's residual
and embedding dropout are not modelled (upstream trains with dropout 0).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

YARN_FACTOR = 16.0
YARN_ORIGINAL_MAX_POSITIONS = 2048
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
YARN_ATTENTION_FACTOR = 1.0


def default_intermediate_size(hidden_size: int) -> int:
    """Upstream's FFN width: ceil(hidden_size * pi / 64) * 64 (768 -> 2432, 64 -> 256)."""
    return math.ceil(hidden_size * math.pi / 64) * 64


def minimind_rope_parameters(rope_theta: float, inference_rope_scaling: bool) -> dict[str, Any]:
    """The transformers `rope_parameters` dict equivalent to upstream's RoPE / YaRN settings."""
    if not inference_rope_scaling:
        return {"rope_type": "default", "rope_theta": float(rope_theta)}
    return {
        "rope_type": "yarn",
        "rope_theta": float(rope_theta),
        "factor": YARN_FACTOR,
        "original_max_position_embeddings": YARN_ORIGINAL_MAX_POSITIONS,
        "beta_fast": YARN_BETA_FAST,
        "beta_slow": YARN_BETA_SLOW,
        "attention_factor": YARN_ATTENTION_FACTOR,
    }


def _rope_disagreements(given: dict | None, derived: dict[str, Any]) -> list[str]:
    """Keys of a user-given RoPE dict whose values differ from the derived one (legacy `type` = `rope_type`)."""
    if given is None:
        return []
    normalized = dict(given)
    if "type" in normalized:
        normalized.setdefault("rope_type", normalized.pop("type"))
    missing = object()
    return sorted(key for key, value in normalized.items() if derived.get(key, missing) != value)


class MiniMindConfig(PreTrainedConfig):
    """Configuration of `MiniMindForCausalLM` (dense, or MoE with `use_moe=True`).

    Invalid values raise one `ValueError` naming every offending field. `output_router_logits`
    exists only on MoE configs (TRL reads its presence as "this model is a Mixture-of-Experts").
    """

    model_type = "minimind"
    base_model_tp_plan = Qwen3MoeConfig.base_model_tp_plan
    base_model_ep_plan = Qwen3MoeConfig.base_model_ep_plan
    base_model_pp_plan = Qwen3MoeConfig.base_model_pp_plan
    # Remote-code loaders (TRL's reference-model builder) read `config.auto_map` unguarded; only a
    # `save_for_hub(format="minimind")` folder sets a real one. An empty read-only mapping, not None:
    # transformers' Auto*.from_pretrained tests `cls.__name__ in config.auto_map`.
    auto_map = MappingProxyType({})

    # Fixed for MiniMind; read by the reused Qwen3 / Qwen3-MoE modules (class constants, not saved).
    attention_bias = False
    use_sliding_window = False
    sliding_window = None
    decoder_sparse_step = 1
    mlp_only_layers = ()

    vocab_size: int = 6400
    hidden_size: int = 768
    intermediate_size: int | None = None
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rope_theta: float = 1e6
    inference_rope_scaling: bool = False
    rope_parameters: dict | None = None
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    dropout: float = 0.0
    use_cache: bool = True
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0
    use_moe: bool = False
    num_experts: int = 4
    num_experts_per_tok: int = 1
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 5e-4

    def __post_init__(self, **kwargs):
        self._router_logits_flag = False
        self._validate_and_derive()
        derived_rope = minimind_rope_parameters(self.rope_theta, self.inference_rope_scaling)
        given_dicts = {"rope_parameters": self.rope_parameters, "rope_scaling": kwargs.pop("rope_scaling", None)}
        for name, given in given_dicts.items():
            disagreeing = _rope_disagreements(given, derived_rope)
            if disagreeing:
                raise ValueError(
                    f"MiniMindConfig: {name} keys {disagreeing} of {given} disagree with rope_theta="
                    f"{self.rope_theta} and inference_rope_scaling={self.inference_rope_scaling}, from which "
                    f"RoPE is derived ({derived_rope}); set those two fields instead."
                )
        self.rope_parameters = derived_rope
        super().__post_init__(**kwargs)

    def _validate_and_derive(self) -> None:
        """Fill the derived sizes and raise one ValueError that names every invalid field."""
        problems: list[str] = []

        def positive_int(name: str, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive integer (got {value!r})")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "num_experts", "num_experts_per_tok"):
            positive_int(name)
        for name in ("head_dim", "intermediate_size", "moe_intermediate_size"):
            positive_int(name, optional=True)
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive number (got {value!r})")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must lie in [0, 1) (got {self.dropout!r})")
        if not isinstance(self.router_aux_loss_coef, (int, float)) or self.router_aux_loss_coef < 0:
            problems.append(f"router_aux_loss_coef must be >= 0 (got {self.router_aux_loss_coef!r})")
        if self.hidden_act not in ACT2FN:
            problems.append(f"hidden_act must be one of transformers' activations (got {self.hidden_act!r})")
        if problems:
            raise ValueError("MiniMindConfig: " + "; ".join(problems))

        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                problems.append(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}) when head_dim is not given"
                )
            else:
                self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim is not None and self.head_dim % 2:
            problems.append(f"head_dim ({self.head_dim}) must be even for rotate-half RoPE")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_experts_per_tok > self.num_experts:
            problems.append(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must not exceed num_experts ({self.num_experts})"
            )
        if problems:
            raise ValueError("MiniMindConfig: " + "; ".join(problems))
        if self.intermediate_size is None:
            self.intermediate_size = default_intermediate_size(self.hidden_size)
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size

    @property
    def attention_dropout(self) -> float:
        """Dropout on attention probabilities: another name for `dropout` (Qwen3 modules read this one)."""
        return self.dropout

    @attention_dropout.setter
    def attention_dropout(self, value: float) -> None:
        self.dropout = value

    @property
    def layer_types(self) -> list[str]:
        """Every layer is full (causal) attention."""
        return ["full_attention"] * self.num_hidden_layers

    @property
    def output_router_logits(self) -> bool:
        """MoE only: return per-layer router logits by default (and compute `aux_loss` in eval too)."""
        if not self.use_moe:
            raise AttributeError("output_router_logits exists only on MoE configs (use_moe=True)")
        return self._router_logits_flag

    @output_router_logits.setter
    def output_router_logits(self, value: bool) -> None:
        if value and not self.use_moe:
            raise ValueError("output_router_logits=True needs use_moe=True (a dense model has no router)")
        self._router_logits_flag = bool(value)

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        flag = output.pop("_router_logits_flag", False)
        if self.use_moe:
            output["output_router_logits"] = flag
        return output


__all__ = ["MiniMindConfig", "default_intermediate_size", "minimind_rope_parameters"]
