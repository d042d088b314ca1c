"""`MiniMindForCausalLM`: MiniMind-3 (dense) and MiniMind-3-MoE built from transformers' Qwen3 blocks.

Self-contained (imports only torch, transformers and `.configuration_minimind`), because
`save_for_hub(format="minimind")` copies it next to the weights for `trust_remote_code=True`.

Numerically MiniMind is Qwen3: pre-norm decoder layers with grouped-query attention, per-head
RMSNorm on q and k before rotate-half RoPE, SwiGLU MLP, final RMSNorm, tied LM head. So the
layers are transformers' own: `Qwen3DecoderLayer` (dense) or `Qwen3MoeDecoderLayer` (MoE: softmax
router over all E experts, top-k, renormalised top-k weights, no shared expert; experts stored
fused as `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]). Parameter names equal
Qwen3's / Qwen3-MoE's, so weights move between the three without renaming.

What is ours: the backbone wiring (embedding without `padding_idx`, as upstream, so token 0 gets
gradients like any other), and the MoE auxiliary loss, which follows upstream, not Qwen3-MoE:

    aux = sum_layers  E * sum_e  load_e * P_e           (output `aux_loss`, unweighted)
    load_e = #{(token, slot) routed to e} / #tokens      (top-k slots, so sum_e load_e = k)
    P_e    = mean over tokens of softmax(router_logits)_e
    loss   = cross_entropy + router_aux_loss_coef * aux  (training mode, when labels are given)

Upstream reports `router_aux_loss_coef * aux` as its aux loss; transformers/TRL report the
unweighted value and weight it themselves, so that is what `aux_loss` holds. Tokens whose
`attention_mask` is 0 (padding) are left out of both averages; with no mask, or an all-ones mask,
this is exactly upstream (which has no mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GenericForSequenceClassification
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast
from transformers.modeling_utils import PreTrainedModel, slice_logits_to_keep
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeAttention,
    Qwen3MoeDecoderLayer,
    Qwen3MoeExperts,
    Qwen3MoeTopKRouter,
)
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_minimind import MiniMindConfig


def router_aux_loss(
    router_logits: tuple[torch.Tensor, ...],
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Upstream MiniMind load-balancing loss, summed over layers (unweighted by the coefficient).

    Args:
        router_logits: one [N, E] tensor per MoE layer, N = batch * seq tokens of this forward.
        num_experts: E.
        top_k: experts per token (k).
        attention_mask: optional [batch, >= seq] 0/1 mask; its last `seq` columns mark the real
            tokens of this forward. Masked tokens are excluded from load_e and P_e.

    Returns:
        Scalar: sum_l E * sum_e load_{l,e} * P_{l,e}, with load_e = (token, slot) assignments to e
        per valid token and P_e the mean router probability over valid tokens (float32).
    """
    if not router_logits:
        raise ValueError("router_aux_loss: router_logits is empty (a dense model has no router)")
    num_tokens = router_logits[0].shape[0]
    weights = torch.ones(num_tokens, device=router_logits[0].device)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        seq_len = num_tokens // attention_mask.shape[0]
        weights = attention_mask[:, -seq_len:].reshape(-1).to(weights)
    denominator = weights.sum().clamp(min=1.0)
    total = torch.zeros((), device=weights.device)
    for logits in router_logits:
        probs = F.softmax(logits.float(), dim=-1)  # [N, E]
        chosen = torch.topk(probs, top_k, dim=-1).indices  # [N, k]
        slots_per_expert = F.one_hot(chosen, num_experts).sum(dim=1).float()  # [N, E]
        load = (slots_per_expert * weights[:, None]).sum(0) / denominator  # [E]
        mean_prob = (probs * weights[:, None]).sum(0) / denominator  # [E]
        total = total + num_experts * (load * mean_prob).sum()
    return total


