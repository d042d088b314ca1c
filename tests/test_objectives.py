"""Numeric tests of minimind_trl.objectives against values worked out independently.

The expected numbers come from `_reference`, which writes every per-token formula and its
derivative with plain Python floats (no torch, no autograd), and from a few literals worked by
hand in the comments. The example batch has masks with holes, an empty row, advantages of both
signs and ratios inside and outside the clip range.
"""

import dataclasses
import math

import pytest
import torch

from minimind_trl.objectives import (
    LOG_RATIO_BOUND,
    POLICY_LOSSES,
    PRESETS,
    LossOutput,
    ObjectiveConfig,
    PolicyBatch,
    PolicyTerm,
    RolloutTotals,
    compute_advantages,
    compute_policy_loss,
    compute_weighted_loss,
    k3_kl,
    kl_token_mean,
    moment_figures,
    reduce_loss,
    register_policy_loss,
)

# --------------------------------------------------------------------------------------------
# Example batch (B=3, T=5). Row 1 is empty; rows 0 and 2 have different lengths (3 and 4), so a
# per-row mean and a token mean differ. Ratios r = exp(logp - old) on action tokens:
#   row 0 (mask 1 1 1 0 0): 1.5 (above 1.2), 0.7 (below 0.8), 1.1 (inside)
#   row 2 (mask 1 0 1 1 1): 0.7, 6.0 (above CISPO's cap 5), 0.9, 1.05
# --------------------------------------------------------------------------------------------

T = 5
MASK = [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1]]
RATIOS = [[1.5, 0.7, 1.1, None, None], [None] * T, [0.7, None, 6.0, 0.9, 1.05]]
OLD = [[-1.0, -2.0, -0.5, 3.0, -4.0], [-0.25, 7.0, -9.0, 0.5, 1.0], [-0.3, -5.0, -1.7, -2.2, -0.8]]
REF_SHIFT = [[0.1, -0.2, 0.3, 0.0, 0.0], [0.0] * T, [-0.4, 0.0, 0.25, 0.05, -0.15]]
GARBAGE_LOGP = [[0.0, 0.0, 0.0, 4.0, -2.5], [2.0, -3.0, 8.0, -6.0, 0.5], [0.0, 1.5, 0.0, 0.0, 0.0]]
NUM_TOKENS = 7
ADV = [0.8, -0.5, -1.2]
REWARDS = [1.0, 0.0, 0.2]  # one group of 3 -> advantages of signs (+, -, -)


def _example_lists():
    logp = [[0.0] * T for _ in range(3)]
    ref = [[0.0] * T for _ in range(3)]
    for b in range(3):
        for t in range(T):
            if MASK[b][t]:
                logp[b][t] = OLD[b][t] + math.log(RATIOS[b][t])
            else:
                logp[b][t] = GARBAGE_LOGP[b][t]
            ref[b][t] = logp[b][t] + REF_SHIFT[b][t]
    return logp, OLD, ref


def _batch(adv=ADV, with_ref=True, dtype=torch.float64, lists=None, mask=MASK):
    logp, old, ref = lists if lists is not None else _example_lists()
    logps = torch.tensor(logp, dtype=dtype, requires_grad=True)
    batch = PolicyBatch(
        logps=logps,
        old_logps=torch.tensor(old, dtype=dtype),
        advantages=torch.tensor(adv, dtype=dtype),
        mask=torch.tensor(mask),
        ref_logps=torch.tensor(ref, dtype=dtype) if with_ref else None,
    )
    return batch, logps


def _reference(cfg, logp, old, mask, adv, ref=None):
    """Loss and d loss / d logp with plain Python floats, straight from the formulas."""
    B, T = len(mask), len(mask[0])
    grad = [[0.0] * T for _ in range(B)]
    rows = [b for b in range(B) if sum(mask[b]) > 0]
    V = len(rows)
    N = sum(sum(row) for row in mask)
    lo, hi = 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high
    policy = 0.0
    for b in rows:
        toks = [t for t in range(T) if mask[b][t]]
        n, A = len(toks), adv[b]
        if cfg.policy == "gspo":
            # s = exp(mean log ratio); l = -min(sA, clip(s)A); ds/dlogp_t = s/n
            s = math.exp(sum(logp[b][t] - old[b][t] for t in toks) / n)
            sc = min(max(s, lo), hi)
            policy += -min(s * A, sc * A) / V
            if s * A <= sc * A:
                for t in toks:
                    grad[b][t] += -A * s / n / V
            continue
        if cfg.reduction == "seq_mean":
            weight = 1.0 / (n * V)
        elif cfg.reduction == "fixed_length":
            weight = 1.0 / (cfg.fixed_length * V)
        else:
            assert cfg.reduction == "token_mean"
            weight = 1.0 / N
        for t in toks:
            r = math.exp(logp[b][t] - old[b][t])
            if cfg.policy == "clip":
                rc = min(max(r, lo), hi)
                value = -min(r * A, rc * A)
                deriv = -A * r if r * A <= rc * A else 0.0
            elif cfg.policy == "cispo":
                w = min(r, cfg.cispo_max)
                value = -w * A * logp[b][t]
                deriv = -w * A
            else:
                raise AssertionError(cfg.policy)
            policy += weight * value
            grad[b][t] += weight * deriv
    kl = 0.0
    if cfg.beta > 0 and N:
        for b in rows:
            for t in range(T):
                if mask[b][t]:
                    d = ref[b][t] - logp[b][t]
                    kl += (math.exp(d) - d - 1.0) / N
                    grad[b][t] += cfg.beta * (1.0 - math.exp(d)) / N
    return policy + cfg.beta * kl, policy, kl, grad


def _reference_advantages(rewards, group_size, mode):
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        if all(x == group[0] for x in group):
            out += [0.0] * group_size
            continue
        mean = sum(group) / group_size
        if mode == "center":
            out += [x - mean for x in group]
        else:
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (group_size - 1))
            out += [(x - mean) / (std + 1e-4) for x in group]
    return out


