"""Prefix-shared, padding-free policy passes: every distinct prompt is encoded once per pass.

A GRPO micro-batch holds ``B = prompts x G`` rows ``[prompt | completion]``; the G rows of a group
share their prompt, and on the demo and the real protocol all prompts share a long preamble (the
system turn with the tool list). The plain pass (``model(input_ids [B, P+C])``) computes the same
prompt activations G times and runs every layer over pads. This pass packs the micro-batch into one
row of ``N`` distinct tokens, none of them a pad (Prefix Grouper, Liu et al. 2025,
arXiv:2506.05433, generalised to a tree of shared segments):

    packed = [common prefix of all prompts] [suffix of prompt 1] ... [suffix of prompt U]
             [completion of row 1] ... [completion of row B]                            # (N,)

Embeddings, norms, projections, MLP / MoE experts and the LM head run on the ``N`` packed tokens;
only attention knows the rows. A token's queries see exactly the keys it would see in its own row
of the plain pass, at the same relative positions (RoPE depends on the position difference only):

    common token        -> common tokens before it
    suffix token of u   -> the common prefix, and u's suffix before it
    completion token    -> the common prefix, its prompt's suffix, and its completion before it

Attention runs on blocks (one per segment: its queries and its key list), bucketed by shape so that
padded query x key area is at most 5/4 of the real area; each bucket is one call of the model's
attention function (SDPA or eager; other back-ends use SDPA here) with a boolean block mask. Pads
exist only inside those attention calls, never in a linear layer. Gradients flow through the shared
prefix: its keys and values are gathered, not detached, so the prompt receives the summed gradient
of all G completions, as in the plain pass.

MoE: every packed token is weighted by the number of rows that contain it (``weights``), so the aux
loss (:func:`minimind_trl.modeling.router_aux_loss`) and the router statistics are those of the
plain pass, which counts a group's prompt once per row. The switch changes speed and memory, not
the objective (values equal to the plain pass within float rounding, tested to 1e-5).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import ModelOutput
from transformers.models.qwen3.modeling_qwen3 import (
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from minimind_trl.modeling import router_aux_loss
from minimind_trl.modeling.aux_loss import use_minimind_aux_loss
from minimind_trl.trainer.head_logprobs import lm_head_log_probs

_BUCKET_WASTE = 1.25  # padded area / real area allowed in one attention bucket


@dataclass
class AttentionBucket:
    """Blocks of one shape: ``query_index`` (nb, Lq) and ``key_index`` (nb, Lk) into the packed
    tokens, ``mask`` (nb, 1, Lq, Lk) bool (True = attend), ``query_valid`` (nb, Lq) bool."""

    query_index: torch.Tensor
    key_index: torch.Tensor
    mask: torch.Tensor
    query_valid: torch.Tensor
    _additive: dict = field(default_factory=dict, repr=False)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as eager attention adds it (0 / dtype min), made once per dtype for all layers."""
        if dtype not in self._additive:
            additive = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self._additive[dtype] = additive.masked_fill_(~self.mask, torch.finfo(dtype).min)
        return self._additive[dtype]


@dataclass
class PrefixLayout:
    """One micro-batch packed for :func:`shared_forward` (see the module docstring).

    Fields: ``input_ids`` / ``position_ids`` / ``weights`` (N,) packed tokens, their positions in
    their rows and how many rows contain each; ``buckets``; ``query_order`` (N,) the packed index of
    each row of the concatenated bucket outputs, inverted; ``score_index`` (B, C) the packed token
    whose hidden state scores completion token (b, j); ``labels`` (B, C) completion ids;
    ``completion_mask`` (B, C) bool; ``num_rows`` B and ``num_distinct_prompts`` U.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    weights: torch.Tensor
    buckets: list[AttentionBucket]
    query_order: torch.Tensor
    score_index: torch.Tensor
    labels: torch.Tensor
    completion_mask: torch.Tensor
    num_rows: int
    num_distinct_prompts: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def action_weights(self, action_mask: torch.Tensor) -> torch.Tensor:
        """(N,) number of action tokens each packed token's hidden state scores (router flip rate)."""
        index = self.score_index[action_mask.bool()]
        out = torch.zeros(self.num_tokens, dtype=torch.float64, device=index.device)
        return out.index_add_(0, index, torch.ones(index.numel(), dtype=torch.float64, device=index.device))


