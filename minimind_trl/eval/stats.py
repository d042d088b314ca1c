"""Statistics for frozen evaluation: paired bootstrap CIs, the 2x2 interaction, a two-level
(seeds, then questions) bootstrap, and the unbiased pass@k estimator.

Every confidence interval here is a **percentile bootstrap** over per-question values:

* Question-level (paired) bootstrap of a per-question vector ``v`` (length n)::

      rng = np.random.default_rng(seed)
      idx = rng.integers(0, n, size=(B, n))          # drawn in row blocks, same stream
      boot = v[idx].mean(axis=1)                      # B resampled means
      ci = np.percentile(boot, [100 * a / 2, 100 * (1 - a / 2)])   # a = 1 - confidence

  The estimate is ``v.mean()``. A difference "condition minus baseline" uses
  ``v = x - y`` (the same questions are resampled for both, hence *paired*); the 2x2
  interaction uses ``v = (D - C) - (B - A)``.

* Two-level bootstrap of a linear contrast ``sum_c w_c * mean(X_c)`` where cell ``c`` holds a
  (S_c seeds x n questions) matrix. With ``rng = np.random.default_rng(seed)`` it draws, in
  this order, ``seed_idx_c = rng.integers(0, S_c, size=(B, S_c))`` for each cell, then
  ``q_idx = rng.integers(0, n, size=(B, n))`` (row blocks, same stream). Replicate ``b`` is
  ``sum_c w_c * mean_{s in seed_idx_c[b]} mean_{q in q_idx[b]} X_c[s, q]``: seeds are resampled
  independently per cell (training seeds are independent runs), questions are shared across
  cells (the test set is common). Percentile CI as above.

* **Seed-matched** two-level bootstrap (``matched_seeds=True``): every cell holds the same S seeds
  in the same row order, and one draw ``seed_idx = rng.integers(0, S, size=(B, S))`` serves every
  cell (then ``q_idx`` as above): replicate ``b`` is
  ``sum_c w_c * mean_{s in seed_idx[b]} mean_{q in q_idx[b]} X_c[s, q]``. It resamples the seed as a
  block, the right scheme when a seed fixes the same randomness in every cell (common random numbers:
  a sweep's seed s gives every condition the same prompt order and sampling stream, so their first
  rollout is the same trajectories). Then the per-seed contrast's spread, not each cell's, is the
  seed-level noise; where cells' seeds are positively correlated the independent scheme is
  conservative. With uncorrelated cells both estimate the same variance.

  Either way the seed level is a bootstrap over S values: its variance is (S - 1)/S of the usual
  unbiased estimate (2/3 at S = 3) and it sees only the S values drawn, so a CI that rests on the
  seed level of three seeds is narrower than a t interval would be; claims that rest on it want
  more seeds.

Defaults: ``B = 10_000`` resamples, ``seed = 0``, 95 % confidence. Every result also carries
``se``, the standard deviation of its B replicates (``boot.std(ddof=1)``): the bootstrap standard
error.

**Resolution (power).** The smallest true difference a comparison detects with probability
``power`` in a two-sided test at level ``alpha`` (its CI then excludes 0), the minimum detectable
effect, is::

    MDE = (z_{1 - alpha/2} + z_{power}) * SE          # alpha = 0.05, power = 0.8: 2.8016 * SE

with ``z_p`` the standard normal quantile (:func:`minimum_detectable_effect`). For the paired
question-level comparison SE is the plug-in standard error of the mean per-question difference,
``SE = std_0(x - y) / sqrt(n)`` (``std_0`` divides by n: the value the question bootstrap's
standard error converges to; :func:`mean_standard_error`). For a binary metric with b questions
only the baseline solves and c only the condition solves, ``d = x - y`` is +1 on c questions,
-1 on b and 0 elsewhere, so ``SE = sqrt((b + c)/n - ((c - b)/n)^2) / sqrt(n)``. For a two-level
comparison SE is the two-level bootstrap's ``se``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
DEFAULT_POWER = 0.8
MAX_RESAMPLES = 1_000_000
"""More resamples than this change no reported digit and would run for hours: refused."""
# Rows of the (B, n) index matrix drawn at once; bounds memory at about 8 * block * n bytes.
_BLOCK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class BootstrapResult:
    """A point estimate with its percentile-bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    n_resamples: int
    seed: int
    confidence: float
    method: str
    se: float | None = None  # standard deviation of the bootstrap replicates

    def to_dict(self) -> dict:
        return asdict(self)


