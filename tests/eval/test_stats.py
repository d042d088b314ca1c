"""Bootstrap CIs, interaction, two-level bootstrap and pass@k against independent references."""

import math

import numpy as np
import pytest

from minimind_trl.eval import stats


def _reference_percentile_ci(v, n_resamples, seed, confidence=0.95):
    """Plain numpy reference: one (B, n) index draw, row means, percentile interval."""
    v = np.asarray(v, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_resamples, v.size))
    boot = v[idx].mean(axis=1)
    a = 1 - confidence
    return np.percentile(boot, [100 * a / 2, 100 * (1 - a / 2)])


def test_bootstrap_mean_matches_reference():
    rng = np.random.default_rng(123)
    v = rng.integers(0, 2, size=57).astype(float)
    res = stats.bootstrap_mean_ci(v, n_resamples=3000, seed=7)
    low, high = _reference_percentile_ci(v, 3000, 7)
    assert res.estimate == pytest.approx(v.mean())
    assert (res.low, res.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert res.n_resamples == 3000 and res.seed == 7 and res.confidence == 0.95


def test_block_drawing_equals_single_draw(monkeypatch):
    """Forcing tiny row blocks must not change the resampled stream."""
    v = np.linspace(0, 1, 31) ** 2
    full = stats.bootstrap_mean_ci(v, n_resamples=1001, seed=3)
    monkeypatch.setattr(stats, "_BLOCK_BYTES", 8 * 31 * 7)  # 7 rows per block
    blocked = stats.bootstrap_mean_ci(v, n_resamples=1001, seed=3)
    assert (full.low, full.high) == (blocked.low, blocked.high)


def test_paired_difference_matches_reference():
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2, size=80).astype(float)
    cond = np.where(rng.random(80) < 0.3, 1.0, base)
    res = stats.paired_difference_ci(cond, base, n_resamples=2000, seed=11)
    low, high = _reference_percentile_ci(cond - base, 2000, 11)
    assert res.estimate == pytest.approx(cond.mean() - base.mean())
    assert res.low == pytest.approx(low) and res.high == pytest.approx(high)
    assert res.low <= res.estimate <= res.high


def test_interaction_matches_reference_by_hand():
    a = np.array([1, 0, 1, 0, 1, 1, 0, 0, 1, 0], float)
    b = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 0], float)
    c = np.array([0, 0, 1, 0, 1, 0, 0, 0, 1, 0], float)
    d = np.array([1, 1, 1, 1, 1, 0, 1, 0, 1, 1], float)
    res = stats.interaction_ci(a, b, c, d, n_resamples=4000, seed=2)
    expected = (d.mean() - c.mean()) - (b.mean() - a.mean())
    assert res.estimate == pytest.approx(expected)  # (0.8-0.3) - (0.7-0.5) = 0.3
    assert expected == pytest.approx(0.3)
    # reference: loop over resamples, recompute each cell mean on the same questions
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 10, size=(4000, 10))
    boot = [(d[i].mean() - c[i].mean()) - (b[i].mean() - a[i].mean()) for i in idx]
    low, high = np.percentile(boot, [2.5, 97.5])
    assert res.low == pytest.approx(low) and res.high == pytest.approx(high)


def test_two_level_matches_loop_reference():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 2, size=(3, 25)).astype(float)  # 3 seeds
    y = rng.integers(0, 2, size=(2, 25)).astype(float)  # 2 seeds
    B, seed = 500, 4
    res = stats.two_level_bootstrap_ci([x, y], [1.0, -1.0], n_resamples=B, seed=seed)
    ref_rng = np.random.default_rng(seed)
    sx = ref_rng.integers(0, 3, size=(B, 3))
    sy = ref_rng.integers(0, 2, size=(B, 2))
    q = ref_rng.integers(0, 25, size=(B, 25))
    boot = []
    for b in range(B):
        xb = np.mean([[x[s, j] for j in q[b]] for s in sx[b]])
        yb = np.mean([[y[s, j] for j in q[b]] for s in sy[b]])
        boot.append(xb - yb)
    low, high = np.percentile(boot, [2.5, 97.5])
    assert res.estimate == pytest.approx(x.mean() - y.mean())
    assert res.low == pytest.approx(low) and res.high == pytest.approx(high)


def test_two_level_wider_than_question_only_when_seeds_disagree():
    rng = np.random.default_rng(0)
    n = 200
    # seed effects: each seed shifts success probability by a lot
    x = np.stack([(rng.random(n) < p).astype(float) for p in (0.3, 0.6, 0.9)])
    y = (rng.random((1, n)) < 0.5).astype(float)
    q_only = stats.paired_difference_ci(x.mean(0), y.mean(0), n_resamples=2000, seed=0)
    two = stats.two_level_bootstrap_ci([x, y], [1, -1], n_resamples=2000, seed=0)
    assert two.estimate == pytest.approx(q_only.estimate)
    assert (two.high - two.low) > 1.5 * (q_only.high - q_only.low)


def test_two_level_matched_seeds_matches_loop_reference():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 2, size=(3, 20)).astype(float)
    y = rng.integers(0, 2, size=(3, 20)).astype(float)
    B, seed = 400, 7
    res = stats.two_level_bootstrap_ci([x, y], [1.0, -1.0], n_resamples=B, seed=seed, matched_seeds=True)
    ref_rng = np.random.default_rng(seed)
    s_idx = ref_rng.integers(0, 3, size=(B, 3))  # one seed draw for both cells
    q = ref_rng.integers(0, 20, size=(B, 20))
    boot = [np.mean([[x[s, j] - y[s, j] for j in q[b]] for s in s_idx[b]]) for b in range(B)]
    low, high = np.percentile(boot, [2.5, 97.5])
    assert res.estimate == pytest.approx(x.mean() - y.mean())
    assert res.low == pytest.approx(low) and res.high == pytest.approx(high)
    assert "matched" in res.method


