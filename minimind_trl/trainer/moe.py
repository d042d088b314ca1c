"""Mixture-of-Experts router diagnostics: capture router logits, turn them into summable counts.

The router modules are found the way transformers itself records ``router_logits``: through the
model class's ``_can_record_outputs["router_logits"]`` (an ``OutputRecorder`` naming the router
class and which output holds the logits). Forward hooks record only inside :meth:`capture`, so
generation, the reference model and gradient-checkpoint recomputation leave no trace.

Per layer, over the attended tokens of the update pass (what the aux loss sees):

* ``load``     fraction of (token, slot) assignments per expert (sums to 1)
* ``imbalance`` max load / mean load (1 = perfectly balanced)
* ``entropy``   mean over tokens of the router distribution's entropy (nats)
* ``aux``       E * sum_e assign_e / tokens * mean_tokens(p_e) (upstream formula without its coef)
* ``flip_rate`` over action-scoring positions (the positions whose hidden state scores an action
  token): share whose top-k expert set differs between the old-log-prob pass and the update pass.

The record keys (``moe/layer{i}/imbalance``, ...) and the names of the summable counts
(``moe.{i}.tokens``, ...) are built by :mod:`minimind_trl.metric_names`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from minimind_trl.metric_names import (
    COUNT_ASSIGN,
    COUNT_ENTROPY_SUM,
    COUNT_FLIP_TOKENS,
    COUNT_FLIPS,
    COUNT_PROB_SUM,
    COUNT_TOKENS,
    MOE_ALL_FLIP_RATE,
    MOE_AUX_LOSS,
    MOE_FLIP_RATE,
    MOE_IMBALANCE,
    MOE_LOAD,
    MOE_MAX_IMBALANCE,
    MOE_ROUTER_ENTROPY,
    is_router_count_key,
    moe_layer_key,
    router_count_key,
    router_count_layer,
)


def _router_spec(model: nn.Module) -> tuple[type, int] | None:
    """(router module class, index of the logits in its output), or None for a dense model."""
    for candidate in (model, getattr(model, "base_model", None)):
        recorders = getattr(type(candidate), "_can_record_outputs", None) or {}
        spec = recorders.get("router_logits")
        if spec is None:
            continue
        if isinstance(spec, type):
            return spec, 0
        target = getattr(spec, "target_class", None)
        if target is not None:
            return target, getattr(spec, "index", 0) or 0
    return None


class RouterRecorder:
    """Forward hooks on every router module of ``model``; records logits only inside :meth:`capture`."""

    def __init__(self, model: nn.Module, router_class: type, index: int, top_k: int, num_experts: int):
        self.top_k, self.num_experts, self._index = top_k, num_experts, index
        self._active: list[torch.Tensor] | None = None
        self.routers = [m for m in model.modules() if isinstance(m, router_class)]
        self._handles = [m.register_forward_hook(self._hook) for m in self.routers]

    @classmethod
    def for_model(cls, model: nn.Module) -> "RouterRecorder | None":
        """A recorder for an MoE model, or None when the model has no router."""
        spec = _router_spec(model)
        if spec is None:
            return None
        config = model.config.get_text_config()
        num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
        top_k = getattr(config, "num_experts_per_tok", None)
        if not num_experts or not top_k:
            return None
        recorder = cls(model, spec[0], spec[1], int(top_k), int(num_experts))
        return recorder if recorder.routers else None

    def _hook(self, module: nn.Module, args, output) -> None:
        if self._active is None:
            return
        logits = output[self._index] if isinstance(output, (tuple, list)) else output
        self._active.append(logits.detach().float())

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[torch.Tensor]]:
        """Yields the list that fills with one ``[tokens, E]`` logits tensor per layer."""
        captured: list[torch.Tensor] = []
        self._active = captured
        try:
            yield captured
        finally:
            self._active = None

    def topk(self, logits: list[torch.Tensor], batch: int, length: int) -> torch.Tensor:
        """Sorted top-k expert ids per layer and position: ``[layers, B, L, k]`` (uint8)."""
        ids = [lg.view(batch, length, -1).topk(self.top_k, dim=-1).indices.sort(dim=-1).values for lg in logits]
        return torch.stack(ids).to(torch.uint8)

    def counts(
        self,
        logits: list[torch.Tensor],
        token_weights: torch.Tensor,
        action_weights: torch.Tensor,
        old_topk: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Summable per-layer counts (0-d tensors) for one forward pass (see :func:`finalize_counts`).

        Args: logits per layer ``[B*L, E]``; token_weights ``[B, L]``: how many times each position
        counts (the attention mask; a prefix-shared pass counts a shared token once per row that
        contains it); action_weights ``[B, L]``: how many action tokens each position's hidden state
        scores; old_topk ``[layers, B, L, k]`` or None.
        """
        batch, length = token_weights.shape
        weights = token_weights.reshape(-1).double()  # [B*L]
        attended = weights > 0
        weights = weights[attended]  # [N]
        new_topk = self.topk(logits, batch, length) if old_topk is not None else None
        out: dict[str, torch.Tensor] = {}
        for layer, layer_logits in enumerate(logits):
            probs = layer_logits[attended].softmax(dim=-1)  # [N, E]
            chosen = probs.topk(self.top_k, dim=-1).indices  # [N, k]
            slot_weights = weights.repeat_interleave(self.top_k)  # [N*k]
            assign = torch.bincount(chosen.reshape(-1), weights=slot_weights, minlength=self.num_experts)  # [E]
            prob_sum = (probs.double() * weights[:, None]).sum(dim=0)  # [E]
            entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)  # [N]
            out[router_count_key(layer, COUNT_TOKENS)] = weights.sum()
            out[router_count_key(layer, COUNT_ENTROPY_SUM)] = (entropy.double() * weights).sum()
            for e in range(self.num_experts):
                out[router_count_key(layer, COUNT_ASSIGN, e)] = assign[e]
                out[router_count_key(layer, COUNT_PROB_SUM, e)] = prob_sum[e]
            if new_topk is not None:
                differs = (new_topk[layer] != old_topk[layer].to(new_topk.device)).any(dim=-1)  # [B, L]
                out[router_count_key(layer, COUNT_FLIPS)] = (differs.double() * action_weights.double()).sum()
                out[router_count_key(layer, COUNT_FLIP_TOKENS)] = action_weights.double().sum()
        return out


