"""Names of the training metrics: every key of a GRPO ``metrics.jsonl`` record and the figure groups.

The one home of the contract between the code that writes step records (the GRPO trainer,
:mod:`minimind_trl.objectives`, the MoE router recorder :mod:`minimind_trl.trainer.moe`) and the
code that reads them (:mod:`minimind_trl.eval.plots`, tests, docs/recipes.md). Ground floor: it
imports nothing from the package. Not to be confused with :mod:`minimind_trl.eval.metrics`, which
*computes* evaluation metrics.

A key is either a constant below or built by a function (``reward/<func>_mean``,
``moe/layer<i>/imbalance``); :func:`is_record_key` says whether a key is one of them. Each
training figure of :func:`minimind_trl.eval.plots.plot_runs` is a :class:`FigureGroup` of
:data:`TRAINING_FIGURES`: a PNG stem, a title and the pattern of the keys it draws.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# ------------------------------------------------------------------ position of a record

STEP = "step"
ROLLOUT = "rollout"
UPDATE = "update"  # k = 0..K-1: the replay update within its rollout (K = passes x minibatches)
REPLAY_PASS = "replay_pass"  # e = k // M: the pass over the rollout (0..E-1)
REPLAY_MINIBATCH = "replay_minibatch"  # m = k % M: the minibatch of the rollout (0..M-1)
EPOCH = "epoch"  # written by TRL's logs (SFT/DPO histories), never by the GRPO recorder
LEARNING_RATE = "learning_rate"
LR = "lr"  # other loggers' name for the learning rate (plots draw both)

INDEX_KEYS = frozenset({STEP, ROLLOUT, UPDATE, REPLAY_PASS, REPLAY_MINIBATCH, EPOCH})
"""Keys that locate a record; plots never draw them as curves."""

# ------------------------------------------------------------------ the update (per optimizer step)

LOSS = "loss"
POLICY_LOSS = "policy_loss"
KL = "kl"
GRAD_NORM = "grad_norm"
ENTROPY = "entropy"
NUM_ACTION_TOKENS = "num_action_tokens"
NUM_VALID_ROWS = "num_valid_rows"  # per micro-batch only (objectives' metrics), not in the record
AUX_LOSS = "aux_loss"  # MoE load-balancing loss, unweighted (row-weighted mean over micro-batches)
RATIO_MIN = "ratio_min"
RATIO_MEAN = "ratio_mean"
RATIO_MAX = "ratio_max"
MAX_ABS_LOG_RATIO = "max_abs_log_ratio"
KL_OLD = "kl_old"  # KL(pi_old || pi) over action tokens (k3 token mean): how far the update moved the policy
KL_NEW_OLD = "kl_new_old"  # KL(pi || pi_old) on the rollout's tokens: mean of r log r - r + 1
RATIO_STD = "ratio_std"  # standard deviation of the token ratio r over action tokens
RATIO_ESS = "ratio_ess"  # normalised effective sample size of the token weights r: (sum r)^2 / (n sum r^2)
SEQ_RATIO_MIN = "seq_ratio_min"  # sequence ratio s = exp(mean_t log r_t) over rows with action tokens
SEQ_RATIO_MEAN = "seq_ratio_mean"
SEQ_RATIO_MAX = "seq_ratio_max"
SEQ_RATIO_STD = "seq_ratio_std"
SEQ_RATIO_ESS = "seq_ratio_ess"  # (sum s)^2 / (rows sum s^2)
RATIO_SQ_MEAN = "ratio_sq_mean"  # mean r^2 (tokens), SEQ_RATIO_SQ_MEAN mean s^2 (rows): the exact step-wide
SEQ_RATIO_SQ_MEAN = "seq_ratio_sq_mean"  # std and ESS come from them; the trainer does not write them
MOMENT_KEYS = {RATIO_SQ_MEAN: (RATIO_MEAN, RATIO_STD, RATIO_ESS),
               SEQ_RATIO_SQ_MEAN: (SEQ_RATIO_MEAN, SEQ_RATIO_STD, SEQ_RATIO_ESS)}
"""second-moment key -> (its mean key, the std key and the ESS key derived from the two)."""
CLIP_FRACTION = "clip_fraction"
CLIP_FRACTION_LOW = "clip_fraction_low"
CLIP_FRACTION_HIGH = "clip_fraction_high"

MIN_SUFFIX = "_min"
MAX_SUFFIX = "_max"
"""An objective metric named ``*_min`` (``*_max``) is reduced over micro-batches and processes as a
minimum (maximum), like :data:`MAX_ABS_LOG_RATIO`; every other one as a weighted mean."""

NONFINITE_LOSS = "nonfinite_loss"
"""Step-accumulator flag (max over micro-batches and processes) the trainer pops before writing."""

# Objective-specific metrics (minimind_trl.objectives' built-in policies).
CISPO_TRUNCATION_FRACTION = "cispo_truncation_fraction"  # share of action tokens whose weight hit the cap
CISPO_WEIGHT_MAX = "cispo_weight_max"  # the largest importance weight min(r, cispo_max)
GSPO_SEQ_CLIP_FRACTION = "gspo_seq_clip_fraction"
GSPO_SEQ_CLIP_FRACTION_LOW = "gspo_seq_clip_fraction_low"
GSPO_SEQ_CLIP_FRACTION_HIGH = "gspo_seq_clip_fraction_high"

ROW_WEIGHTED_PREFIXES = ("seq_ratio", "gspo_seq")
"""Objective metrics that are per-sequence statistics: averaged over micro-batches weighted by
their valid rows (every other mean is weighted by action tokens)."""

OBJECTIVE_KEYS = (
    LOSS, POLICY_LOSS, KL, RATIO_MIN, RATIO_MEAN, RATIO_MAX, MAX_ABS_LOG_RATIO, KL_OLD,
    CLIP_FRACTION_LOW, CLIP_FRACTION_HIGH, CLIP_FRACTION, NUM_ACTION_TOKENS, NUM_VALID_ROWS,
    RATIO_STD, RATIO_ESS, RATIO_SQ_MEAN, KL_NEW_OLD,
    SEQ_RATIO_MIN, SEQ_RATIO_MEAN, SEQ_RATIO_MAX, SEQ_RATIO_STD, SEQ_RATIO_ESS, SEQ_RATIO_SQ_MEAN,
)
"""Metrics :func:`minimind_trl.objectives.compute_policy_loss` returns for every policy, in order."""

POLICY_METRIC_KEYS = (
    CISPO_TRUNCATION_FRACTION, CISPO_WEIGHT_MAX,
    GSPO_SEQ_CLIP_FRACTION_LOW, GSPO_SEQ_CLIP_FRACTION_HIGH, GSPO_SEQ_CLIP_FRACTION,
)
"""Extra metrics of the built-in policies (``cispo``, ``gspo``)."""

# ------------------------------------------------------------------ the rollout the step trained on

REWARD_MEAN = "reward_mean"
REWARD_STD = "reward_std"
REWARD_MIN = "reward_min"  # drawn when present (other loggers); the GRPO recorder does not write it
REWARD_MAX = "reward_max"
ZERO_STD_GROUP_FRACTION = "zero_std_group_fraction"
COMPLETION_TOKENS_MEAN = "completion_tokens_mean"
COMPLETION_TOKENS_MAX = "completion_tokens_max"
ACTION_TOKENS_MEAN = "action_tokens_mean"
TRUNCATION_RATE = "truncation_rate"
TOOL_CALLS_PER_TRAJECTORY = "tool_calls_per_trajectory"
TOOL_VALID_PER_TRAJECTORY = "tool_valid_per_trajectory"
TOOL_FAILURES_PER_TRAJECTORY = "tool_failures_per_trajectory"
TOOL_MALFORMED_PER_TRAJECTORY = "tool_malformed_per_trajectory"
ROLLOUT_VALID_ROWS = "rollout_valid_rows"
ROLLOUT_ACTION_TOKENS = "rollout_action_tokens"
ROLLOUT_GENERATED_TOKENS = "rollout_generated_tokens"

# On-policy check: the engine's sampling log-probs against the replay's old log-probs, over the
# rollout's action tokens (update 0 of the rollout measures them; later records repeat them).
ON_POLICY_PREFIX = "onpolicy/"
ONPOLICY_LOGP_ABS_DIFF_MEAN = "onpolicy/logp_abs_diff_mean"
ONPOLICY_LOGP_ABS_DIFF_MAX = "onpolicy/logp_abs_diff_max"
ONPOLICY_KL = "onpolicy/kl"  # KL(sampling || replay), k3 estimator per token, mean over tokens
ON_POLICY_KEYS = (ONPOLICY_LOGP_ABS_DIFF_MEAN, ONPOLICY_LOGP_ABS_DIFF_MAX, ONPOLICY_KL)
"""None in the record when the rollout carried no sampling log-probs (a ``rollout_func`` without them)."""

REWARD_FUNC_PREFIX = "reward/"


def reward_func_mean_key(func_name: str) -> str:
    """``reward/<func_name>_mean``: one reward function's mean over the rollout."""
    return f"{REWARD_FUNC_PREFIX}{func_name}_mean"