def test_two_level_matched_seeds_cancels_a_shared_seed_effect():
    # Condition = baseline + 0.1 on every seed and question: the seed effect (0.2 / 0.5 / 0.8) is
    # common to both, so the matched contrast never varies; the independent scheme sees seed noise.
    base = np.repeat(np.array([[0.2], [0.5], [0.8]]), 50, axis=1)
    cond = base + 0.1
    matched = stats.two_level_bootstrap_ci([cond, base], [1, -1], n_resamples=2000, seed=0, matched_seeds=True)
    independent = stats.two_level_bootstrap_ci([cond, base], [1, -1], n_resamples=2000, seed=0)
    assert matched.low == pytest.approx(0.1) and matched.high == pytest.approx(0.1) and matched.se < 1e-12
    assert independent.high - independent.low > 0.3


def test_two_level_matched_seeds_needs_equal_seed_counts():
    with pytest.raises(ValueError, match="same seeds in every cell"):
        stats.two_level_bootstrap_ci([np.ones((3, 4)), np.ones((2, 4))], [1, -1], n_resamples=10,
                                     matched_seeds=True)


def test_paired_ci_covers_known_difference_in_simulation():
    """50 simulated paired datasets with true difference 0.1: ~95 % of CIs cover it."""
    rng = np.random.default_rng(2024)
    n, true_diff, covered = 150, 0.1, 0
    sims = 50
    for s in range(sims):
        difficulty = rng.random(n)
        base = (rng.random(n) < difficulty).astype(float)
        # the condition solves each question the baseline solves, plus extra ones w.p. 0.1 / P(base fails)
        extra = rng.random(n) < true_diff / (1 - 0.5)
        cond = np.maximum(base, (1 - base) * extra)
        res = stats.paired_difference_ci(cond, base, n_resamples=1000, seed=s)
        covered += res.low <= true_diff <= res.high
    # E[cond - base] = P(base fails) * 0.2 = 0.5 * 0.2 = 0.1 (difficulty ~ U(0, 1))
    assert 0.86 <= covered / sims <= 1.0


def test_minimum_detectable_effect_against_scipy_and_by_hand():
    """MDE = (z_{1-alpha/2} + z_power) * SE; paired binary case with b = 3 broken and c = 9 fixed of
    n = 60: SE = sqrt((b + c)/n - ((c - b)/n)^2) / sqrt(n) = sqrt(0.2 - 0.01) / sqrt(60)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    assert stats.mde_multiplier() == pytest.approx(2.8015852181129683, rel=1e-12)
    for power, confidence in ((0.8, 0.95), (0.9, 0.99), (0.5, 0.9)):
        z = scipy_stats.norm.ppf(1 - (1 - confidence) / 2) + scipy_stats.norm.ppf(power)
        assert stats.minimum_detectable_effect(0.02, power, confidence) == pytest.approx(0.02 * z, rel=1e-12)
    base = np.array([0] * 9 + [1] * 3 + [1] * 20 + [0] * 28, float)
    cond = np.array([1] * 9 + [0] * 3 + [1] * 20 + [0] * 28, float)
    se = stats.mean_standard_error(cond - base)
    assert se == pytest.approx(math.sqrt(12 / 60 - (6 / 60) ** 2) / math.sqrt(60), rel=1e-12)
    assert se == pytest.approx(np.std(cond - base) / np.sqrt(60), rel=1e-12)
    assert stats.minimum_detectable_effect(se) == pytest.approx(2.8015852181129683 * 0.05627314338711377, rel=1e-9)
    # the bootstrap standard error (std of the replicates) estimates the plug-in SE
    res = stats.paired_difference_ci(cond, base, n_resamples=8000, seed=1)
    assert res.se == pytest.approx(se, rel=0.05)
    with pytest.raises(ValueError):
        stats.minimum_detectable_effect(-1.0)
    with pytest.raises(ValueError):
        stats.mde_multiplier(power=1.0)


def test_bad_inputs():
    with pytest.raises(ValueError):
        stats.bootstrap_mean_ci([])
    with pytest.raises(ValueError):
        stats.bootstrap_mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError):
        stats.bootstrap_mean_ci([1.0], n_resamples=0)
    with pytest.raises(ValueError):
        stats.bootstrap_mean_ci([1.0], confidence=1.0)
    with pytest.raises(ValueError):
        stats.paired_difference_ci([1, 0], [1, 0, 1])
    with pytest.raises(ValueError):
        stats.interaction_ci([1], [1], [1], [1, 0])
    with pytest.raises(ValueError):
        stats.two_level_bootstrap_ci([np.ones((2, 3)), np.ones((2, 4))], [1, -1])
    with pytest.raises(ValueError):
        stats.two_level_bootstrap_ci([np.ones((2, 3))], [1, -1])


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 1 - 3/10 = 0.7
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)=21, C(10,5)=252
        (4, 0, 4, 0.0),  # n = k, c = 0
        (4, 1, 4, 1.0),  # n = k, any success
        (6, 6, 3, 1.0),  # c = n
        (6, 0, 3, 0.0),  # c = 0
        (1, 1, 1, 1.0),
        (200, 7, 10, 1 - math.comb(193, 10) / math.comb(200, 10)),
    ],
)
def test_pass_at_k_closed_form(n, c, k, expected):
    assert stats.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert stats.pass_at_k(n, c, k) == pytest.approx(1.0 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_1_is_fraction_correct():
    for n in range(1, 9):
        for c in range(n + 1):
            assert stats.pass_at_k(n, c, 1) == pytest.approx(c / n)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (5, 2.5, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        stats.pass_at_k(n, c, k)