def _check_against_reference(cfg, adv):
    batch, logps = _batch(adv=adv)
    out = compute_policy_loss(batch, cfg)
    out.loss.backward()
    logp, old, ref = _example_lists()
    exp_loss, exp_policy, exp_kl, exp_grad = _reference(cfg, logp, old, MASK, adv, ref)
    assert out.loss.item() == pytest.approx(exp_loss, rel=1e-10, abs=1e-12)
    assert out.policy_loss.item() == pytest.approx(exp_policy, rel=1e-10, abs=1e-12)
    assert out.kl.item() == pytest.approx(exp_kl, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(logps.grad, torch.tensor(exp_grad, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert out.metrics["loss"] == pytest.approx(exp_loss, rel=1e-10, abs=1e-12)
    assert out.metrics["kl"] == pytest.approx(exp_kl, rel=1e-10, abs=1e-12)
    return out, logps


# --------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------


def test_advantages_hand_cases():
    # [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    z = compute_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), 4, "zscore")
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-4)
    torch.testing.assert_close(z, torch.tensor([a, -a, a, -a], dtype=torch.float64))
    # Unbiased, not population, std: with population std the value would be 0.5/(0.5+1e-4).
    assert z[0].item() != pytest.approx(0.5 / (0.5 + 1e-4), rel=1e-3)
    c = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, "center")
    torch.testing.assert_close(c, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    # Two groups are normalised independently.
    two = compute_advantages(torch.tensor([2.0, 4.0, 10.0, 30.0], dtype=torch.float64), 2, "zscore")
    s1, s2 = math.sqrt(2.0), math.sqrt(200.0)  # unbiased std of (2, 4) and (10, 30)
    torch.testing.assert_close(
        two, torch.tensor([-1 / (s1 + 1e-4), 1 / (s1 + 1e-4), -10 / (s2 + 1e-4), 10 / (s2 + 1e-4)], dtype=torch.float64)
    )
    assert compute_advantages(torch.tensor([2.0, 4.0]), 2, "center").tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("mode", ["zscore", "center"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_advantages_equal_groups_are_exactly_zero(mode, dtype):
    values = [0.1, 0.7, 1.0 / 3.0, 0.3, 2.9, -0.6]
    rewards = torch.tensor([v for v in values for _ in range(7)] + [0.0, 1.0, 0.5, 0.2, 0.2, 0.2, 0.2], dtype=dtype)
    adv = compute_advantages(rewards, 7, mode)
    assert adv.dtype == dtype and adv.shape == rewards.shape
    assert torch.all(adv[:42] == 0)  # exact, not approximately
    if dtype == torch.float32:  # these values do leave rounding residue in a plain r - mean
        grouped = rewards[:42].view(6, 7)
        assert torch.any(grouped - grouped.mean(1, keepdim=True) != 0)
    assert torch.all(adv[42:] != 0)


def test_advantages_match_python_reference_random():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen, dtype=torch.float64)
    rewards[6:12] = 0.25  # one equal group
    for mode in ("zscore", "center"):
        got = compute_advantages(rewards, 6, mode)
        exp = _reference_advantages(rewards.tolist(), 6, mode)
        torch.testing.assert_close(got, torch.tensor(exp, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_advantages_group_size_one_is_zero_and_errors():
    for mode in ("zscore", "center"):
        assert torch.equal(compute_advantages(torch.tensor([1.0, 0.0, 3.0]), 1, mode), torch.zeros(3))
    assert compute_advantages(torch.tensor([1, 0, 1, 1]), 2, "center").dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="divisible"):
        compute_advantages(torch.zeros(5), 2, "zscore")
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(4), 0, "zscore")
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(4), 2, "rank")
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(2, 2), 2, "zscore")
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(torch.tensor([1.0, float("nan")]), 2, "zscore")


# --------------------------------------------------------------------------------------------
# Loss values and gradients against the plain-Python reference
# --------------------------------------------------------------------------------------------


def test_grpo_hand_worked_literal():
    # row 0, A=+0.8: r=1.5 clipped high -> -0.96 (grad 0); r=0.7 -> -0.56; r=1.1 -> -0.88; mean -0.8
    # row 2, A=-1.2: r=0.7 clipped low -> +0.96 (grad 0); r=6 -> +7.2; r=0.9 -> +1.08; r=1.05 -> +1.26;
    #   mean 10.5 / 4 = 2.625
    # loss = (-0.8 + 2.625) / 2 = 0.9125; grads = -A r / (n_row * 2)
    batch, logps = _batch(with_ref=False)
    out = compute_policy_loss(batch, ObjectiveConfig.preset("grpo"))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.9125, abs=1e-12)
    expected = [[0.0, -0.56 / 6, -0.88 / 6, 0.0, 0.0], [0.0] * T, [0.0, 0.0, 7.2 / 8, 1.08 / 8, 1.26 / 8]]
    torch.testing.assert_close(logps.grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    m = out.metrics
    assert m["num_action_tokens"] == 7.0 and m["num_valid_rows"] == 2.0
    assert m["ratio_min"] == pytest.approx(0.7) and m["ratio_max"] == pytest.approx(6.0)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.7 + 1.1 + 0.7 + 6.0 + 0.9 + 1.05) / 7)
    assert m["max_abs_log_ratio"] == pytest.approx(math.log(6.0))
    # sign-aware: high = (1.5, A>0); low = (0.7, A<0); (0.7, A>0) and (6.0, A<0) are not clipped
    assert m["clip_fraction_high"] == pytest.approx(1 / 7)
    assert m["clip_fraction_low"] == pytest.approx(1 / 7)
    assert m["clip_fraction"] == pytest.approx(2 / 7)
    assert m["kl"] == 0.0 and out.kl.item() == 0.0
    assert all(type(v) is float for v in m.values())


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_presets_match_reference(name, beta):
    cfg = ObjectiveConfig.preset(name, beta=beta)
    adv = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), 3, cfg.advantage).tolist()
    expected_adv = _reference_advantages(REWARDS, 3, cfg.advantage)
    torch.testing.assert_close(torch.tensor(adv, dtype=torch.float64), torch.tensor(expected_adv, dtype=torch.float64))
    assert adv[0] > 0 and adv[2] < 0
    out, _ = _check_against_reference(cfg, adv)
    assert (out.kl.item() > 0) == (beta > 0)


@pytest.mark.parametrize("advantage", ["zscore", "center"])
@pytest.mark.parametrize("reduction", ["seq_mean", "fixed_length"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_ablation_cells_match_reference(advantage, reduction, beta):
    cfg = ObjectiveConfig(policy="clip", advantage=advantage, reduction=reduction, fixed_length=5, beta=beta)
    adv = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), 3, advantage).tolist()
    _check_against_reference(cfg, adv)


@pytest.mark.parametrize("policy", ["clip", "cispo"])
@pytest.mark.parametrize("reduction", ["seq_mean", "token_mean"])
def test_asymmetric_eps_matches_reference(policy, reduction):
    # clip range [0.75, 1.45]: r=0.7 (A<0) clipped low, r=1.5 (A>0) clipped high; swapped eps would not
    cfg = ObjectiveConfig(policy=policy, reduction=reduction, epsilon_low=0.25, epsilon_high=0.45, cispo_max=1.4)
    _check_against_reference(cfg, ADV)


@pytest.mark.parametrize("policy", ["clip", "cispo"])
def test_token_mean_reduction_matches_reference(policy):
    _check_against_reference(ObjectiveConfig(policy=policy, reduction="token_mean", beta=0.02), ADV)


def test_fixed_length_literal_and_preset_cells():
    # Same per-token values as the GRPO literal, summed per row and divided by L = 768:
    # row 0 sum -2.4, row 2 sum 10.5 -> (-2.4 + 10.5) / 768 / 2
    batch, _ = _batch(with_ref=False)
    cfg = ObjectiveConfig(policy="clip", advantage="center", reduction="fixed_length", fixed_length=768)
    out = compute_policy_loss(batch, cfg)
    assert out.loss.item() == pytest.approx((-2.4 + 10.5) / 768 / 2, abs=1e-14)
    assert ObjectiveConfig.preset("dr_grpo", advantage="zscore").reduction == "fixed_length"
    assert ObjectiveConfig.preset("grpo", advantage="center").advantage == "center"