def _real_span(mask_row: list[int], left_padded: bool, what: str) -> tuple[int, int]:
    """(start, end) of the ones of a 0/1 mask row padded on one side (TRL: prompts left, completions right)."""
    ones = sum(mask_row)
    pads = [0] * (len(mask_row) - ones)
    if mask_row != (pads + [1] * ones if left_padded else [1] * ones + pads):
        side = "left" if left_padded else "right"
        raise ValueError(f"prefix sharing needs {side}-padded 0/1 {what} masks, got {mask_row}")
    return (len(pads), len(mask_row)) if left_padded else (0, ones)


def _common_prefix(sequences: list[list[int]]) -> int:
    if len(sequences) < 2:
        return 0
    first, length = sequences[0], min(len(s) for s in sequences)
    for i in range(length):
        token = first[i]
        if any(s[i] != token for s in sequences[1:]):
            return i
    return length


def build_layout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor, share_common_prefix: bool = True) -> PrefixLayout:
    """Pack a micro-batch: prompts (B, P) left-padded, completions (B, C) right-padded (TRL's layout).

    Rows whose real prompt tokens are identical share one copy; when there are several distinct
    prompts, their longest common prefix is stored once more (``share_common_prefix``).
    """
    device = prompt_ids.device
    batch, prompt_width = prompt_ids.shape
    prompt_rows, prompt_masks = prompt_ids.tolist(), prompt_mask.tolist()
    completion_rows, completion_masks = completion_ids.tolist(), completion_mask.tolist()

    prompts: list[list[int]] = []
    prompt_of_row: list[int] = []
    index_of: dict[tuple[int, ...], int] = {}
    for b in range(batch):
        start, end = _real_span(prompt_masks[b], True, "prompt")
        if start == end:
            raise ValueError(f"prefix sharing: row {b} has an empty prompt")
        key = tuple(prompt_rows[b][start:end])
        if key not in index_of:
            index_of[key] = len(prompts)
            prompts.append(list(key))
        prompt_of_row.append(index_of[key])
    rows_of_prompt = [0] * len(prompts)
    for u in prompt_of_row:
        rows_of_prompt[u] += 1
    common = _common_prefix(prompts) if share_common_prefix else 0

    ids: list[int] = []
    positions: list[int] = []
    weights: list[float] = []
    blocks: list[tuple[list[int], list[int]]] = []  # (query packed indices, key packed indices)

    def add(tokens: list[int], first_position: int, weight: float) -> list[int]:
        start = len(ids)
        ids.extend(tokens)
        positions.extend(range(first_position, first_position + len(tokens)))
        weights.extend([weight] * len(tokens))
        return list(range(start, len(ids)))

    common_index = add(prompts[0][:common], 0, float(batch)) if common else []
    if common_index:
        blocks.append((common_index, common_index))
    prompt_index: list[list[int]] = []  # packed indices of each distinct prompt's tokens, in order
    for u, tokens in enumerate(prompts):
        suffix = add(tokens[common:], common, float(rows_of_prompt[u]))
        if suffix:
            blocks.append((suffix, common_index + suffix))
        prompt_index.append(common_index + suffix)

    completion_width = completion_ids.size(1)
    score_index = [[0] * completion_width for _ in range(batch)]
    for b in range(batch):
        _, length = _real_span(completion_masks[b], False, "completion")
        context = prompt_index[prompt_of_row[b]]
        own = add(completion_rows[b][:length], len(context), 1.0)
        if own:
            blocks.append((own, context + own))
            score_index[b][:length] = [context[-1], *own[:-1]]

    buckets = _bucket(blocks, positions, device)
    order = torch.cat([bucket.query_index[bucket.query_valid] for bucket in buckets])
    query_order = torch.empty_like(order)
    query_order[order] = torch.arange(order.numel(), device=device)
    return PrefixLayout(
        input_ids=torch.tensor(ids, dtype=prompt_ids.dtype, device=device),
        position_ids=torch.tensor(positions, dtype=torch.long, device=device),
        weights=torch.tensor(weights, dtype=torch.float32, device=device),
        buckets=buckets,
        query_order=query_order,
        score_index=torch.tensor(score_index, dtype=torch.long, device=device),
        labels=completion_ids,
        completion_mask=completion_mask.bool(),
        num_rows=batch,
        num_distinct_prompts=len(prompts),
    )


