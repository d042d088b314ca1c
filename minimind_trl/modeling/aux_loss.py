"""MiniMind's MoE aux loss inside TRL's fused LM head.

TRL's fused head (the chunked log-prob forward its trainers use) computes Mixtral's load-balancing
loss for any MoE model; :func:`use_minimind_aux_loss` makes a MiniMind model report its own
(:func:`~minimind_trl.modeling.modeling_minimind.router_aux_loss`) instead. SFT and GRPO both wrap
their model with it, so it lives beside the model rather than in one trainer.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from minimind_trl.modeling.modeling_minimind import router_aux_loss


def use_minimind_aux_loss(model: nn.Module) -> None:
    """Make TRL's fused forward report MiniMind's aux loss instead of Mixtral's.

    TRL 1.16's fused LM head (``add_fused_lm_head``) computes, for MoE models, Mixtral's
    ``load_balancing_loss_func`` (one average over the routed tokens of all layers) as ``aux_loss``
    and adds it to ``loss``. MiniMind's is :func:`~minimind_trl.modeling.router_aux_loss`
    (``E * sum_e load_e * P_e`` per layer, summed over layers), the one its own forward and the
    prefix-shared pass use. The wrapper recomputes ``aux_loss`` from the same forward's router
    logits and corrects ``loss`` by ``coef * (ours - theirs)``. Idempotent."""
    fused, backbone, config = model.forward, model.model, model.config
    if getattr(fused, "_minimind_aux", False):
        return

    @functools.wraps(fused)
    def forward(*args: Any, fused_lm_head: bool = False, **kwargs: Any):
        if not fused_lm_head:
            return fused(*args, **kwargs)
        router: list = []
        hook = backbone.register_forward_hook(lambda module, inputs, output: router.append(output.router_logits))
        try:
            out = fused(*args, fused_lm_head=True, **kwargs)
        finally:
            hook.remove()
        if out.aux_loss is not None and router and router[0]:
            ours = router_aux_loss(router[0], config.num_experts, config.num_experts_per_tok,
                                   kwargs.get("attention_mask"))
            out.loss = out.loss + config.router_aux_loss_coef * (ours - out.aux_loss)
            out.aux_loss = ours
        return out

    forward._minimind_aux = True
    model.forward = forward