def reward_func_std_key(func_name: str) -> str:
    """``reward/<func_name>_std``: one reward function's standard deviation over the rollout."""
    return f"{REWARD_FUNC_PREFIX}{func_name}_std"


# ------------------------------------------------------------------ time

ROLLOUT_SECONDS = "rollout_seconds"
OLD_LOGP_SECONDS = "old_logp_seconds"
UPDATE_SECONDS = "update_seconds"
UPDATE_TOKENS_PER_SECOND = "update_tokens_per_second"
GENERATION_TOKENS_PER_SECOND = "generation_tokens_per_second"

TIMING_KEYS = (ROLLOUT_SECONDS, OLD_LOGP_SECONDS, UPDATE_SECONDS)
"""Seconds accumulated between two records (the record then resets them)."""

# ------------------------------------------------------------------ MoE router (minimind_trl.trainer.moe)

MOE_PREFIX = "moe/"
MOE_LOAD = "load"  # list of E floats: share of (token, slot) assignments per expert
MOE_IMBALANCE = "imbalance"  # max load / mean load
MOE_ROUTER_ENTROPY = "router_entropy"
MOE_AUX_LOSS = "aux_loss"
MOE_FLIP_RATE = "flip_rate"
MOE_LAYER_FIGURES = (MOE_LOAD, MOE_IMBALANCE, MOE_ROUTER_ENTROPY, MOE_AUX_LOSS, MOE_FLIP_RATE)
"""Per-layer router figures, in the order a record holds them."""
MOE_MAX_IMBALANCE = MOE_PREFIX + "max_" + MOE_IMBALANCE  # "moe/max_imbalance": over layers
MOE_ALL_FLIP_RATE = MOE_PREFIX + MOE_FLIP_RATE  # "moe/flip_rate": over layers