def test_kl_is_a_token_mean_whatever_the_reduction():
    batch, _ = _batch(with_ref=True)
    logp, _, ref = _example_lists()
    deltas = [ref[b][t] - logp[b][t] for b in range(3) for t in range(T) if MASK[b][t]]
    kl_tokens = [math.exp(d) - d - 1 for d in deltas]
    expected_kl = sum(kl_tokens) / NUM_TOKENS
    # a per-row mean of the KL would differ here (rows of 3 and 4 tokens)
    per_row = (sum(kl_tokens[:3]) / 3 + sum(kl_tokens[3:]) / 4) / 2
    assert abs(per_row - expected_kl) > 1e-4
    for name in PRESETS:
        with_kl = compute_policy_loss(batch, ObjectiveConfig.preset(name, beta=0.5))
        without = compute_policy_loss(batch, ObjectiveConfig.preset(name))
        assert with_kl.kl.item() == pytest.approx(expected_kl, rel=1e-12)
        assert with_kl.loss.item() == pytest.approx(without.loss.item() + 0.5 * expected_kl, rel=1e-12)
        assert without.metrics["kl"] == 0.0  # ref given but beta 0: not computed


def test_beta_without_ref_raises():
    batch, _ = _batch(with_ref=False)
    with pytest.raises(ValueError, match="ref_logps"):
        compute_policy_loss(batch, ObjectiveConfig.preset("grpo", beta=0.1))