def check_settings(n_resamples: int, confidence: float) -> None:
    """``n_resamples`` in [1, :data:`MAX_RESAMPLES`] and ``confidence`` in (0, 1), else ValueError."""
    if int(n_resamples) != n_resamples or not 1 <= n_resamples <= MAX_RESAMPLES:
        raise ValueError(f"n_resamples must be an integer in [1, {MAX_RESAMPLES:,}], got {n_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")


def _as_vector(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _percentile_interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.percentile(boot, [100.0 * alpha / 2.0, 100.0 * (1.0 - alpha / 2.0)])
    return float(low), float(high)


def _replicate_se(boot: np.ndarray) -> float:
    return float(boot.std(ddof=1)) if boot.size > 1 else 0.0


def _index_blocks(rng: np.random.Generator, n: int, n_resamples: int) -> Iterator[np.ndarray]:
    """Yield ``rng.integers(0, n, size=(B, n))`` in row blocks (identical stream to one call)."""
    block = max(1, min(n_resamples, _BLOCK_BYTES // (8 * n)))
    done = 0
    while done < n_resamples:
        rows = min(block, n_resamples - done)
        yield rng.integers(0, n, size=(rows, n))
        done += rows


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> BootstrapResult:
    """Percentile-bootstrap CI of ``mean(values)``, resampling the n entries with replacement."""
    check_settings(n_resamples, confidence)
    v = _as_vector(values)
    rng = np.random.default_rng(seed)
    boot = np.concatenate([v[idx].mean(axis=1) for idx in _index_blocks(rng, v.size, n_resamples)])
    low, high = _percentile_interval(boot, confidence)
    return BootstrapResult(float(v.mean()), low, high, int(n_resamples), int(seed), confidence,
                           "percentile bootstrap over questions", _replicate_se(boot))


def paired_difference_ci(
    condition: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> BootstrapResult:
    """Paired bootstrap CI of ``mean(condition) - mean(baseline)`` over aligned questions."""
    x = _as_vector(condition, "condition")
    y = _as_vector(baseline, "baseline")
    if x.shape != y.shape:
        raise ValueError(f"paired vectors differ in length: {x.size} vs {y.size}")
    return bootstrap_mean_ci(x - y, n_resamples, seed, confidence)


def interaction_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    c: Sequence[float] | np.ndarray,
    d: Sequence[float] | np.ndarray,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> BootstrapResult:
    """2x2 interaction ``(D - C) - (B - A)`` on aligned per-question values, paired bootstrap.

    With the Dr.GRPO cells A = z-score/sequence-mean, B = z-score/fixed-L,
    C = centred/sequence-mean, D = centred/fixed-L, it is the extra effect of the fixed-L
    reduction when advantages are only centred, relative to when they are z-scored.
    """
    cells = [_as_vector(x, name) for x, name in zip((a, b, c, d), "ABCD")]
    if len({x.size for x in cells}) != 1:
        raise ValueError(f"interaction cells differ in length: {[x.size for x in cells]}")
    va, vb, vc, vd = cells
    return bootstrap_mean_ci((vd - vc) - (vb - va), n_resamples, seed, confidence)


def two_level_bootstrap_ci(
    cells: Sequence[np.ndarray],
    weights: Sequence[float],
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
    matched_seeds: bool = False,
) -> BootstrapResult:
    """Two-level bootstrap CI of the contrast ``sum_c w_c * mean(X_c)``.

    ``cells[c]`` is an (S_c, n) array: one row per training seed, one column per question (same
    question order in every cell). See the module docstring for the exact resampling scheme.
    The estimate is ``sum_c w_c * X_c.mean()``. ``matched_seeds``: row s of every cell is the same
    training seed (all S_c equal), resampled jointly across cells (the seed-matched scheme).
    """
    check_settings(n_resamples, confidence)
    mats = [np.asarray(x, dtype=np.float64) for x in cells]
    w = np.asarray(weights, dtype=np.float64)
    if not mats or len(mats) != w.size:
        raise ValueError(f"need one weight per cell, got {len(mats)} cells and {w.size} weights")
    for m in mats:
        if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
            raise ValueError(f"each cell must be a non-empty (seeds, questions) array, got {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError("a cell contains NaN or infinite values")
    n = mats[0].shape[1]
    if any(m.shape[1] != n for m in mats):
        raise ValueError(f"cells differ in number of questions: {[m.shape[1] for m in mats]}")

    if matched_seeds and len({m.shape[0] for m in mats}) != 1:
        raise ValueError(f"matched seeds need the same seeds in every cell, got {[m.shape[0] for m in mats]} seeds")

    rng = np.random.default_rng(seed)

    def draw_seed_weights(s: int) -> np.ndarray:
        # Seed resampling as weights: (B, S) counts / S, so the seed-averaged question vector of
        # replicate b is counts_b @ X_c / S.
        idx = rng.integers(0, s, size=(n_resamples, s))
        counts = np.zeros((n_resamples, s))
        np.add.at(counts, (np.arange(n_resamples)[:, None], idx), 1.0)
        return counts / s

    if matched_seeds:
        seed_weights = [draw_seed_weights(mats[0].shape[0])] * len(mats)  # one draw shared by every cell
    else:
        seed_weights = [draw_seed_weights(m.shape[0]) for m in mats]
    boot = np.empty(n_resamples)
    start = 0
    for q_idx in _index_blocks(rng, n, n_resamples):
        rows = slice(start, start + q_idx.shape[0])
        per_question = sum(wc * (sw[rows] @ m) for wc, sw, m in zip(w, seed_weights, mats))
        boot[rows] = np.take_along_axis(per_question, q_idx, axis=1).mean(axis=1)
        start += q_idx.shape[0]
    estimate = float(sum(wc * m.mean() for wc, m in zip(w, mats)))
    low, high = _percentile_interval(boot, confidence)
    method = ("two-level percentile bootstrap (matched seeds shared by every cell, then shared questions)"
              if matched_seeds else "two-level percentile bootstrap (seeds per cell, then shared questions)")
    return BootstrapResult(estimate, low, high, int(n_resamples), int(seed), confidence, method,
                           _replicate_se(boot))


def mean_standard_error(values: Sequence[float] | np.ndarray) -> float:
    """Plug-in standard error of ``mean(values)``: ``std_0(values) / sqrt(n)`` (``std_0`` divides by n).

    It is the standard error the question bootstrap of :func:`bootstrap_mean_ci` estimates; for a
    paired difference pass ``x - y``.
    """
    v = _as_vector(values)
    return float(v.std(ddof=0) / math.sqrt(v.size))


def mde_multiplier(power: float = DEFAULT_POWER, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """``z_{1 - alpha/2} + z_{power}`` with ``alpha = 1 - confidence`` (2.8016 for 80 % power, alpha 0.05)."""
    check_settings(1, confidence)
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie strictly between 0 and 1, got {power!r}")
    z = NormalDist().inv_cdf
    return z(1.0 - (1.0 - confidence) / 2.0) + z(power)


def minimum_detectable_effect(se: float, power: float = DEFAULT_POWER,
                              confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Smallest true difference detected with probability ``power`` by a two-sided test at level
    ``alpha = 1 - confidence``: ``MDE = (z_{1 - alpha/2} + z_{power}) * se`` (module docstring)."""
    if not math.isfinite(se) or se < 0:
        raise ValueError(f"se must be a finite non-negative number, got {se!r}")
    return mde_multiplier(power, confidence) * float(se)


DEFAULT_ASSUMED_DISCORDANCE = 0.08
"""Share of questions on which two binary-scored runs disagree when one policy has moved: the
full CPU demo's RL runs against their SFT start disagreed on 0.067 to 0.100 of 600 test
questions (docs/demo_results.md). The floor of the resolution below."""


def discordance_floor_se(n: int, discordance: float = DEFAULT_ASSUMED_DISCORDANCE) -> float:
    """The standard error of a paired difference of binary per-question values when a share
    ``discordance`` of the n questions disagree in equal numbers each way (b = c = d n / 2):
    ``SE = sqrt(d / n)`` (the module docstring's formula with c = b). A resolution computed from an
    observed discordance far below this (two runs that barely differ) says nothing about what the
    design resolves for a policy that moves; it is floored at this value."""
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"discordance must lie in [0, 1], got {discordance!r}")
    return math.sqrt(discordance / n) if n > 0 else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: ``1 - C(n-c, k) / C(n, k)``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (numerically stable); equals 1 when
    ``n - c < k``.
    """
    for name, val in (("n", n), ("c", c), ("k", k)):
        if int(val) != val:
            raise ValueError(f"{name} must be an integer, got {val!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))