def moe_layer_key(layer: int, figure: str) -> str:
    """``moe/layer<layer>/<figure>``, ``figure`` one of :data:`MOE_LAYER_FIGURES`."""
    return f"{MOE_PREFIX}layer{layer}/{figure}"


def _moe_layer_regex(figure: str) -> str:
    """Regex (unanchored) of :func:`moe_layer_key` for any layer."""
    return re.escape(MOE_PREFIX) + r"layer\d+/" + re.escape(figure)


ROUTER_COUNT_PREFIX = "moe."
"""Summable router counts of one micro-batch, ``moe.<layer>.<count>[.<expert>]``: step-accumulator
names (summed over micro-batches and processes), turned into the ``moe/`` figures before writing."""
COUNT_TOKENS = "tokens"
COUNT_ENTROPY_SUM = "entropy_sum"
COUNT_ASSIGN = "assign"
COUNT_PROB_SUM = "prob_sum"
COUNT_FLIPS = "flips"
COUNT_FLIP_TOKENS = "flip_tokens"


def router_count_key(layer: int, count: str, expert: int | None = None) -> str:
    """``moe.<layer>.<count>`` or, per expert, ``moe.<layer>.<count>.<expert>``."""
    key = f"{ROUTER_COUNT_PREFIX}{layer}.{count}"
    return key if expert is None else f"{key}.{expert}"


def is_router_count_key(key: str) -> bool:
    return key.startswith(ROUTER_COUNT_PREFIX)


def router_count_layer(key: str) -> int:
    """The layer index of a :func:`router_count_key`."""
    return int(key[len(ROUTER_COUNT_PREFIX):].split(".", 1)[0])