def test_float32_and_bfloat16_inputs():
    lists = _example_lists()
    out64 = compute_policy_loss(_batch(lists=lists)[0], ObjectiveConfig.preset("grpo", beta=0.1))
    out32 = compute_policy_loss(_batch(lists=lists, dtype=torch.float32)[0], ObjectiveConfig.preset("grpo", beta=0.1))
    assert out32.loss.dtype == torch.float32
    assert out32.loss.item() == pytest.approx(out64.loss.item(), rel=1e-5)
    bf, logps = _batch(lists=lists, dtype=torch.bfloat16)
    out_bf = compute_policy_loss(bf, ObjectiveConfig.preset("grpo"))
    assert out_bf.loss.dtype == torch.float32
    out_bf.loss.backward()
    assert logps.grad.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# Masks, empty rows, empty batch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_masked_garbage_changes_nothing(name):
    clean_logp, old, ref = _example_lists()
    dirty_logp = [row[:] for row in clean_logp]
    dirty_old = [row[:] for row in old]
    dirty_ref = [row[:] for row in ref]
    huge = [1e30, -1e30, float("inf"), -float("inf")]
    k = 0
    for b in range(3):
        for t in range(T):
            if not MASK[b][t]:
                dirty_logp[b][t] = huge[k % 4]
                dirty_old[b][t] = huge[(k + 1) % 4]
                dirty_ref[b][t] = huge[(k + 2) % 4]
                k += 1
    cfg = ObjectiveConfig.preset(name, beta=0.1)
    clean, clean_logps = _batch(lists=(clean_logp, old, ref), dtype=torch.float32)
    dirty, dirty_logps = _batch(lists=(dirty_logp, dirty_old, dirty_ref), dtype=torch.float32)
    a, b_ = compute_policy_loss(clean, cfg), compute_policy_loss(dirty, cfg)
    a.loss.backward()
    b_.loss.backward()
    assert torch.isfinite(b_.loss)
    assert torch.equal(a.loss, b_.loss)
    assert a.metrics == b_.metrics
    assert torch.equal(clean_logps.grad, dirty_logps.grad)
    masked_out = ~torch.tensor(MASK, dtype=torch.bool)
    assert torch.all(dirty_logps.grad[masked_out] == 0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_empty_rows_are_left_out(name):
    cfg = ObjectiveConfig.preset(name, beta=0.1)
    full, _ = _batch(adv=[0.8, 1000.0, -1.2])  # the empty row's advantage must not matter
    logp, old, ref = _example_lists()
    keep = [0, 2]
    reduced, _ = _batch(
        adv=[ADV[i] for i in keep],
        lists=([logp[i] for i in keep], [old[i] for i in keep], [ref[i] for i in keep]),
        mask=[MASK[i] for i in keep],
    )
    a, b_ = compute_policy_loss(full, cfg), compute_policy_loss(reduced, cfg)
    assert a.loss.item() == pytest.approx(b_.loss.item(), rel=1e-12)
    assert a.metrics["num_valid_rows"] == 2.0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_all_empty_batch_gives_exact_zero_with_gradient(name):
    logps = torch.randn(2, 3, requires_grad=True)
    old, ref = torch.randn(2, 3) * 50, torch.randn(2, 3) * 50
    batch = PolicyBatch(logps, old, torch.tensor([1.0, -1.0]), torch.zeros(2, 3), ref)
    out = compute_policy_loss(batch, ObjectiveConfig.preset(name, beta=0.1))
    assert out.loss.item() == 0.0 and out.loss.grad_fn is not None
    out.loss.backward()
    assert torch.equal(logps.grad, torch.zeros(2, 3))
    m = out.metrics
    assert m["num_action_tokens"] == 0.0 and m["num_valid_rows"] == 0.0 and m["kl"] == 0.0
    assert m["ratio_min"] == m["ratio_mean"] == m["ratio_max"] == 1.0
    assert m["max_abs_log_ratio"] == 0.0 and m["clip_fraction"] == 0.0


def test_reduce_loss_helper_directly():
    values = torch.tensor([[1.0, 2.0, 100.0], [5.0, -7.0, 3.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 1]])
    # rows: {1, 2} (n=2), empty, {4} (n=1)
    assert reduce_loss(values, mask, "seq_mean").item() == pytest.approx((1.5 + 4.0) / 2)
    assert reduce_loss(values, mask, "fixed_length", 4).item() == pytest.approx((3.0 / 4 + 4.0 / 4) / 2)
    assert reduce_loss(values, mask, "token_mean").item() == pytest.approx(7.0 / 3)
    assert reduce_loss(torch.tensor([2.0, 99.0, -1.0]), mask, "sequence").item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        reduce_loss(values, mask, "sequence")
    with pytest.raises(ValueError):
        reduce_loss(values, mask, "fixed_length")
    with pytest.raises(ValueError):
        reduce_loss(values, mask, "sum")


# --------------------------------------------------------------------------------------------
# Ratio-one updates, clip fractions, CISPO, GSPO
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_ratio_exactly_one(name):
    gen = torch.Generator().manual_seed(1)
    logps = (-torch.rand(4, 6, generator=gen) * 3).requires_grad_()
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    batch = PolicyBatch(logps, logps.detach(), torch.tensor([1.0, -1.0, 0.5, -0.2]), mask)
    m = compute_policy_loss(batch, ObjectiveConfig.preset(name)).metrics
    assert m["max_abs_log_ratio"] == 0.0 and m["kl_old"] == 0.0
    assert m["ratio_min"] == m["ratio_max"] == m["ratio_mean"] == 1.0
    assert m["clip_fraction_low"] == m["clip_fraction_high"] == m["clip_fraction"] == 0.0
    assert m.get("cispo_truncation_fraction", 0.0) == 0.0
    assert m.get("gspo_seq_clip_fraction", 0.0) == 0.0


def test_on_policy_grpo_cispo_and_gspo_take_the_same_gradient():
    """At ratio 1 (K=1, the demo recipe) GRPO, CISPO (seq-mean) and GSPO all reduce to
    d loss / d logp_bt = -A_b m_bt / (n_b V): the same step; Dr.GRPO (centred A, fixed L) does not."""
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(6, 7, generator=gen, dtype=torch.float64) * 3  # (B, T)
    mask = (torch.rand(6, 7, generator=gen) > 0.3).long()
    mask[4] = 0  # an empty row: left out of V
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0], dtype=torch.float64)  # 3 groups of 2
    grads = {}
    for name in ("grpo", "cispo", "gspo", "dr_grpo"):
        cfg = ObjectiveConfig.preset(name)
        logps = logp.clone().requires_grad_()
        adv = compute_advantages(rewards, 2, cfg.advantage)
        compute_policy_loss(PolicyBatch(logps, logp.clone(), adv, mask), cfg).loss.backward()
        grads[name] = logps.grad
    adv = compute_advantages(rewards, 2, "zscore").tolist()
    n = mask.sum(1).tolist()
    V = sum(1 for k in n if k)
    expected = [[-adv[b] * mask[b, t].item() / (n[b] * V) if n[b] else 0.0 for t in range(7)] for b in range(6)]
    for name in ("grpo", "cispo", "gspo"):
        torch.testing.assert_close(grads[name], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert not torch.allclose(grads["dr_grpo"], grads["grpo"])


def test_kl_old_is_the_k3_token_mean_over_action_tokens():
    """kl_old = sum_t m_t (r_t - 1 - log r_t) / sum_t m_t, hand-worked; masked garbage is ignored."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, -9.0]], dtype=torch.float64)
    shift = torch.tensor([[math.log(2.0), math.log(0.5), 0.0], [math.log(1.5), 50.0, -50.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    batch = PolicyBatch(old + shift, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask)
    m = compute_policy_loss(batch, ObjectiveConfig.preset("grpo")).metrics
    k3 = [2.0 - 1 - math.log(2.0), 0.5 - 1 - math.log(0.5), 0.0, 1.5 - 1 - math.log(1.5)]
    assert m["kl_old"] == pytest.approx(sum(k3) / 4, rel=1e-12)
    assert m["kl_old"] > 0  # any move of the policy shows


def test_replay_diagnostics_on_a_hand_worked_two_row_batch():
    """The per-update replay diagnostics: clip fractions, ratio std and ESS, both KL directions,
    the sequence ratio's statistics and CISPO's largest weight, against values worked by hand.

    Ratios r on action tokens (row 0's third token is masked garbage):
        row 0, A = +1: 1.5 (above 1 + 0.2: clipped high), 0.5 (below 0.8 but A > 0: kept)
        row 1, A = -1: 2.0 (above 1.2 but A < 0: kept), 1.0, 0.25 (below 0.8: clipped low)
    """
    ratios = [[1.5, 0.5, None], [2.0, 1.0, 0.25]]
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], dtype=torch.float64)
    shift = torch.tensor([[math.log(r) if r else 40.0 for r in row] for row in ratios], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = PolicyBatch(old + shift, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask)
    m = compute_policy_loss(batch, ObjectiveConfig.preset("grpo")).metrics
    r = [1.5, 0.5, 2.0, 1.0, 0.25]
    assert (m["clip_fraction_high"], m["clip_fraction_low"], m["clip_fraction"]) == pytest.approx((0.2, 0.2, 0.4))
    assert m["ratio_mean"] == pytest.approx(1.05, rel=1e-12)  # 5.25 / 5
    assert m["ratio_sq_mean"] == pytest.approx(1.5125, rel=1e-12)  # 7.5625 / 5
    assert m["ratio_std"] == pytest.approx(math.sqrt(0.41), rel=1e-12)  # sqrt(1.5125 - 1.05^2)
    assert m["ratio_ess"] == pytest.approx(5.25 ** 2 / (5 * 7.5625), rel=1e-12)  # (sum r)^2 / (n sum r^2)
    assert m["kl_old"] == pytest.approx(sum(x - 1 - math.log(x) for x in r) / 5, rel=1e-12)
    assert m["kl_new_old"] == pytest.approx(sum(x * math.log(x) - x + 1 for x in r) / 5, rel=1e-12)
    seq = [math.sqrt(1.5 * 0.5), (2.0 * 1.0 * 0.25) ** (1 / 3)]  # exp(mean log r) per row
    assert (m["seq_ratio_min"], m["seq_ratio_max"]) == pytest.approx((seq[1], seq[0]), rel=1e-12)
    assert m["seq_ratio_mean"] == pytest.approx(sum(seq) / 2, rel=1e-12)
    assert m["seq_ratio_std"] == pytest.approx(abs(seq[0] - seq[1]) / 2, rel=1e-9)
    assert m["seq_ratio_ess"] == pytest.approx(sum(seq) ** 2 / (2 * sum(x * x for x in seq)), rel=1e-12)
    cispo = compute_policy_loss(batch, ObjectiveConfig.preset("cispo", cispo_max=1.8)).metrics
    assert cispo["cispo_weight_max"] == pytest.approx(1.8) and cispo["cispo_truncation_fraction"] == pytest.approx(0.2)
    assert compute_policy_loss(batch, ObjectiveConfig.preset("cispo")).metrics["cispo_weight_max"] == pytest.approx(2.0)
    # On-policy (update 0: old = logp): every ratio 1, ESS 1, std 0, both KLs exactly 0.
    same = compute_policy_loss(PolicyBatch(old, old, batch.advantages, mask), ObjectiveConfig.preset("grpo")).metrics
    assert (same["ratio_std"], same["ratio_ess"], same["kl_old"], same["kl_new_old"]) == (0.0, 1.0, 0.0, 0.0)
    assert (same["seq_ratio_std"], same["seq_ratio_ess"], same["clip_fraction"]) == (0.0, 1.0, 0.0)


def test_update_zero_figures_are_exact_for_every_token_count():
    """Update 0 (old = logp) reports ratio mean 1, std 0 and ESS 1 exactly, whatever the number of
    action tokens or rows: n * (1/n) is 1 - 2^-53 for n = 49, which once logged std 1e-8."""
    g = torch.Generator().manual_seed(5)
    for rows, cols in [(1, 49), (7, 7), (49, 3), (3, 41), (98, 1), (13, 11)]:
        logps = -torch.rand(rows, cols, generator=g) * 4
        mask = torch.ones(rows, cols, dtype=torch.bool)
        batch = PolicyBatch(logps, logps.clone(), torch.randn(rows, generator=g), mask)
        m = compute_policy_loss(batch, ObjectiveConfig.preset("grpo")).metrics
        figures = (m["ratio_mean"], m["ratio_sq_mean"], m["ratio_std"], m["ratio_ess"])
        assert figures == (1.0, 1.0, 0.0, 1.0), (rows, cols)
        assert (m["seq_ratio_mean"], m["seq_ratio_std"], m["seq_ratio_ess"]) == (1.0, 0.0, 1.0), (rows, cols)


def test_moment_figures_pool_micro_batches_exactly():
    """std and ESS of a split batch, from the token-weighted means of the parts' moments, equal
    those of the whole batch (how the trainer pools its micro-batches)."""
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 7, generator=g, dtype=torch.float64) * 3
    logps = old + torch.randn(6, 7, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(6, 7, generator=g) > 0.3
    mask[4] = False  # an empty row
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    whole = compute_policy_loss(PolicyBatch(logps, old, adv, mask), ObjectiveConfig.preset("grpo")).metrics
    parts = [compute_policy_loss(PolicyBatch(logps[rows], old[rows], adv[rows], mask[rows]),
                                 ObjectiveConfig.preset("grpo")).metrics for rows in (slice(0, 2), slice(2, 6))]
    pooled = {}
    for key, weight in (("ratio_mean", "num_action_tokens"), ("ratio_sq_mean", "num_action_tokens"),
                        ("seq_ratio_mean", "num_valid_rows"), ("seq_ratio_sq_mean", "num_valid_rows")):
        pooled[key] = sum(p[key] * p[weight] for p in parts) / sum(p[weight] for p in parts)
    pooled.update(moment_figures(pooled))
    for key in ("ratio_std", "ratio_ess", "seq_ratio_std", "seq_ratio_ess"):
        assert pooled[key] == pytest.approx(whole[key], rel=1e-10), key


def test_sign_aware_clip_fractions():
    # five tokens in one row each; (r, A): (1.5,+) high, (1.5,-) no, (0.5,-) low, (0.5,+) no, (1.0,+) no
    pairs = [(1.5, 1.0), (1.5, -1.0), (0.5, -1.0), (0.5, 1.0), (1.0, 1.0)]
    old = torch.full((5, 2), -1.0, dtype=torch.float64)
    logps = old + torch.tensor([[math.log(r), 0.0] for r, _ in pairs], dtype=torch.float64)
    mask = torch.tensor([[1, 0]] * 5)
    batch = PolicyBatch(logps, old, torch.tensor([a for _, a in pairs], dtype=torch.float64), mask)
    m = compute_policy_loss(batch, ObjectiveConfig.preset("grpo")).metrics
    assert m["clip_fraction_high"] == pytest.approx(1 / 5)
    assert m["clip_fraction_low"] == pytest.approx(1 / 5)
    assert m["clip_fraction"] == pytest.approx(2 / 5)
    # decoupled eps: with eps_high 0.6 the r=1.5 token is inside
    m2 = compute_policy_loss(batch, ObjectiveConfig.preset("grpo", epsilon_high=0.6)).metrics
    assert m2["clip_fraction_high"] == 0.0 and m2["clip_fraction_low"] == pytest.approx(1 / 5)


def test_cispo_truncation_and_stop_gradient():
    # cap 1.3: tokens r=1.5 and r=6.0 are truncated (2 of 7), whatever the advantage's sign
    cfg = ObjectiveConfig.preset("cispo", cispo_max=1.3)
    batch, logps = _batch(with_ref=False)
    out = compute_policy_loss(batch, cfg)
    out.loss.backward()
    assert out.metrics["cispo_truncation_fraction"] == pytest.approx(2 / 7)
    # gradient = -min(r, cap) * A / (n_row * |V|); a weight with gradient would add -A*logp*r terms
    w = [[min(r, 1.3) if r is not None else 0.0 for r in row] for row in RATIOS]
    n_row = [sum(row) for row in MASK]
    expected = [[-w[b][t] * ADV[b] / (n_row[b] * 2) if MASK[b][t] else 0.0 for t in range(T)] for b in range(3)]
    torch.testing.assert_close(logps.grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    # default cap 5.0: only r = 6.0 is truncated
    default_cap = compute_policy_loss(batch, ObjectiveConfig.preset("cispo")).metrics
    assert default_cap["cispo_truncation_fraction"] == pytest.approx(1 / 7)
    assert "cispo_truncation_fraction" not in compute_policy_loss(batch, ObjectiveConfig.preset("grpo")).metrics


def test_gspo_sequence_ratio_clip_and_gradient():
    # Row log-ratio means (clip range [1-3e-4, 1+4e-4]):
    #   0: +1e-3,   A>0  clipped high        1: -1e-3,   A<0  clipped low
    #   2: -1e-3,   A>0  not clipped (sign)  3: +1e-3,   A<0  not clipped (sign)
    #   4: +1e-4,   A<0  inside              5: -3.5e-4, A<0  clipped low (inside if eps were swapped)
    #   6: empty row
    means = [1e-3, -1e-3, -1e-3, 1e-3, 1e-4, -3.5e-4, 0.0]
    adv = [1.0, -2.0, 0.5, -0.7, -1.5, -1.0, 9.0]
    old = torch.tensor([[-1.0, -2.0, -0.5]] * 7, dtype=torch.float64)
    offsets = torch.tensor([[m - 0.2, m + 0.2, 7.0] for m in means], dtype=torch.float64)  # token 2 masked
    mask = torch.tensor([[1, 1, 0]] * 6 + [[0, 0, 0]])
    logps = (old + offsets).requires_grad_()
    batch = PolicyBatch(logps, old, torch.tensor(adv, dtype=torch.float64), mask)
    out = compute_policy_loss(batch, ObjectiveConfig.preset("gspo"))
    out.loss.backward()
    s = [math.exp(m) for m in means[:6]]
    lo, hi = 1 - 3e-4, 1 + 4e-4
    per_seq = [-min(si * a, min(max(si, lo), hi) * a) for si, a in zip(s, adv)]
    assert per_seq[5] == pytest.approx(-lo * -1.0)  # the clipped branch
    assert out.loss.item() == pytest.approx(sum(per_seq) / 6, rel=1e-12)
    m = out.metrics
    assert m["seq_ratio_min"] == pytest.approx(math.exp(-1e-3)) and m["seq_ratio_max"] == pytest.approx(math.exp(1e-3))
    assert m["seq_ratio_mean"] == pytest.approx(sum(s) / 6)
    assert m["gspo_seq_clip_fraction_high"] == pytest.approx(1 / 6)
    assert m["gspo_seq_clip_fraction_low"] == pytest.approx(2 / 6)
    assert m["gspo_seq_clip_fraction"] == pytest.approx(3 / 6)
    # Gradient: clipped rows 0, 1, 5 get 0; rows 2, 3, 4 get -A * s / n / |V| on each action token.
    expected = torch.zeros(7, 3, dtype=torch.float64)
    for b in (2, 3, 4):
        expected[b, :2] = -adv[b] * s[b] / 2 / 6
    torch.testing.assert_close(logps.grad, expected, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------------------------
# Extreme log-ratios: clamped to +-LOG_RATIO_BOUND before exp
# --------------------------------------------------------------------------------------------


def _extreme_batch(dtype=torch.float32):
    """Four rows of three action tokens (fp32, where exp overflows above ~88.7). Token 0 of each
    row is extreme: log-ratio +90 (rows 0, 1), an old log-prob of -inf (row 2), -90 (row 3);
    tokens 1 and 2 are ordinary (log-ratios 0.05 and -0.1). Advantages +1, -1, +1, -1."""
    old = torch.tensor([[-1.0, -2.0, -0.5]] * 4, dtype=dtype)
    old[2, 0] = -math.inf
    shift = torch.tensor([[90.0, 0.05, -0.1], [90.0, 0.05, -0.1], [0.0, 0.05, -0.1], [-90.0, 0.05, -0.1]], dtype=dtype)
    logps = torch.where(torch.isinf(old), torch.full_like(old, -3.0), old + shift).requires_grad_()
    return PolicyBatch(logps, old, torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=dtype), torch.ones(4, 3)), logps


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_extreme_log_ratios_give_finite_loss_and_gradient(name):
    batch, logps = _extreme_batch()
    out = compute_policy_loss(batch, ObjectiveConfig.preset(name))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logps.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert out.metrics["max_abs_log_ratio"] == LOG_RATIO_BOUND
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(LOG_RATIO_BOUND), rel=1e-6)
    if name == "cispo":
        # the stop-gradient weight is capped: each extreme token keeps -min(r, 5) * A / (3 * 4)
        expected = [-min(math.exp(x), 5.0) * a / 12 for x, a in zip([20.0, 20.0, 20.0, -20.0], [1, -1, 1, -1])]
        torch.testing.assert_close(logps.grad[:, 0], torch.tensor(expected), rtol=1e-6, atol=1e-12)
    else:
        # the clamp is active on every extreme token: exactly zero gradient there
        assert torch.equal(logps.grad[:, 0], torch.zeros(4))


def test_extreme_log_ratio_loss_values_are_the_clamped_ones():
    # GRPO per token: row 1 (A = -1, r = e^20) gives -min(-e^20, -1.2) = e^20; row 0 (A = +1)
    # gives -1.2; row 2 (old = -inf, A = +1) -1.2; row 3 (r = e^-20, A = -1) -min(-e^-20, -0.8) = 0.8.
    batch, _ = _extreme_batch(dtype=torch.float64)
    clamped = compute_policy_loss(batch, ObjectiveConfig.preset("grpo"))
    ordinary = [-min(math.exp(x) * a, min(max(math.exp(x), 0.8), 1.2) * a) for x in (0.05, -0.1) for a in (1, -1)]
    rows = [-1.2, math.exp(20.0), -1.2, 0.8]
    expected = sum(rows) / 12 + 2 * sum(ordinary) / 12
    assert clamped.loss.item() == pytest.approx(expected, rel=1e-12)
    # k3 KL with an extreme reference log-prob stays finite too (the same clamp on ref - logp)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl = k3_kl(logp, torch.tensor([[-1.0 + 90.0, -math.inf]]))
    assert kl[0].tolist() == pytest.approx([math.exp(20.0) - 21.0, math.exp(-20.0) + 19.0], rel=1e-6)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_log_ratios_inside_the_bound_are_not_changed(name):
    # log-ratio 19.9 is inside the bound: loss and gradient are the unclamped formula's
    logps = torch.tensor([[19.9 - 1.0, -2.1]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    out = compute_policy_loss(PolicyBatch(logps, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2)),
                              ObjectiveConfig.preset(name))
    assert out.metrics["max_abs_log_ratio"] == pytest.approx(19.9, rel=1e-12)
    if name in ("grpo", "dr_grpo"):
        length = 2 if name == "grpo" else 768
        assert out.loss.item() == pytest.approx((math.exp(19.9) + math.exp(-0.1)) / length, rel=1e-12)


# --------------------------------------------------------------------------------------------
# Cross-check with TRL 1.16's GRPOTrainer._compute_loss formula (rewritten here from its source)
# --------------------------------------------------------------------------------------------


def _trl_grpo_loss(logps, old, ref, adv, mask, eps_low, eps_high, beta, sequence_level=False):
    """TRL 1.16 `_compute_loss`, loss_type="grpo", no entropy/vLLM/off-policy options, GA = 1."""
    mask = mask.to(logps.dtype)
    log_ratio = logps - old
    if sequence_level:
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * (torch.exp(ref - logps) - (ref - logps) - 1)
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def _random_batch(seed, b=8, t=12, empty_row=False):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 4
    logps = (old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3).requires_grad_()
    ref = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.2
    mask = (torch.rand(b, t, generator=gen) > 0.35).long()
    mask[:, 0] = 1
    if empty_row:
        mask[3] = 0
    rewards = (torch.rand(b, generator=gen) > 0.5).double() + torch.rand(b, generator=gen, dtype=torch.float64) * 0.1
    return logps, old, ref, rewards, mask


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_trl_formula(seed):
    logps, old, ref, rewards, mask = _random_batch(seed)
    adv = compute_advantages(rewards, 4, "zscore")
    # TRL's advantages: (r - group mean) / (unbiased group std + 1e-4)
    g = rewards.view(-1, 4)
    trl_adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)
    torch.testing.assert_close(adv, trl_adv)
    ours = compute_policy_loss(PolicyBatch(logps, old, adv, mask), ObjectiveConfig.preset("grpo")).loss
    theirs = _trl_grpo_loss(logps, old, ref, trl_adv, mask, 0.2, 0.2, 0.0)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(_grad(ours, logps), _grad(theirs, logps), rtol=1e-12, atol=1e-14)
    # GSPO equals TRL's grpo loss with importance_sampling_level="sequence" and eps 3e-4/4e-4.
    ours_gspo = compute_policy_loss(PolicyBatch(logps, old, adv, mask), ObjectiveConfig.preset("gspo")).loss
    theirs_gspo = _trl_grpo_loss(logps, old, ref, trl_adv, mask, 3e-4, 4e-4, 0.0, sequence_level=True)
    torch.testing.assert_close(ours_gspo, theirs_gspo, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(_grad(ours_gspo, logps), _grad(theirs_gspo, logps), rtol=1e-12, atol=1e-14)


def test_documented_differences_from_trl():
    # 1. TRL averages an empty row in as 0; we leave it out: ours = TRL * B / |V|.
    logps, old, ref, rewards, mask = _random_batch(5, empty_row=True)
    adv = compute_advantages(rewards, 4, "zscore")
    ours = compute_policy_loss(PolicyBatch(logps, old, adv, mask), ObjectiveConfig.preset("grpo")).loss
    theirs = _trl_grpo_loss(logps, old, ref, adv, mask, 0.2, 0.2, 0.0)
    torch.testing.assert_close(ours, theirs * 8 / 7, rtol=1e-12, atol=1e-14)
    # 2. TRL folds beta*KL into each row's mean; we take a token mean. Equal when all rows have the
    #    same number of action tokens.
    full = torch.ones_like(mask)
    cfg = ObjectiveConfig.preset("grpo", beta=0.3)
    ours_kl = compute_policy_loss(PolicyBatch(logps, old, adv, full, ref), cfg).loss
    theirs_kl = _trl_grpo_loss(logps, old, ref, adv, full, 0.2, 0.2, 0.3)
    torch.testing.assert_close(ours_kl, theirs_kl, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------------
# Configuration, batch validation, registry
# --------------------------------------------------------------------------------------------


def test_presets():
    grpo = ObjectiveConfig.preset("grpo")
    assert (grpo.policy, grpo.advantage, grpo.reduction, grpo.epsilon_low, grpo.epsilon_high) == (
        "clip", "zscore", "seq_mean", 0.2, 0.2,
    )
    assert grpo == ObjectiveConfig()  # defaults are the GRPO preset
    cispo = ObjectiveConfig.preset("cispo")
    assert (cispo.policy, cispo.advantage, cispo.reduction, cispo.cispo_max) == ("cispo", "zscore", "seq_mean", 5.0)
    dr = ObjectiveConfig.preset("dr_grpo")
    assert (dr.policy, dr.advantage, dr.reduction, dr.fixed_length, dr.epsilon_low, dr.epsilon_high) == (
        "clip", "center", "fixed_length", 768, 0.2, 0.2,
    )
    gspo = ObjectiveConfig.preset("gspo")
    assert (gspo.policy, gspo.advantage, gspo.reduction, gspo.epsilon_low, gspo.epsilon_high) == (
        "gspo", "zscore", "sequence", 3e-4, 4e-4,
    )
    assert ObjectiveConfig.preset("gspo", beta=0.01).beta == 0.01
    with pytest.raises(dataclasses.FrozenInstanceError):
        grpo.beta = 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(policy="gspo", reduction="seq_mean"),
        dict(policy="gspo", reduction="fixed_length", fixed_length=10),
        dict(policy="clip", reduction="sequence"),
        dict(policy="cispo", reduction="sequence"),
        dict(reduction="fixed_length"),
        dict(reduction="fixed_length", fixed_length=0),
        dict(fixed_length=-5),
        dict(fixed_length=7.5),
        dict(epsilon_low=-0.1),
        dict(epsilon_high=-0.1),
        dict(epsilon_low=1.5),
        dict(epsilon_high=float("nan")),
        dict(cispo_max=0.0),
        dict(cispo_max=-1.0),
        dict(beta=-0.01),
        dict(beta=True),
        dict(policy="ppo"),
        dict(advantage="rank"),
        dict(reduction="sum"),
    ],
)
def test_invalid_configs_raise(kwargs):
    with pytest.raises(ValueError):
        ObjectiveConfig(**kwargs)


def test_invalid_preset_calls_raise():
    with pytest.raises(ValueError, match="preset"):
        ObjectiveConfig.preset("ppo")
    with pytest.raises(ValueError, match="field"):
        ObjectiveConfig.preset("grpo", epsilon=0.1)
    with pytest.raises(ValueError):
        ObjectiveConfig.preset("gspo", reduction="seq_mean")
    with pytest.raises(ValueError):
        ObjectiveConfig.preset("dr_grpo", fixed_length=None)


def test_policy_batch_validation():
    x = torch.zeros(2, 3)
    PolicyBatch(x, x, torch.zeros(2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError):
        PolicyBatch(torch.zeros(3), torch.zeros(3), torch.zeros(1), torch.ones(3))
    with pytest.raises(ValueError):
        PolicyBatch(x, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError):
        PolicyBatch(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        PolicyBatch(x, x, torch.zeros(2, 1), torch.ones(2, 3))
    with pytest.raises(ValueError):
        PolicyBatch(x, x, torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ValueError):
        PolicyBatch(x, x, torch.zeros(2), torch.ones(2, 3), ref_logps=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="0 or 1"):
        PolicyBatch(x, x, torch.zeros(2), torch.full((2, 3), 2))
    with pytest.raises(TypeError):
        PolicyBatch(x, x, torch.zeros(2, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(TypeError):
        PolicyBatch(x.tolist(), x, torch.zeros(2), torch.ones(2, 3))


def test_registered_plugin_objective():
    name = "test_reinforce_plain"
    try:

        @register_policy_loss(name, level="token")
        def reinforce(logps, old_logps, advantages, mask, config):
            # the documented contract: bool mask, masked positions zeroed, constant old log-probs
            assert mask.dtype == torch.bool and not old_logps.requires_grad
            assert torch.all(logps[~mask] == 0) and torch.all(old_logps[~mask] == 0)
            # l_t = -A logp_t, no ratio at all
            return PolicyTerm(-advantages.unsqueeze(1) * logps, {"plugin_metric": torch.tensor(3.0)})

        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss(name)(reinforce)
        with pytest.raises(ValueError):
            ObjectiveConfig(policy=name, reduction="sequence")
        cfg = ObjectiveConfig(policy=name, reduction="seq_mean")
        batch, logps = _batch(with_ref=False)
        out = compute_policy_loss(batch, cfg)
        assert isinstance(out, LossOutput)
        out.loss.backward()
        n_row = [sum(row) for row in MASK]
        expected = [[-ADV[b] / (n_row[b] * 2) if MASK[b][t] else 0.0 for t in range(T)] for b in range(3)]
        torch.testing.assert_close(logps.grad, torch.tensor(expected, dtype=torch.float64))
        assert out.metrics["plugin_metric"] == 3.0
    finally:
        POLICY_LOSSES.pop(name, None)
    with pytest.raises(ValueError):
        ObjectiveConfig(policy=name)
    with pytest.raises(ValueError):
        register_policy_loss("x", level="row")
    assert {"clip", "cispo", "gspo"} <= set(POLICY_LOSSES)


# --------------------------------------------------------------------------------------------
# The KL term and the split-invariant weighting (moved here from the trainer's _compute_loss)
# --------------------------------------------------------------------------------------------
# KL batch (B=2, T=3). Row 0: logp -1, -2 (third token masked, garbage 5 / 9); row 1: one token
# with logp = ref. d = ref - logp = -0.5, +1, 0; kl = e^d - d - 1:
#   e^-0.5 + 0.5 - 1 = 0.1065306597,  e - 2 = 0.7182818285,  0.
# Token mean over the 3 action tokens: 0.2749374961. A sign error (d = logp - ref) gives
# (0.1487212707 + 0.3678794412 + 0) / 3 = 0.1722; a per-row mean gives (0.41241 + 0) / 2 = 0.2062;
# a sum gives 0.8248.

KL_LOGP = [[-1.0, -2.0, 5.0], [-0.5, 0.0, 0.0]]
KL_REF = [[-1.5, -1.0, 9.0], [-0.5, 3.0, 3.0]]
KL_MASK = [[1, 1, 0], [1, 0, 0]]
KL_MEAN = (math.exp(-0.5) + 0.5 - 1 + math.e - 2 + 0.0) / 3


def test_kl_token_mean_hand_worked_value_and_gradient():
    logp = torch.tensor(KL_LOGP, requires_grad=True)
    kl = kl_token_mean(logp, torch.tensor(KL_REF), torch.tensor(KL_MASK))
    assert kl.item() == pytest.approx(0.2749374961, rel=1e-6)
    assert kl.item() == pytest.approx(KL_MEAN, rel=1e-6)
    kl.backward()
    # d kl_t / d logp_t = 1 - e^d, averaged over N = 3 tokens; masked positions get exactly 0
    expected = [[(1 - math.exp(-0.5)) / 3, (1 - math.e) / 3, 0.0], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    assert logp.grad[0, 0] > 0 > logp.grad[0, 1]  # raising logp where ref > logp lowers the KL


def test_kl_token_mean_matches_compute_policy_loss_kl():
    logp, ref, mask = torch.tensor(KL_LOGP), torch.tensor(KL_REF), torch.tensor(KL_MASK)
    batch = PolicyBatch(logp, logp, torch.tensor([1.0, -1.0]), mask, ref)
    out = compute_policy_loss(batch, ObjectiveConfig(beta=0.5))
    assert out.kl.item() == pytest.approx(KL_MEAN, rel=1e-6)
    assert out.loss.item() == pytest.approx(out.policy_loss.item() + 0.5 * KL_MEAN, rel=1e-6)


# Weighted-loss batch: the KL batch plus an empty third row; A = 1, -4, 5; ratio 1 (old = logp),
# so the clip term is -A per action token:
#   seq_mean   p = (-1 + 4) / 2 = 1.5        (row 2 has no action token: not a valid row)
#   token_mean p = (-1 - 1 + 4) / 3 = 2/3
# Rollout: R = 8 valid rows, N = 20 action tokens, this process holds 6 rows, W = 2 processes.
#   s = r/R = 2/8 (token_mean: n/N = 3/20);  KL part k n / N = 0.27494 * 3/20
#   loss = W (p s + beta k n/N) + aux_coef aux B/B_local,  beta 0.1, aux 2, coef 0.01, B/B_local 3/6


def weighted_batch():
    logp = torch.tensor(KL_LOGP + [[0.0, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor(KL_REF + [[0.0, 0.0, 0.0]])
    mask = torch.tensor(KL_MASK + [[0, 0, 0]]).bool()
    return logp, PolicyBatch(logp, logp.detach(), torch.tensor([1.0, -4.0, 5.0]), mask, ref)


@pytest.mark.parametrize("reduction, policy, share", [("seq_mean", 1.5, 2 / 8), ("token_mean", 2 / 3, 3 / 20)])
def test_weighted_loss_hand_worked(reduction, policy, share):
    _, batch = weighted_batch()
    totals = RolloutTotals(valid_rows=8, action_tokens=20, local_rows=6, world_size=2)
    config = ObjectiveConfig(reduction=reduction, beta=0.1)
    out = compute_weighted_loss(batch, config, totals, aux_loss=torch.tensor(2.0), aux_coef=0.01)
    kl_part = KL_MEAN * 3 / 20
    assert out.share == pytest.approx(share) and out.world_size == 2.0
    assert out.kl.item() == pytest.approx(kl_part, rel=1e-6) and not out.kl.requires_grad
    assert out.policy.policy_loss.item() == pytest.approx(policy, rel=1e-6)
    assert out.policy.kl.item() == 0.0  # the policy term is computed without the KL
    expected = 2 * (policy * share + 0.1 * kl_part) + 0.01 * 2.0 * 3 / 6
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    without_kl = compute_weighted_loss(batch, dataclasses.replace(config, beta=0.0), totals)
    assert out.loss.item() - without_kl.loss.item() == pytest.approx(2 * 0.1 * kl_part + 0.01, rel=1e-5)  # KL adds


def test_weighted_loss_without_totals_is_the_batch_objective():
    """Evaluation: the micro-batch is the whole rollout (R = r, N = n, W = 1)."""
    _, batch = weighted_batch()
    config = ObjectiveConfig(beta=0.1)
    out = compute_weighted_loss(batch, config)
    assert out.share == 1.0 and out.world_size == 1.0
    assert out.loss.item() == pytest.approx(1.5 + 0.1 * KL_MEAN, rel=1e-6)
    assert out.loss.item() == pytest.approx(compute_policy_loss(batch, config).loss.item(), rel=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        compute_weighted_loss(dataclasses.replace(batch, ref_logps=None), config)


@pytest.mark.parametrize(
    "config",
    [ObjectiveConfig(beta=0.2), ObjectiveConfig(reduction="token_mean", beta=0.2),
     ObjectiveConfig(reduction="fixed_length", fixed_length=7, beta=0.2),
     ObjectiveConfig.preset("gspo", beta=0.2), ObjectiveConfig.preset("cispo", beta=0.2)],
    ids=["seq_mean", "token_mean", "fixed_length", "gspo", "cispo"],
)
def test_weighted_micro_batches_sum_to_the_rollout_objective(config):
    """Two processes x uneven micro-batches: (1/W) sum of weighted losses = the rollout's objective,
    value and gradient (a reduction or weighting error breaks this)."""
    torch.manual_seed(0)
    rows, length = 8, 6
    old = torch.randn(rows, length) - 2
    logp = (old + 0.3 * torch.randn(rows, length)).requires_grad_()
    ref = old + 0.2 * torch.randn(rows, length)
    mask = torch.rand(rows, length) > 0.35
    mask[3] = False  # a row without action tokens
    advantages = torch.randn(rows)

    def part(index):
        return PolicyBatch(logp[index], old[index], advantages[index], mask[index], ref[index])

    whole = compute_policy_loss(part(slice(0, rows)), config)
    (grad_whole,) = torch.autograd.grad(whole.loss, logp)
    totals = RolloutTotals(valid_rows=float((mask.sum(1) > 0).sum()), action_tokens=float(mask.sum()),
                           local_rows=4, world_size=2)
    micro = [slice(0, 3), slice(3, 4), slice(4, 7), slice(7, 8)]  # process 0: rows 0-3, process 1: rows 4-7
    losses = [compute_weighted_loss(part(index), config, totals).loss for index in micro]
    total = sum(losses) / 2  # DDP averages the two processes' gradients
    (grad_split,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(whole.loss.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad_split, grad_whole, rtol=1e-5, atol=1e-7)
