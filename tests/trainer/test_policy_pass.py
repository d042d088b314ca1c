"""Prefix-shared policy pass against the plain pass (TRL's fused LM head over [prompt | completion])."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl.trainer.utils import add_fused_lm_head

from minimind_trl.modeling import MiniMindForCausalLM, get_preset, router_aux_loss
from minimind_trl.trainer import policy_pass
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.head_logprobs import trl_log_probs
from minimind_trl.trainer.policy_pass import build_layout, install_shared_forward


def make_model(moe: bool = False, attn: str = "sdpa", seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    config = get_preset("tiny-moe" if moe else "tiny")
    config._attn_implementation = attn
    model = MiniMindForCausalLM(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    install_shared_forward(model)
    return model.train()


def make_batch(seed: int = 0, vocab: int = 6400):
    """Two groups of 3 and one of 2 rows. The prompts share a 9-token preamble and have lengths
    14, 11, 9 (the last equals the preamble); completions have lengths 1-7, left/right pads."""
    g = torch.Generator().manual_seed(seed)
    preamble = torch.randint(21, vocab, (9,), generator=g).tolist()
    prompts = [preamble + torch.randint(21, vocab, (n,), generator=g).tolist() for n in (5, 2, 0)]
    groups, lengths = [0, 0, 0, 1, 1, 1, 2, 2], [7, 3, 5, 1, 6, 6, 4, 2]
    width_p, width_c = 14, 8
    prompt_ids = torch.zeros(len(groups), width_p, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.zeros(len(groups), width_c, dtype=torch.long)
    completion_mask = torch.zeros_like(completion_ids)
    for row, (u, n) in enumerate(zip(groups, lengths)):
        p = prompts[u]
        prompt_ids[row, width_p - len(p):] = torch.tensor(p)
        prompt_mask[row, width_p - len(p):] = 1
        completion_ids[row, :n] = torch.randint(21, vocab, (n,), generator=g)
        completion_mask[row, :n] = 1
    order = torch.randperm(len(groups), generator=g)  # groups scattered, as after TRL's shuffle
    return prompt_ids[order], prompt_mask[order], completion_ids[order], completion_mask[order]


def plain_pass(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """TRL's way (GRPOTrainer._get_per_token_logps_and_entropies): one padded row per trajectory."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    keep = completion_ids.size(1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    router: list = []
    hook = None
    if model.config.use_moe:
        hook = model.model.register_forward_hook(lambda m, a, out: router.append(out.router_logits))
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True,
                output_router_logits=model.config.use_moe)
    if hook is not None:
        hook.remove()
    aux = None
    if router:
        aux = router_aux_loss(router[0], model.config.num_experts, model.config.num_experts_per_tok, mask)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:], aux


def shared_pass(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    layout = build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask)
    out = model(prefix_layout=layout, compute_aux_loss=model.config.use_moe)
    return out.log_probs, out.entropy, out.aux_loss


def test_layout_packs_each_distinct_token_once():
    prompt_ids, prompt_mask, completion_ids, completion_mask = make_batch()
    layout = build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask)
    # 9 preamble tokens + suffixes 5 + 2 + 0, then 34 completion tokens; no pad
    assert layout.num_tokens == 9 + 7 + int(completion_mask.sum()) == 50
    assert layout.num_distinct_prompts == 3
    # multiplicity: the preamble is in all 8 rows, suffix 1 in 3 rows, completions in one each
    assert layout.weights[:9].tolist() == [8.0] * 9
    assert sorted(layout.weights[9:16].tolist()) == [3.0] * 7
    assert float(layout.weights.sum()) == float(prompt_mask.sum() + completion_mask.sum())
    # positions restart at 0 for every row's first real token
    assert layout.position_ids[:9].tolist() == list(range(9))
    # every packed token is the query of exactly one block
    assert sorted(layout.query_order.tolist()) == list(range(50))


def test_layout_without_common_prefix_sharing():
    prompt_ids, prompt_mask, completion_ids, completion_mask = make_batch()
    layout = build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask, share_common_prefix=False)
    assert layout.num_tokens == 14 + 11 + 9 + int(completion_mask.sum())


def test_layout_rejects_interior_pads():
    prompt_ids, prompt_mask, completion_ids, completion_mask = make_batch()
    completion_mask[0, 0] = 0
    completion_mask[0, 1] = 1
    with pytest.raises(ValueError, match="right-padded 0/1 completion masks"):
        build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask)


def _loss(logps, entropies, aux, mask, weights):
    loss = (logps * weights * mask).sum() + 0.1 * (entropies * mask).sum()
    return loss + aux if aux is not None else loss