# ------------------------------------------------------------------ the record

GRPO_RECORD_KEYS = (
    # position
    STEP, ROLLOUT, UPDATE, REPLAY_PASS, REPLAY_MINIBATCH, LEARNING_RATE,
    # the update
    LOSS, POLICY_LOSS, KL, GRAD_NORM, ENTROPY, NUM_ACTION_TOKENS,
    RATIO_MIN, RATIO_MEAN, RATIO_MAX, RATIO_STD, RATIO_ESS, MAX_ABS_LOG_RATIO, KL_OLD, KL_NEW_OLD,
    SEQ_RATIO_MIN, SEQ_RATIO_MEAN, SEQ_RATIO_MAX, SEQ_RATIO_STD, SEQ_RATIO_ESS,
    CLIP_FRACTION, CLIP_FRACTION_LOW, CLIP_FRACTION_HIGH,
    # the rollout it trained on
    REWARD_MEAN, REWARD_STD, ZERO_STD_GROUP_FRACTION,
    COMPLETION_TOKENS_MEAN, COMPLETION_TOKENS_MAX, ACTION_TOKENS_MEAN, TRUNCATION_RATE,
    TOOL_CALLS_PER_TRAJECTORY, TOOL_VALID_PER_TRAJECTORY, TOOL_FAILURES_PER_TRAJECTORY,
    TOOL_MALFORMED_PER_TRAJECTORY,
    ROLLOUT_VALID_ROWS, ROLLOUT_ACTION_TOKENS, ROLLOUT_GENERATED_TOKENS,
    *ON_POLICY_KEYS,
    # time
    *TIMING_KEYS, UPDATE_TOKENS_PER_SECOND, GENERATION_TOKENS_PER_SECOND,
)
"""Keys present in every GRPO record (docs/recipes.md describes each); objective-, reward- and
MoE-specific keys come in addition."""

_RECORD_KEY = re.compile(
    "^(?:"
    + "|".join(re.escape(k) for k in (*GRPO_RECORD_KEYS, AUX_LOSS, *POLICY_METRIC_KEYS, MOE_MAX_IMBALANCE,
                                       MOE_ALL_FLIP_RATE))
    + "|" + re.escape(REWARD_FUNC_PREFIX) + r".+_(?:mean|std)"
    + "|" + "|".join(_moe_layer_regex(f) for f in MOE_LAYER_FIGURES)
    + ")$"
)


def is_record_key(key: str) -> bool:
    """Whether ``key`` is a GRPO record key named here (a plugin objective may add its own)."""
    return _RECORD_KEY.match(key) is not None


# ------------------------------------------------------------------ figure groups


@dataclass(frozen=True)
class FigureGroup:
    """One training figure: ``<stem>.png`` draws, as one line each, every key matching ``pattern``."""

    stem: str
    title: str
    pattern: re.Pattern

    def select(self, keys: Iterable[str]) -> list[str]:
        """The keys this figure draws, in the given order."""
        return [k for k in keys if self.pattern.search(k)]


def _any(*keys: str) -> str:
    return "|".join(re.escape(k) for k in keys)


_NOT_ROUTER = f"(?!{re.escape(MOE_PREFIX)})"

POLICY_FIGURES: tuple[FigureGroup, ...] = (
    FigureGroup("reward", "Reward", re.compile(
        rf"^(?:{_any(REWARD_MEAN, REWARD_STD, REWARD_MIN, REWARD_MAX)}|reward)$|^rewards?/")),
    FigureGroup("task_success", "Task success", re.compile(r"^(task_success|success_rate)")),
    FigureGroup("ratio", "Importance ratio", re.compile(rf"^(?:{_any(RATIO_MEAN, RATIO_MIN, RATIO_MAX)})$")),
    FigureGroup("clip_fraction", "Clip fraction", re.compile("^" + re.escape(CLIP_FRACTION))),
    FigureGroup("kl", "KL to reference", re.compile(rf"^{re.escape(KL)}(?!{re.escape(KL_OLD[len(KL):])}$)(_.*)?$")),
    FigureGroup("step_size", "Policy change: KL(old || new) per update, sampling vs replay gap",
                re.compile(rf"^{re.escape(KL_OLD)}$|^{re.escape(ON_POLICY_PREFIX)}")),
    FigureGroup("grad_norm", "Gradient norm", re.compile(rf"^{re.escape(GRAD_NORM)}$")),
    FigureGroup("loss", "Loss", re.compile(rf"^{re.escape(LOSS)}$|^{_NOT_ROUTER}(?!{re.escape(AUX_LOSS)}$).*_loss$")),
    FigureGroup("entropy", "Entropy", re.compile(rf"^{_NOT_ROUTER}.*{re.escape(ENTROPY)}")),
    FigureGroup("completion_length", "Response length (tokens)", re.compile(r"length")),
    FigureGroup("tool_calls", "Tool calls", re.compile(r"^tool_")),
)
"""Figures of the policy and its rollouts; none of them draws a ``moe/`` key."""