def _bucket(blocks: list[tuple[list[int], list[int]]], positions: list[int], device) -> list[AttentionBucket]:
    """Group blocks (sorted by size) so that each group's padded area stays within ``_BUCKET_WASTE``."""
    blocks = sorted(blocks, key=lambda block: (len(block[0]), len(block[1])), reverse=True)
    groups: list[list[tuple[list[int], list[int]]]] = []
    longest_q = longest_k = real = 0
    for block in blocks:
        q, k = len(block[0]), len(block[1])
        if groups:
            wide_q, wide_k = max(longest_q, q), max(longest_k, k)
            if (len(groups[-1]) + 1) * wide_q * wide_k <= _BUCKET_WASTE * (real + q * k):
                groups[-1].append(block)
                longest_q, longest_k, real = wide_q, wide_k, real + q * k
                continue
        groups.append([block])
        longest_q, longest_k, real = q, k, q * k
    return [_make_bucket(group, positions, device) for group in groups]


def _make_bucket(group: list[tuple[list[int], list[int]]], positions: list[int], device) -> AttentionBucket:
    width_q, width_k = max(len(q) for q, _ in group), max(len(k) for _, k in group)
    query = torch.tensor([q + [0] * (width_q - len(q)) for q, _ in group], device=device)  # (nb, Lq)
    key = torch.tensor([k + [0] * (width_k - len(k)) for _, k in group], device=device)  # (nb, Lk)
    query_valid = torch.tensor([[i < len(q) for i in range(width_q)] for q, _ in group], device=device)
    key_valid = torch.tensor([[i < len(k) for i in range(width_k)] for _, k in group], device=device)
    position = torch.tensor(positions, device=device)
    causal = position[key][:, None, :] <= position[query][:, :, None]  # (nb, Lq, Lk)
    mask = causal & key_valid[:, None, :] & query_valid[:, :, None]
    mask[..., 0] |= ~query_valid  # a pad query attends to one real key: no empty softmax row
    return AttentionBucket(query, key, mask.unsqueeze(1), query_valid)


# ----------------------------------------------------------------------------------- forward


