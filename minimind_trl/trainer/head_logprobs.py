"""Per-token log-probs (and entropies) from the LM head, with TRL's chunked kernel's numbers.

TRL's ``ChunkedLogProbFunction`` never materialises the ``(N, V)`` logits on an accelerator
(Triton folds each tile). On a CPU it runs its torch fallback: a ``(4096, 32768)`` buffer per call
and a dozen full-tile temporaries in the backward. :class:`HeadLogProbs` computes the same
arithmetic, operation for operation (values and gradients bit for bit, fp32 and bf16 autocast:
tests/trainer/test_head_logprobs.py), with fewer passes over memory: one ``(≤4096, V)`` tile at a
time, the forward's logits kept for the backward instead of recomputed, the target column handled
on its own, in place where nothing reads a tile again. The demo's update passes (forward +
backward) take 17–29% less time with it (benchmarks/README.md).

    z = (h @ W^T) * (1 / T)                        # (n, V) fp32; the GEMM in autocast's dtype
    log_z = max(z) + log(sum exp(z - max(z)))      # (n,)
    log p(y) = z_y - log_z                         # (n,)
    H = log_z - sum(exp(z - max) * z) / sum(exp(z - max))
    dL/dz_j = (g * (1[j = y] - p_j) - g_H * p_j * (log p_j + H)) / T   # rounded to autocast's dtype
    dL/dh = dL/dz @ W ;  dL/dW = dL/dz^T @ h       # fp32 GEMMs of the rounded values, as TRL's CPU path

Only a CPU takes this path, with no bias, no ZeRO-3 partitioning and a vocabulary within TRL's
one tile (V ≤ 32,768: beyond it TRL folds tiles with an online log-sum-exp, other arithmetic);
everything else (GPUs, a biased head, a partitioned weight, a wider vocabulary) calls TRL's kernel.
"""

from __future__ import annotations

import torch
from trl.kernels import ChunkedLogProbFunction

TOKEN_TILE = 4096  # tokens per tile: TRL's TOKEN_CHUNK_SIZE (grad_W sums tiles in this order)
TRL_VOCAB_CHUNK = 32768  # TRL's vocabulary tile; wider than MiniMind's 6,400, so one tile per row


def lm_head_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      targets: torch.Tensor, temperature: float,
                      compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log_probs (N,), entropy (N,) or None)`` of ``targets`` under ``softmax(hidden @ weight^T / T)``.

    ``hidden`` (N, H), ``weight`` (V, H), ``bias`` (V,) or None, ``targets`` (N,) token ids.
    """
    if (hidden.device.type == "cpu" and bias is None and not hasattr(weight, "ds_id") and hidden.shape[0]
            and weight.shape[0] <= TRL_VOCAB_CHUNK):
        return HeadLogProbs.apply(hidden, weight, targets, temperature, compute_entropy)
    return trl_log_probs(hidden, weight, bias, targets, temperature, compute_entropy)


def trl_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  temperature: float, compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`lm_head_log_probs` through TRL's chunked kernel, whatever the device (the shared
    pass's head before session 24; the benchmark's and tests' reference)."""
    outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
    log_probs, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature,
                                                          TRL_VOCAB_CHUNK, None, 1.0, outputs)
    return log_probs, entropy


class HeadLogProbs(torch.autograd.Function):
    """The CPU path of :func:`lm_head_log_probs` (see the module docstring for the formulas)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                temperature: float, compute_entropy: bool):
        ctx.set_materialize_grads(False)  # the entropy is usually logged only: no gradient to fold
        compute_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
        inv_t = 1 / temperature
        w = weight.to(compute_dtype)  # (V, H)
        keep = any(ctx.needs_input_grad[:2])
        log_probs, entropies, log_zs, tiles = [], [], [], []
        for start in range(0, hidden.shape[0], TOKEN_TILE):
            h = hidden[start:start + TOKEN_TILE].to(compute_dtype)  # (n, H)
            logits = torch.mm(h, w.t())  # (n, V) compute dtype
            z = logits.to(torch.float32, copy=True).mul_(inv_t)  # (n, V) fp32; logits kept as they are
            z_max = z.amax(-1)  # (n,)
            z_target = z.gather(-1, targets[start:start + TOKEN_TILE, None])[:, 0]  # (n,)
            # exp(z - max) in z's own memory unless the entropy still needs z (a fresh tile costs page faults)
            e = torch.sub(z, z_max[:, None]).exp_() if compute_entropy else z.sub_(z_max[:, None]).exp_()  # (n, V)
            sum_exp = e.sum(-1)
            log_z = z_max + torch.log(sum_exp)  # (n,)
            log_probs.append(z_target - log_z)
            if compute_entropy:
                entropies.append(log_z - e.mul_(z).sum(-1) / sum_exp)
            log_zs.append(log_z)
            if keep:
                tiles.append(logits)
        log_probs = torch.cat(log_probs)
        entropy = torch.cat(entropies) if compute_entropy else None
        log_z = torch.cat(log_zs)
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy if compute_entropy else log_z)
        ctx.tiles, ctx.inv_t, ctx.compute_dtype = tiles, inv_t, compute_dtype
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        tiles, inv_t, compute_dtype = ctx.tiles, ctx.inv_t, ctx.compute_dtype
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32) if needs_hidden else None  # (N, H)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32) if needs_weight else None  # (V, H)
        w = weight.to(compute_dtype).float()  # the rounded weight, in fp32 for the fp32 GEMMs
        for i, start in enumerate(range(0, hidden.shape[0], TOKEN_TILE)):
            stop = start + tiles[i].shape[0]
            log_p = tiles[i].to(torch.float32, copy=True).mul_(inv_t).sub_(log_z[start:stop, None])  # (n, V)
            p = torch.exp(log_p) if grad_entropy is not None else log_p.exp_()  # log p is read again for H only
            target = targets[start:stop, None]  # (n, 1)
            if grad_entropy is not None:
                g_h = grad_entropy[start:stop, None].float()
                ent_term = (g_h * p).mul_(log_p.add_(entropy[start:stop, None]))  # g_H * p * (log p + H)
            if grad_log_probs is not None:
                g = grad_log_probs[start:stop, None].float()  # (n, 1)
                at_target = g * (1.0 - p.gather(-1, target))  # g * (1 - p_y), as TRL's (1[j=y] - p) * g
                grad = p.mul_(-g)  # g * (0 - p_j) off the target
                grad.scatter_(-1, target, at_target)
                if grad_entropy is not None:
                    grad.sub_(ent_term)
            else:
                grad = ent_term.neg_()
            grad.mul_(inv_t)
            if compute_dtype != torch.float32:
                grad.copy_(grad.to(compute_dtype))  # rounded as TRL's tile is, kept in fp32 for the fp32 GEMMs
            if grad_hidden is not None:
                grad_hidden[start:stop].addmm_(grad, w)
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), hidden[start:stop].to(compute_dtype).float())
        return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
                grad_weight.to(weight.dtype) if grad_weight is not None else None, None, None, None)