class MiniMindPreTrainedModel(PreTrainedModel):
    """Shared set-up: config class, attention back-ends, output capture, weight init."""

    config_class = MiniMindConfig
    config: MiniMindConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Qwen3DecoderLayer", "Qwen3MoeDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {
        "router_logits": OutputRecorder(Qwen3MoeTopKRouter, index=0),
        "hidden_states": [Qwen3DecoderLayer, Qwen3MoeDecoderLayer],
        "attentions": [
            OutputRecorder(Qwen3Attention, index=1),
            OutputRecorder(Qwen3MoeAttention, index=1),
        ],
    }

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        """The experts are transformers' `Qwen3MoeExperts`, which dispatch on
        `config._experts_implementation` ("eager", "grouped_mm", ...); transformers' own check
        greps this module's source for its decorator and would wrongly answer no."""
        return True

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' defaults (normal(0, initializer_range) linears/embeddings, unit norms)
        plus the fused expert tensors and the router, which are bare parameters."""
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, Qwen3MoeExperts):
            init.normal_(module.gate_up_proj, mean=0.0, std=std)
            init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, Qwen3MoeTopKRouter):
            init.normal_(module.weight, mean=0.0, std=std)


class MiniMindModel(MiniMindPreTrainedModel):
    """Embedding -> L decoder layers -> final RMSNorm. Input ids [B, T] -> hidden states [B, T, H]."""

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        layer_class = Qwen3MoeDecoderLayer if config.use_moe else Qwen3DecoderLayer
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> MoeModelOutputWithPast:
        """Returns `last_hidden_state` [B, T, H], `cache`, and when requested (`output_*=True`)
        `hidden_states` (L+1 tensors), `attentions`, `router_logits` (MoE: L tensors [B*T, E])."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("MiniMindModel.forward: give exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past_seen = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen
            position_ids = position_ids.unsqueeze(0)
        if isinstance(attention_mask, dict):  # already prepared (e.g. by `generate`)
            causal_mask = attention_mask["full_attention"]
        else:
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask=causal_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        hidden_states = self.norm(hidden_states)
        return MoeModelOutputWithPast(last_hidden_state=hidden_states, cache=cache if use_cache else None)


class MiniMindForCausalLM(MiniMindPreTrainedModel, GenerationMixin):
    """MiniMind with its (tied) LM head: ids [B, T] -> logits [B, T, V]; dense or MoE by `config.use_moe`."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.model = MiniMindModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_router_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> MoeCausalLMOutputWithPast:
        """Causal LM forward.

        `loss` = mean next-token cross-entropy over labels != -100 (+ coef * aux in training, MoE).
        `aux_loss` (MoE, in training or when `output_router_logits`): `router_aux_loss` above.
        `router_logits` (MoE, when `output_router_logits`): L tensors [B*T, E], pre-softmax.
        """
        config = self.config
        moe = config.use_moe
        if output_router_logits is None:
            output_router_logits = moe and config.output_router_logits
        return_router = bool(moe and output_router_logits)
        compute_aux = moe and (self.training or return_router)
        outputs: MoeModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=compute_aux,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=config.vocab_size, **kwargs)
        aux_loss = None
        if compute_aux:
            aux_loss = router_aux_loss(
                outputs.router_logits, config.num_experts, config.num_experts_per_tok, attention_mask
            )
            if loss is not None and self.training:
                loss = loss + config.router_aux_loss_coef * aux_loss.to(loss.device)
        return MoeCausalLMOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            router_logits=outputs.router_logits if return_router else None,
        )


class MiniMindForSequenceClassification(GenericForSequenceClassification, MiniMindPreTrainedModel):
    """MiniMind with a linear ``score`` head on the last real token (transformers' generic
    sequence-classification head, as Qwen3's): the reward model of protocol E4, trained by the
    ``reward`` recipe kind from a causal-LM folder (its LM head is dropped, ``score`` is new)."""


__all__ = ["MiniMindForCausalLM", "MiniMindForSequenceClassification", "MiniMindModel", "MiniMindPreTrainedModel",
           "router_aux_loss"]