def finalize_counts(sums: dict[str, float], num_experts: int) -> dict[str, object]:
    """Per-layer figures from counts summed over micro-batches and processes.

    Returns, per layer ``i``, :func:`~minimind_trl.metric_names.moe_layer_key` ``(i, figure)`` for
    ``load`` (list of E floats), ``imbalance``, ``router_entropy``, ``aux_loss`` and, when an old
    pass exists, ``flip_rate``; plus ``moe/flip_rate`` (all layers) and ``moe/max_imbalance``.
    """
    layers = sorted({router_count_layer(k) for k in sums if is_router_count_key(k)})
    out: dict[str, object] = {}
    flips = flip_tokens = 0.0
    imbalances = []
    for layer in layers:
        tokens = max(sums[router_count_key(layer, COUNT_TOKENS)], 1.0)
        assign = [sums[router_count_key(layer, COUNT_ASSIGN, e)] for e in range(num_experts)]
        total = max(sum(assign), 1.0)
        load = [a / total for a in assign]
        mean_prob = [sums[router_count_key(layer, COUNT_PROB_SUM, e)] / tokens for e in range(num_experts)]
        imbalance = max(load) * num_experts
        out[moe_layer_key(layer, MOE_LOAD)] = load
        out[moe_layer_key(layer, MOE_IMBALANCE)] = imbalance
        out[moe_layer_key(layer, MOE_ROUTER_ENTROPY)] = sums[router_count_key(layer, COUNT_ENTROPY_SUM)] / tokens
        out[moe_layer_key(layer, MOE_AUX_LOSS)] = num_experts * sum(a / tokens * m for a, m in zip(assign, mean_prob))
        imbalances.append(imbalance)
        layer_flips = sums.get(router_count_key(layer, COUNT_FLIPS))
        if layer_flips is not None:
            layer_tokens = sums[router_count_key(layer, COUNT_FLIP_TOKENS)]
            out[moe_layer_key(layer, MOE_FLIP_RATE)] = layer_flips / max(layer_tokens, 1.0)
            flips += layer_flips
            flip_tokens += layer_tokens
    if layers:
        out[MOE_MAX_IMBALANCE] = max(imbalances)
    if flip_tokens:
        out[MOE_ALL_FLIP_RATE] = flips / flip_tokens
    return out