@dataclass
class SharedPassOutput(ModelOutput):
    """``log_probs`` / ``entropy`` (B, C), zero off the completion mask; ``aux_loss`` (MoE) or None."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def _attention(module: nn.Module, query, key, value, layout: PrefixLayout, eager: bool,
               cast_to_fp32: bool = False) -> torch.Tensor:
    """Block attention over the packed tokens: q (1, h, N, d), k/v (1, h_kv, N, d) -> (1, N, h*d).

    ``cast_to_fp32``, under autocast: softmax(q k^T / sqrt(d) + mask) v and its backward run in
    fp32 on q, k, v as they come (v from a bf16 linear; q and k from fp32 norms), with autocast off
    (it would cast SDPA to bf16), and the output returns in autocast's dtype, as SDPA's would. On a
    CPU, bf16 SDPA with a mask runs 1.1-2.6x slower than fp32, forward and backward
    (benchmarks/README.md). Without autocast (fp32) the flag changes nothing."""
    device = query.device.type
    if cast_to_fp32 and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return _attention(module, query.float(), key.float(), value.float(), layout, eager).to(dtype)
    query, key, value = query[0], key[0], value[0]  # (h, N, d)
    dropout = module.attention_dropout if module.training else 0.0
    outputs = []
    for bucket in layout.buckets:
        q = query[:, bucket.query_index].transpose(0, 1)  # (nb, h, Lq, d)
        k = key[:, bucket.key_index].transpose(0, 1)  # (nb, h_kv, Lk, d)
        v = value[:, bucket.key_index].transpose(0, 1)
        if eager:
            out, _ = eager_attention_forward(module, q, k, v, bucket.additive_mask(q.dtype), scaling=module.scaling,
                                             dropout=dropout)
        else:
            out, _ = sdpa_attention_forward(module, q, k, v, bucket.mask, dropout=dropout, scaling=module.scaling)
        outputs.append(out[bucket.query_valid])  # (valid queries, h, d)
    return torch.cat(outputs)[layout.query_order].flatten(1).unsqueeze(0)


def _decoder_layer(layer: nn.Module, hidden, cos, sin, layout: PrefixLayout, eager: bool,
                   cast_attention_to_fp32: bool = False):
    """One Qwen3 / Qwen3-MoE decoder layer on the packed row: the layer's own modules, block attention.
    Returns (hidden (1, N, H), router logits (N, E) or None)."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    query = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
    key = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
    value = attn.v_proj(x).view(shape).transpose(1, 2)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    hidden = hidden + attn.o_proj(_attention(attn, query, key, value, layout, eager, cast_attention_to_fp32))
    x = layer.post_attention_layernorm(hidden)
    gate = getattr(layer.mlp, "gate", None)
    router: list[torch.Tensor] = []
    handle = gate.register_forward_hook(lambda m, a, out: router.append(out[0])) if gate is not None else None
    try:
        hidden = hidden + layer.mlp(x)
    finally:
        if handle is not None:
            handle.remove()
    return (hidden, router[0]) if router else (hidden, None)


def shared_forward(model: nn.Module, layout: PrefixLayout, temperature: float = 1.0,
                   compute_entropy: bool = True, compute_aux_loss: bool = False,
                   cast_lm_head_to_fp32: bool = False, cast_attention_to_fp32: bool = False) -> SharedPassOutput:
    """Per-token log-probs (and entropies, MoE aux loss) of a packed micro-batch's completion tokens.

    ``model`` is a ``MiniMindForCausalLM`` (or a model with its layout: ``model.model.layers`` of
    Qwen3 decoder layers, tied or untied ``lm_head``). Logits are ``lm_head(h) / temperature`` as in
    TRL's fused head, computed on the scored positions only with TRL's chunked kernel's numbers
    (:func:`~minimind_trl.trainer.head_logprobs.lm_head_log_probs`: its own faster tiles on a CPU).
    ``cast_attention_to_fp32``: attention in fp32 under bf16 autocast (:func:`_attention`).
    """
    backbone = model.model
    eager = model.config._attn_implementation == "eager"
    hidden = backbone.embed_tokens(layout.input_ids).unsqueeze(0)  # (1, N, H)
    cos, sin = backbone.rotary_emb(hidden, layout.position_ids.unsqueeze(0))
    routers = []
    for layer in backbone.layers:
        step = functools.partial(_decoder_layer, layer, layout=layout, eager=eager,
                                 cast_attention_to_fp32=cast_attention_to_fp32)
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            hidden, router = layer._gradient_checkpointing_func(step, hidden, cos, sin)
        else:
            hidden, router = step(hidden, cos, sin)
        if router is not None:
            routers.append(router)
    hidden = backbone.norm(hidden)[0]  # (N, H)

    mask = layout.completion_mask  # (B, C)
    if not bool(mask.any()):  # nothing to score: zeros that still reach the graph
        zeros = hidden.sum() * 0.0 + torch.zeros(mask.shape, device=hidden.device)
        return SharedPassOutput(log_probs=zeros, entropy=zeros.detach() if compute_entropy else None,
                                aux_loss=_aux(model, routers, layout) if compute_aux_loss else None)
    scored = hidden[layout.score_index[mask]]  # (n, H)
    head = model.get_output_embeddings()
    context = torch.autocast(scored.device.type, enabled=False) if cast_lm_head_to_fp32 else contextlib.nullcontext()
    with context:
        log_probs, entropy = lm_head_log_probs(scored.float() if cast_lm_head_to_fp32 else scored, head.weight,
                                               head.bias, layout.labels[mask], temperature, compute_entropy)
    log_probs = log_probs.new_zeros(mask.shape).masked_scatter(mask, log_probs)
    entropy = entropy.new_zeros(mask.shape).masked_scatter(mask, entropy) if entropy is not None else None
    aux = _aux(model, routers, layout) if compute_aux_loss else None
    return SharedPassOutput(log_probs=log_probs, entropy=entropy, aux_loss=aux)