@pytest.mark.parametrize(
    "moe,attn,checkpointing",
    [(False, "sdpa", False), (False, "eager", False), (False, "sdpa", True), (True, "sdpa", False),
     (True, "eager", True)],
    ids=["dense-sdpa", "dense-eager", "dense-checkpointing", "moe-sdpa", "moe-eager-checkpointing"],
)
def test_shared_pass_equals_plain_pass_values_and_gradients(moe, attn, checkpointing):
    batch = make_batch()
    mask = batch[3].bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    results = {}
    for name, fn in (("plain", plain_pass), ("shared", shared_pass)):
        model = make_model(moe, attn)
        if checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        logps, entropies, aux = fn(model, *batch)
        _loss(logps, entropies, aux, mask, weights).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[name] = (logps.detach(), entropies.detach(), aux, grads)
    (lp, ep, ap, gp), (ls, es, as_, gs) = results["plain"], results["shared"]
    torch.testing.assert_close(ls, lp * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(es, ep * mask, rtol=0, atol=1e-5)
    assert (ls[~mask] == 0).all() and (es[~mask] == 0).all()
    if moe:
        torch.testing.assert_close(as_.detach(), ap.detach(), rtol=1e-5, atol=1e-6)
    assert gs.keys() == gp.keys() and len(gs) > 0
    for key in gp:
        scale = gp[key].abs().max().clamp(min=1e-3)
        assert (gs[key] - gp[key]).abs().max() / scale < 1e-5, key


def test_scoring_the_action_tokens_only_keeps_their_values_and_gradients():
    """The trainer scores only action tokens (tool-observation tokens stay in the packed context):
    their log-probs and entropies are those of the full scoring, bit for bit; the others are 0; the
    gradient of a loss over the action tokens equals the full scoring's within float rounding."""
    batch = make_batch()
    completion_mask = batch[3].bool()
    action = completion_mask.clone()
    action[:, 1] = False  # a tool-observation token inside each completion
    weights = torch.randn(action.shape, generator=torch.Generator().manual_seed(5))
    results = {}
    for name, scored in (("full", completion_mask), ("action", action)):
        model = make_model()
        layout = build_layout(*batch)
        layout = dataclasses.replace(layout, completion_mask=layout.completion_mask & scored)
        out = model(prefix_layout=layout)
        (out.log_probs * weights * action).sum().backward()
        results[name] = (out.log_probs.detach(), out.entropy.detach(),
                         {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (lf, ef, gf), (la, ea, ga) = results["full"], results["action"]
    assert torch.equal(la[action], lf[action]) and torch.equal(ea[action], ef[action])
    assert (la[~action] == 0).all() and (ea[~action] == 0).all() and (lf[completion_mask & ~action] != 0).any()
    for key in gf:
        scale = gf[key].abs().max().clamp(min=1e-3)
        assert (ga[key] - gf[key]).abs().max() / scale < 1e-5, key


def test_shared_pass_under_bf16_autocast_is_close_and_repeatable():
    batch = make_batch()
    mask = batch[3].bool()
    model = make_model()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        first = shared_pass(model, *batch)[0]
        again = shared_pass(model, *batch)[0]
        plain = plain_pass(model, *batch)[0]
    assert torch.equal(first, again)  # replay and update 0 see identical numbers: ratio exactly 1
    assert (first - plain)[mask].abs().max() < 0.1


def _attention_inputs(monkeypatch) -> list[tuple[torch.dtype, bool]]:
    """Records (query dtype, autocast on) of every SDPA call the shared pass makes."""
    calls: list[tuple[torch.dtype, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        calls.append((query.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _pass_with_grads(batch, weights, cast_attention_to_fp32: bool, bf16: bool):
    model = make_model()
    layout = build_layout(*batch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(prefix_layout=layout, cast_attention_to_fp32=cast_attention_to_fp32)
        mask = batch[3].bool()
        (out.log_probs * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.log_probs.detach(), out.entropy.detach(), grads


def test_attention_cast_to_fp32_runs_sdpa_in_fp32_under_bf16_and_changes_nothing_in_fp32(monkeypatch):
    """``cast_attention_to_fp32``: under bf16 autocast every SDPA call gets fp32 queries with autocast
    off (autocast would cast it back to bf16); the result stays near the fp32 pass, forward and
    backward, and repeats exactly (update 0's ratio 1). In fp32 it is the same pass bit for bit."""
    batch = make_batch()
    mask = batch[3].bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    calls = _attention_inputs(monkeypatch)
    plain_fp32 = _pass_with_grads(batch, weights, False, bf16=False)
    assert calls and all(call == (torch.float32, False) for call in calls)
    cast_fp32 = _pass_with_grads(batch, weights, True, bf16=False)
    for a, b in zip(plain_fp32[:2], cast_fp32[:2]):
        assert torch.equal(a, b)
    assert all(torch.equal(plain_fp32[2][k], cast_fp32[2][k]) for k in plain_fp32[2])

    calls.clear()
    bf16 = _pass_with_grads(batch, weights, False, bf16=True)
    assert calls and all(autocast for _, autocast in calls)  # autocast casts it to bf16 inside
    calls.clear()
    cast = _pass_with_grads(batch, weights, True, bf16=True)
    assert calls and all(call == (torch.float32, False) for call in calls)
    assert not torch.equal(cast[0], bf16[0])  # the option does change the bf16 numbers
    assert (cast[0] - plain_fp32[0])[mask].abs().max() < 0.1
    for key, grad in plain_fp32[2].items():
        scale = grad.abs().max().clamp(min=1e-3)
        assert torch.isfinite(cast[2][key]).all() and (cast[2][key] - grad).abs().max() / scale < 0.1, key
    again = _pass_with_grads(batch, weights, True, bf16=True)
    assert torch.equal(again[0], cast[0])


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_cpu_head_gives_trls_kernel_numbers_through_the_whole_pass(monkeypatch, bf16):
    """The shared pass's CPU LM head (head_logprobs) against TRL's chunked kernel in its place:
    log-probs, entropies and every parameter's gradient equal bit for bit, at T = 0.7."""
    batch = make_batch()
    mask = batch[3].bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(5))

    def run():
        model = make_model()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(prefix_layout=build_layout(*batch), temperature=0.7)
            ((out.log_probs * weights * mask).sum() + (out.entropy * weights * mask).sum()).backward()
        return out.log_probs.detach(), out.entropy.detach(), {n: p.grad for n, p in model.named_parameters()}

    ours = run()
    monkeypatch.setattr(policy_pass, "lm_head_log_probs", trl_log_probs)
    trl = run()
    assert torch.equal(ours[0], trl[0]) and torch.equal(ours[1], trl[1])
    assert ours[2].keys() == trl[2].keys()
    for name, grad in trl[2].items():
        assert grad is not None and torch.equal(ours[2][name], grad), name


def test_attention_cast_to_fp32_needs_the_prefix_shared_pass(tmp_path):
    with pytest.raises(ValueError, match="cast_attention_to_fp32 applies to the prefix-shared pass"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True,
                           report_to=[], bf16=False, prefix_sharing=False, cast_attention_to_fp32=True)


def test_replay_and_update_zero_agree_exactly():
    """Same layout, same weights: the frozen old log-probs equal the update's (ratio exactly 1)."""
    model = make_model(moe=True)
    batch = make_batch()
    with torch.no_grad():
        old = shared_pass(model, *batch)[0]
    new = shared_pass(model, *batch)[0]
    assert torch.equal(old, new.detach())


def test_a_batch_with_nothing_to_score_gives_zeros_connected_to_the_graph():
    prompt_ids, prompt_mask, completion_ids, completion_mask = make_batch()
    completion_mask.zero_()
    model = make_model()
    logps, _, _ = shared_pass(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    assert (logps == 0).all()
    logps.sum().backward()  # no error: the all-masked micro-batch still backpropagates (zeros)


def test_plain_calls_go_through_unchanged():
    model = make_model()
    reference = copy.deepcopy(model)
    ids = torch.randint(21, 6400, (2, 6))
    torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=0)


def test_shared_pass_through_a_peft_lora_model_matches_the_plain_pass():
    """PEFT passes its own None keywords through; the LoRA layers run inside the shared pass."""
    batch = make_batch()
    mask = batch[3].bool()
    grads = {}
    for name, fn in (("plain", plain_pass), ("shared", shared_pass)):
        peft_model = get_peft_model(make_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        if name == "plain":
            logps = fn(peft_model, *batch)[0]
        else:
            layout = build_layout(*batch)
            logps = peft_model(prefix_layout=layout).log_probs
        (logps * mask).sum().backward()
        grads[name] = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}
    assert grads["plain"].keys() == grads["shared"].keys() and all("lora_" in n for n in grads["plain"])
    for key, plain in grads["plain"].items():
        assert (grads["shared"][key] - plain).abs().max() / plain.abs().max().clamp(min=1e-6) < 1e-5, key