ROUTER_FIGURES: tuple[FigureGroup, ...] = (
    FigureGroup("aux_loss", "MoE aux loss (unweighted)",
                re.compile(rf"^{re.escape(AUX_LOSS)}$|^{_moe_layer_regex(MOE_AUX_LOSS)}$")),
    FigureGroup("router_load", "MoE router load imbalance (max / mean load)",
                re.compile(rf"^{_moe_layer_regex(MOE_IMBALANCE)}$|^{re.escape(MOE_MAX_IMBALANCE)}$")),
    FigureGroup("router_entropy", "MoE router entropy (nats)",
                re.compile(rf"^{_moe_layer_regex(MOE_ROUTER_ENTROPY)}$")),
    FigureGroup("router_flip", "MoE routing flip rate (old pass vs update)",
                re.compile(rf"^{_moe_layer_regex(MOE_FLIP_RATE)}$|^{re.escape(MOE_ALL_FLIP_RATE)}$")),
)
"""Figures of the MoE router (:mod:`minimind_trl.trainer.moe`'s keys and the model's aux loss)."""

LEARNING_RATE_FIGURE = FigureGroup("learning_rate", "Learning rate", re.compile(rf"^(?:{_any(LR, LEARNING_RATE)})$"))

TRAINING_FIGURES: tuple[FigureGroup, ...] = (*POLICY_FIGURES, *ROUTER_FIGURES, LEARNING_RATE_FIGURE)
"""Every per-step figure of :func:`minimind_trl.eval.plots.plot_runs`, in drawing order."""

BY_UPDATE_PATTERN = re.compile(rf"^(?:{_any(RATIO_MEAN, RATIO_MIN, RATIO_MAX)})$|^{re.escape(CLIP_FRACTION)}")
"""Keys of ``by_update.png`` (mean per replay update index): ratio keys left, clip fractions right."""
BY_UPDATE_RATIO_PREFIX = "ratio"  # keys drawn on the left panel of by_update.png

REPLAY_FIGURE_KEYS = (
    CLIP_FRACTION_LOW, CLIP_FRACTION_HIGH, GSPO_SEQ_CLIP_FRACTION, CISPO_TRUNCATION_FRACTION, CISPO_WEIGHT_MAX,
    RATIO_STD, RATIO_ESS, SEQ_RATIO_STD, KL_NEW_OLD, ENTROPY,
)
"""Panels of ``replay.png``: each key against the rollout index, one line per replay update k
(drawn for runs with K > 1); and of ``conditions_by_update.png``: each key against k, one line per
condition (runs named ``<condition>-seed<S>``). Length and tool calls are the rollout's (the same for every k): see
``completion_length.png`` and ``tool_calls.png``."""

CONDITION_FIGURE_KEYS = (
    REWARD_MEAN, TOOL_CALLS_PER_TRAJECTORY, COMPLETION_TOKENS_MEAN, ENTROPY, KL_NEW_OLD, CLIP_FRACTION,
)
"""Panels of ``conditions.png``: per rollout (the mean of its K update records), the mean over a
condition's seeds with their min-max band, one line per condition (runs named ``<condition>-seed<S>``)."""
SEED_SUFFIX = re.compile(r"^(?P<condition>.+)-seed(?P<seed>-?\d+)$")
"""A run folder's name as the sweep and the demo give it: ``<condition>-seed<S>``."""