def _aux(model: nn.Module, routers: list[torch.Tensor], layout: PrefixLayout) -> torch.Tensor | None:
    """MiniMind's aux loss with each packed token counted once per row that contains it."""
    if not routers:
        return None
    config = model.config
    return router_aux_loss(tuple(routers), config.num_experts, config.num_experts_per_tok, layout.weights[None])


_SHARED_OPTIONS = ("temperature", "compute_entropy", "compute_aux_loss", "cast_lm_head_to_fp32",
                   "cast_attention_to_fp32")


def supports_shared_forward(model: nn.Module) -> bool:
    """Whether ``model`` has the layout :func:`shared_forward` runs (MiniMind, Qwen3, Qwen3-MoE)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or model.get_output_embeddings() is None:
        return False
    parts = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
    attention = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
    return all(hasattr(layer, p) for layer in layers for p in parts) and all(
        hasattr(layer.self_attn, p) for layer in layers for p in attention)


def install_shared_forward(model: nn.Module) -> None:
    """Let ``model(prefix_layout=layout, ...)`` run :func:`shared_forward`; other calls are unchanged.

    Going through ``model.forward`` keeps DDP / DeepSpeed wrappers in the loop (their hooks run on
    the wrapped call). Idempotent."""
    inner = model.forward
    if getattr(inner, "_minimind_shared", False):
        return

    @functools.wraps(inner)
    def forward(*args: Any, prefix_layout: PrefixLayout | None = None, **kwargs: Any):
        if prefix_layout is None:
            return inner(*args, **kwargs)
        options = {k: kwargs.pop(k) for k in _SHARED_OPTIONS if k in kwargs}
        unused = sorted(k for k, v in kwargs.items() if v is not None)  # wrappers (PEFT) pass their Nones
        if args or unused:
            raise TypeError(f"prefix_layout calls take only {_SHARED_OPTIONS}, got {unused or 'positional args'}")
        return shared_forward(model, prefix_layout, **options)

    forward._minimind_shared = True
    model.forward = forward


def setup_policy_passes(model: nn.Module, prefix_sharing: bool) -> nn.Module:
    """Prepare a policy or reference model for the GRPO trainer's passes; returns the module changed.

    The model is first taken out of its wrappers (a DeepSpeed engine, which TRL puts around the
    reference model and whose ``config`` is DeepSpeed's dict; DDP; ``torch.compile``; then PEFT's
    base model): MiniMind's aux loss goes into TRL's fused pass (MoE) and, with ``prefix_sharing``,
    the prefix-shared forward is installed on the module itself, so that calls through the
    wrapper (``engine(prefix_layout=...)``) reach it."""
    base = extract_model_from_parallel(model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    if getattr(base.config, "use_moe", False):
        use_minimind_aux_loss(base)
    if prefix_sharing:
        if not supports_shared_forward(base):
            raise ValueError(f"training.prefix_sharing needs a MiniMind / Qwen3-layout model, got "
                             f"{type(base).__name__}; set training.prefix_sharing: false")
        install_shared_forward(base)
    return base
