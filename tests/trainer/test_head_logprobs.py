"""The CPU LM-head log-probs equal TRL's chunked kernel bit for bit: values, entropies, gradients."""

import math

import pytest
import torch
from trl.kernels import ChunkedLogProbFunction

from minimind_trl.trainer.head_logprobs import TOKEN_TILE, TRL_VOCAB_CHUNK, HeadLogProbs, lm_head_log_probs

H, V = 48, 384


def _inputs(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.3
    targets = torch.randint(0, V, (n,), generator=gen)
    grad_lp = torch.randn(n, generator=gen)
    grad_ent = torch.randn(n, generator=gen)
    return hidden, weight, targets, grad_lp, grad_ent


def _run(use_trl: bool, n: int, bf16: bool, temperature: float, entropy: bool, lp_grad: bool, ent_grad: bool,
         weight_grad: bool = True):
    hidden, weight, targets, grad_lp, grad_ent = _inputs(n)
    hidden.requires_grad_(True)
    weight.requires_grad_(weight_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        x = hidden * 1.0  # an op under autocast, as the trunk's output is
        if use_trl:
            outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
            lp, ent, *_ = ChunkedLogProbFunction.apply(x, weight, None, targets, temperature, TRL_VOCAB_CHUNK,
                                                       None, 1.0, outputs)
        else:
            lp, ent = HeadLogProbs.apply(x, weight, targets, temperature, entropy)
    loss = 0.0
    if lp_grad:
        loss = loss + (lp * grad_lp).sum()
    if ent_grad:
        loss = loss + (ent * grad_ent).sum()
    loss.backward()
    return lp.detach(), None if ent is None else ent.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("n,grads", [(57, "logp"), (57, "both"), (57, "entropy"), (TOKEN_TILE + 70, "both")])
def test_values_and_gradients_equal_trls_kernel_bit_for_bit(bf16, temperature, n, grads):
    lp_grad, ent_grad = grads in ("logp", "both"), grads in ("entropy", "both")
    entropy = ent_grad or n > TOKEN_TILE  # entropy computed but logged only in one case
    ours = _run(False, n, bf16, temperature, entropy, lp_grad, ent_grad)
    trl = _run(True, n, bf16, temperature, entropy, lp_grad, ent_grad)
    for name, a, b in zip(("log_probs", "entropy", "grad hidden", "grad weight"), ours, trl):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: max |diff| {(a - b).abs().max().item()}"


def test_log_probs_and_entropy_against_an_independent_log_softmax():
    hidden, weight, targets, *_ = _inputs(33)
    lp, ent = HeadLogProbs.apply(hidden, weight, targets, 0.7, True)
    logp_all = torch.log_softmax((hidden.double() @ weight.double().t()) / 0.7, -1)  # (n, V) fp64
    torch.testing.assert_close(lp.double(), logp_all.gather(-1, targets[:, None])[:, 0], rtol=0, atol=2e-5)
    torch.testing.assert_close(ent.double(), -(logp_all.exp() * logp_all).sum(-1), rtol=0, atol=2e-5)
    assert torch.all(lp <= 0) and torch.all(ent <= math.log(V) + 1e-5)


def test_frozen_head_gets_no_gradient_and_the_hidden_gradient_is_unchanged():
    ours = _run(False, 57, True, 0.7, False, True, False, weight_grad=False)
    trl = _run(True, 57, True, 0.7, False, True, False, weight_grad=True)
    assert ours[3] is None
    assert torch.equal(ours[2], trl[2])


def test_a_second_backward_over_a_retained_graph_gives_the_same_gradients():
    hidden, weight, targets, grad_lp, _ = _inputs(40)
    hidden.requires_grad_(True)
    lp, _ = HeadLogProbs.apply(hidden, weight, targets, 0.7, False)
    first, = torch.autograd.grad((lp * grad_lp).sum(), hidden, retain_graph=True)
    second, = torch.autograd.grad((lp * grad_lp).sum(), hidden)
    assert torch.equal(first, second)


def test_forward_without_grad_equals_the_forward_with_grad():
    hidden, weight, targets, *_ = _inputs(40)
    with torch.no_grad():
        cold, cold_ent = lm_head_log_probs(hidden, weight, None, targets, 0.7, True)
    warm, warm_ent = lm_head_log_probs(hidden.requires_grad_(True), weight, None, targets, 0.7, True)
    assert torch.equal(cold, warm.detach()) and torch.equal(cold_ent, warm_ent.detach())


def test_a_vocabulary_wider_than_trls_tile_goes_to_trls_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(HeadLogProbs, "apply", lambda *a: calls.append(a) or (None, None))
    hidden, weight, targets, *_ = _inputs(4)
    lm_head_log_probs(hidden, weight, None, targets, 1.0, False)
    assert len(calls) == 1  # V = 384: this code's path
    wide = torch.randn(TRL_VOCAB_CHUNK + 1, H) * 0.1
    lp, _ = lm_head_log_probs(hidden, wide, None, targets, 1.0, False)
    assert len(calls) == 1 and lp.shape == (4,)
    want = torch.log_softmax(hidden @ wide.t(), -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(lp, want, rtol=0, atol=1e-4)


def test_a_biased_head_and_an_empty_batch_go_to_trls_kernel():
    hidden, weight, targets, *_ = _inputs(20)
    bias = torch.randn(V)
    lp, _ = lm_head_log_probs(hidden, weight, bias, targets, 1.0, False)
    want = torch.log_softmax(hidden @ weight.t() + bias, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(lp, want, rtol=0, atol=1e-5)
    empty, _ = lm_head_log_probs(hidden[:0], weight, None, targets[:0], 1.0, False)
    assert empty.shape == (0,)
