"""Policy objectives for group-relative RL: advantages, per-token / per-sequence losses, reductions.

Pure tensor code: nothing here knows about the trainer, the model or TRL. The trainer hands over
per-token log-probabilities and masks; this module returns a differentiable scalar and a dict of
diagnostics. See ``docs/objectives.md`` for the formulas in prose and how they differ from TRL's
built-in ``loss_type`` values.

Notation (shapes in brackets)::

    logp    [B, T]  log pi_theta(o_t | q, o_<t) of the current policy (carries the gradient)
    old     [B, T]  log pi_old of the policy that generated the rollout (constant)
    ref     [B, T]  log pi_ref of the frozen reference policy (constant, only when beta > 0)
    m       [B, T]  action mask: 1 on tokens the policy produced, 0 on prompt, tool-observation
                    and padding tokens
    A       [B]     one advantage per sequence
    r_t     [B, T]  exp(logp_t - old_t), the per-token importance ratio

Objectives (the ``policy`` of :class:`ObjectiveConfig`, looked up in :data:`POLICY_LOSSES`):

* ``"clip"``  -- GRPO, Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300); with mean-centred
  advantages and a fixed-length reduction it is Dr.GRPO, Liu et al. 2025, "Understanding
  R1-Zero-Like Training: A Critical Perspective" (arXiv:2503.20783).
* ``"cispo"`` -- CISPO, MiniMax 2025, "MiniMax-M1" (arXiv:2506.13585).
* ``"gspo"``  -- GSPO, Zheng et al. 2025 (Qwen), "Group Sequence Policy Optimization"
  (arXiv:2507.18071).

Every token-level loss is reduced by the one helper :func:`reduce_loss`; rows without any action
token never enter an average over rows.

Adding an objective (e.g. from a plugin)::

    from minimind_trl.objectives import ObjectiveConfig, PolicyTerm, log_ratio, register_policy_loss

    @register_policy_loss("clip_upper_only", level="token")
    def clip_upper_only(logps, old_logps, advantages, mask, config):
        # logps/old_logps [B, T] (0 on masked positions), advantages [B], mask [B, T] bool
        ratio = torch.exp(log_ratio(logps, old_logps))  # clamped to +-LOG_RATIO_BOUND
        per_token = -torch.clamp(ratio, max=1 + config.epsilon_high) * advantages[:, None]
        return PolicyTerm(per_token, {})

    config = ObjectiveConfig(policy="clip_upper_only", reduction="seq_mean")

A ``level="token"`` function returns per-token values ``[B, T]`` and works with the reductions
``seq_mean``, ``fixed_length`` and ``token_mean``; a ``level="sequence"`` function returns one value
per row ``[B]`` and requires ``reduction="sequence"``. Extra diagnostics go into the returned
metrics dict as 0-d tensors (they must not carry a gradient; use ``.detach()``); they are converted
to Python floats together with the common metrics. Register before building the
:class:`ObjectiveConfig` that names the objective, since the config checks the name.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from minimind_trl import metric_names as names

__all__ = [
    "ADVANTAGE_MODES",
    "LossOutput",
    "ObjectiveConfig",
    "POLICY_LOSSES",
    "PRESETS",
    "PolicyBatch",
    "PolicyLossSpec",
    "PolicyTerm",
    "REDUCTIONS",
    "RolloutTotals",
    "WeightedLoss",
    "LOG_RATIO_BOUND",
    "ZSCORE_EPS",
    "cispo_policy_loss",
    "clip_policy_loss",
    "compute_advantages",
    "compute_policy_loss",
    "compute_weighted_loss",
    "gspo_policy_loss",
    "k3_kl",
    "kl_token_mean",
    "log_ratio",
    "moment_figures",
    "reduce_loss",
    "register_policy_loss",
]

ZSCORE_EPS = 1e-4
"""Added to the unbiased group standard deviation in the z-score advantage (as TRL does)."""

LOG_RATIO_BOUND = 20.0
"""Every objective clamps the per-token log-ratio ``logp - old`` (and the KL's ``ref - logp``) to
``[-20, 20]`` before ``exp`` (verl's bound), so ``r <= e^20 ~ 4.9e8``: a token with an extreme
log-ratio (an old log-prob of ``-inf``, a log-ratio of 90) gives a finite loss and exactly zero
gradient through the ratio while the clamp is active. Ordinary log-ratios (``|x| <= 20``) are
unchanged bit for bit."""

ADVANTAGE_MODES = ("zscore", "center")
REDUCTIONS = ("seq_mean", "fixed_length", "token_mean", "sequence")
_TOKEN_REDUCTIONS = ("seq_mean", "fixed_length", "token_mean")


# --------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------


def compute_advantages(rewards: torch.Tensor, group_size: int, mode: str) -> torch.Tensor:
    """Group-relative advantages, one per completion.

    Args:
        rewards: ``[N]`` scalar rewards laid out group by group: completions ``0..G-1`` answer the
            first prompt, ``G..2G-1`` the second, and so on. ``N`` must be a multiple of ``G``.
            Integer or bool rewards are converted to the default float dtype. Must be finite.
        group_size: ``G``, completions per prompt (>= 1).
        mode: ``"zscore"`` or ``"center"``.

    Returns:
        ``[N]`` advantages, same device as ``rewards``.

    Formulas, per group ``g`` with rewards ``R_g1..R_gG``::

        zscore (GRPO, Shao et al. 2024, eq. in sec. 4.1.2):
            A_gi = (R_gi - mean_g) / (std_g + 1e-4),  std_g the unbiased (G-1) standard deviation
        center (Dr.GRPO, Liu et al. 2025, sec. 3.2):
            A_gi = R_gi - mean_g

    A group whose rewards are all equal gets exactly 0 (set explicitly, so that rounding in the
    mean cannot leave values like 1e-9 that the z-score would then blow up). A group of size 1
    is such a group: it has no baseline and its unbiased std is undefined, so ``group_size=1``
    gives all-zero advantages in both modes.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape [N], got {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(f"number of rewards {n} is not divisible by group_size {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if n and not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite (no NaN or inf)")
    if group_size == 1 or n == 0:
        return torch.zeros_like(rewards)

    grouped = rewards.detach().view(-1, group_size)  # [N/G, G]
    all_equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # [N/G, 1]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [N/G, G]
    if mode == "zscore":
        std = grouped.std(dim=1, keepdim=True, correction=1)  # unbiased, [N/G, 1]
        advantages = centred / (std + ZSCORE_EPS)
    else:
        advantages = centred
    advantages = torch.where(all_equal, torch.zeros_like(advantages), advantages)
    return advantages.reshape(n)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectiveConfig:
    """Which objective to optimise and how to reduce it. The defaults are the ``"grpo"`` preset.

    Build one directly or with :meth:`preset` (frozen: use ``dataclasses.replace`` to vary one);
    every combination is checked on construction and an invalid one raises ``ValueError``.

    Parameters:
        policy (`str`, defaults to `"clip"`):
            The per-token or per-sequence policy term, a key of :data:`POLICY_LOSSES`.
            `"clip"`: PPO-style clipped surrogate ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)`` per
            token (GRPO, Shao et al. 2024; Dr.GRPO, Liu et al. 2025). `"cispo"`: REINFORCE with a
            truncated, stop-gradient importance weight ``-sg(min(r, cispo_max)) A logp`` per token
            (CISPO, MiniMax-M1 2025). `"gspo"`: clipped surrogate on the sequence ratio
            ``s = exp(mean_t(logp - old))`` per sequence (GSPO, Zheng et al. 2025). Objectives
            registered with :func:`register_policy_loss` are accepted too.
        advantage (`str`, defaults to `"zscore"`):
            How rewards become advantages in :func:`compute_advantages`. `"zscore"`:
            ``(R - group mean) / (unbiased group std + 1e-4)`` (GRPO). `"center"`:
            ``R - group mean`` without std scaling (Dr.GRPO, which shows the std division
            up-weights too-easy and too-hard prompts).
        reduction (`str`, defaults to `"seq_mean"`):
            How per-token (or per-sequence) values become the policy loss; rows with no action
            token are left out of every average over rows. `"seq_mean"`: mean over each row's
            action tokens, then mean over rows (GRPO's ``1/|o_i|``). `"fixed_length"`: sum over
            the row's action tokens divided by the constant `fixed_length`, then mean over rows
            (Dr.GRPO, which removes the length bias of ``1/|o_i|``). `"token_mean"`: sum over all
            action tokens divided by their number (DAPO-style; the CISPO paper's normaliser).
            `"sequence"`: mean over rows of one value per row; required by sequence-level
            objectives such as `"gspo"` and only allowed with them.
        epsilon_low (`float`, defaults to `0.2`):
            Lower clip range: ratios below ``1 - epsilon_low`` are clipped (PPO, Schulman et al.
            2017; GRPO uses 0.2). GSPO's paper uses 3e-4 on the sequence ratio. In ``[0, 1]``.
            For `"cispo"` it only defines the trust region of the clip-fraction diagnostics.
        epsilon_high (`float`, defaults to `0.2`):
            Upper clip range: ratios above ``1 + epsilon_high`` are clipped (DAPO, Yu et al. 2025,
            decouples it from `epsilon_low`; GSPO uses 4e-4). Non-negative. For `"cispo"` it only
            defines the trust region of the clip-fraction diagnostics.
        cispo_max (`float`, defaults to `5.0`):
            Absolute upper cap on CISPO's importance weight, ``min(r, cispo_max)``; the weight is
            never clipped from below. The MiniMax-M1 paper writes the cap as ``1 + eps_high^IS``;
            we state the cap itself. Used only by `"cispo"`; must be positive.
        fixed_length (`int` or `None`, defaults to `None`):
            The constant ``L`` of the `"fixed_length"` reduction (Dr.GRPO divides by the maximum
            generation length; our Dr.GRPO preset uses 768). Required, and positive, when
            ``reduction="fixed_length"``; ignored by other reductions.
        beta (`float`, defaults to `0.0`):
            Weight of the reference KL penalty ``beta * KL`` (GRPO's ``beta D_KL[pi || pi_ref]``
            with the k3 estimator ``e^d - d - 1``, ``d = ref - logp``, Schulman 2020 /
            DeepSeekMath eq. 4), a token mean over all action tokens whatever the reduction.
            0 disables it (no reference log-probs needed). Non-negative.
    """

    policy: str = "clip"
    advantage: str = "zscore"
    reduction: str = "seq_mean"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    cispo_max: float = 5.0
    fixed_length: int | None = None
    beta: float = 0.0

    def __post_init__(self) -> None:
        spec = POLICY_LOSSES.get(self.policy) if isinstance(self.policy, str) else None
        if spec is None:
            raise ValueError(f"unknown policy {self.policy!r}; registered: {sorted(POLICY_LOSSES)}")
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"unknown advantage {self.advantage!r}; expected one of {ADVANTAGE_MODES}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}; expected one of {REDUCTIONS}")
        if spec.level == "sequence" and self.reduction != "sequence":
            raise ValueError(
                f"policy {self.policy!r} gives one value per sequence and needs reduction='sequence', "
                f"got {self.reduction!r}"
            )
        if spec.level == "token" and self.reduction == "sequence":
            raise ValueError(
                f"policy {self.policy!r} gives per-token values; reduction='sequence' is only for "
                f"sequence-level policies (use one of {_TOKEN_REDUCTIONS})"
            )
        for name in ("epsilon_low", "epsilon_high", "cispo_max", "beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.epsilon_low < 0 or self.epsilon_low > 1:
            raise ValueError(f"epsilon_low must be in [0, 1], got {self.epsilon_low}")
        if self.epsilon_high < 0:
            raise ValueError(f"epsilon_high must be >= 0, got {self.epsilon_high}")
        if self.cispo_max <= 0:
            raise ValueError(f"cispo_max must be > 0, got {self.cispo_max}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.fixed_length is not None and (
            isinstance(self.fixed_length, bool) or not isinstance(self.fixed_length, int) or self.fixed_length <= 0
        ):
            raise ValueError(f"fixed_length must be a positive int or None, got {self.fixed_length!r}")
        if self.reduction == "fixed_length" and self.fixed_length is None:
            raise ValueError("reduction='fixed_length' needs a positive fixed_length (L)")

    @classmethod
    def preset(cls, name: str, **overrides) -> "ObjectiveConfig":
        """The named configuration from :data:`PRESETS`, with fields replaced by ``overrides``.

        ``ObjectiveConfig.preset("dr_grpo", advantage="zscore")`` is the z-score x fixed-length
        cell of the 2x2 ablation; ``preset("grpo", advantage="center")`` the centred x seq-mean one.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown ObjectiveConfig field(s) {unknown}; fields are {sorted(names)}")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict] = {
    # GRPO: Shao et al. 2024.
    "grpo": dict(policy="clip", advantage="zscore", reduction="seq_mean", epsilon_low=0.2, epsilon_high=0.2),
    # CISPO: MiniMax-M1 2025; absolute cap 5.0 on the IS weight, our per-sequence mean reduction.
    "cispo": dict(policy="cispo", advantage="zscore", reduction="seq_mean", cispo_max=5.0),
    # Dr.GRPO: Liu et al. 2025; L = 768.
    "dr_grpo": dict(
        policy="clip", advantage="center", reduction="fixed_length", fixed_length=768, epsilon_low=0.2, epsilon_high=0.2
    ),
    # GSPO: Zheng et al. 2025; the paper's clip range on the sequence ratio.
    "gspo": dict(policy="gspo", advantage="zscore", reduction="sequence", epsilon_low=3e-4, epsilon_high=4e-4),
}
"""Field values of each named preset (fields not listed take the dataclass defaults)."""


# --------------------------------------------------------------------------------------------
# Batch and output containers
# --------------------------------------------------------------------------------------------


@dataclass
class PolicyBatch:
    """What one loss computation needs, validated on construction.

    Attributes:
        logps: ``[B, T]`` current-policy log-probs of the taken tokens (the gradient flows here).
        old_logps: ``[B, T]`` rollout-policy log-probs (treated as constants; detached).
        advantages: ``[B]`` one advantage per row.
        mask: ``[B, T]`` action mask, bool or numeric with values in {0, 1}.
        ref_logps: ``[B, T]`` reference log-probs, or ``None`` (needed only when ``beta > 0``).

    Values at masked positions may be anything finite or infinite (padding garbage): they are
    replaced before use and receive exactly zero gradient.
    """

    logps: torch.Tensor
    old_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logps: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("logps", "old_logps", "advantages", "mask"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(getattr(self, name)).__name__}")
        if self.logps.dim() != 2:
            raise ValueError(f"logps must have shape [B, T], got {tuple(self.logps.shape)}")
        shape = self.logps.shape
        for name in ("old_logps", "mask", "ref_logps"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
            if value.shape != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)} like logps")
        if self.advantages.shape != shape[:1]:
            raise ValueError(f"advantages must have shape [B] = {tuple(shape[:1])}, got {tuple(self.advantages.shape)}")
        for name in ("logps", "old_logps", "advantages") + (("ref_logps",) if self.ref_logps is not None else ()):
            if not getattr(self, name).is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {getattr(self, name).dtype}")
        if self.mask.dtype != torch.bool and self.mask.numel():
            if not bool(((self.mask == 0) | (self.mask == 1)).all()):
                raise ValueError("mask values must be 0 or 1")


class PolicyTerm(NamedTuple):
    """What a registered policy-loss function returns.

    values: ``[B, T]`` per-token losses (``level="token"``) or ``[B]`` per-sequence losses
        (``level="sequence"``), to be reduced by :func:`reduce_loss`.
    metrics: extra diagnostics, name -> detached 0-d tensor.
    """

    values: torch.Tensor
    metrics: dict[str, torch.Tensor]


class LossOutput(NamedTuple):
    """Result of :func:`compute_policy_loss`.

    loss: differentiable scalar, ``policy_loss + beta * kl``; the only thing to backpropagate.
    policy_loss: detached scalar, the reduced policy term.
    kl: detached scalar, the k3 reference KL (token mean over action tokens); 0 when not computed.
    metrics: name -> Python float (see :func:`compute_policy_loss`).
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    metrics: dict[str, float]


# --------------------------------------------------------------------------------------------
# Registry of policy terms
# --------------------------------------------------------------------------------------------

PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ObjectiveConfig], PolicyTerm]


@dataclass(frozen=True)
class PolicyLossSpec:
    """A registered objective: its function and whether it yields per-token or per-sequence values."""

    fn: PolicyLossFn
    level: str = field(default="token")


POLICY_LOSSES: dict[str, PolicyLossSpec] = {}
"""Registered objectives, name -> :class:`PolicyLossSpec`. Add entries with :func:`register_policy_loss`."""


def register_policy_loss(name: str, *, level: str = "token", replace: bool = False):
    """Decorator registering ``fn(logps, old_logps, advantages, mask, config) -> PolicyTerm`` as ``name``.

    The function receives ``logps``/``old_logps`` ``[B, T]`` already zeroed on masked positions
    (``old_logps`` detached, both in at least float32), ``advantages`` ``[B]`` and the bool ``mask``
    ``[B, T]``, plus the :class:`ObjectiveConfig`. ``level`` is ``"token"`` (return ``[B, T]``) or
    ``"sequence"`` (return ``[B]``). Registering an existing name raises unless ``replace=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"objective name must be a non-empty string, got {name!r}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if name in POLICY_LOSSES and not replace:
        raise ValueError(f"policy loss {name!r} is already registered (pass replace=True to override)")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = PolicyLossSpec(fn=fn, level=level)
        return fn

    return decorator


# --------------------------------------------------------------------------------------------
# Built-in policy terms
# --------------------------------------------------------------------------------------------


def log_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """``clamp(logp - old, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)``, the log-ratio every objective exponentiates.

    Where the clamp is active the result is a constant, so those tokens get exactly zero gradient
    through the ratio (an old log-prob of ``-inf`` gives ``+20``, never ``inf`` or ``NaN``).
    """
    return torch.clamp(logps - old_logps, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@register_policy_loss("clip", level="token")
def clip_policy_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: ObjectiveConfig
) -> PolicyTerm:
    """Clipped surrogate per token (GRPO, Shao et al. 2024; Dr.GRPO, Liu et al. 2025).

    GRPO maximises ``1/G sum_i 1/|o_i| sum_t min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i)``;
    the ``1/|o_i|`` and ``1/G`` are the reduction's business, so per token::

        r_t  = exp(clamp(logp_t - old_t, -20, 20))                          [B, T]
        l_t  = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)           [B, T]

    Args: logps, old_logps, mask ``[B, T]``; advantages ``[B]``. Returns per-token values ``[B, T]``.
    """
    adv = advantages.unsqueeze(1)  # [B, 1]
    ratio = torch.exp(log_ratio(logps, old_logps))  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    return PolicyTerm(per_token, {})


@register_policy_loss("cispo", level="token")
def cispo_policy_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: ObjectiveConfig
) -> PolicyTerm:
    """REINFORCE with a truncated stop-gradient IS weight per token (CISPO, MiniMax-M1 2025).

    MiniMax-M1 maximises ``sum_i sum_t sg(r_hat_it) A_i log pi(o_it)`` with the weight truncated
    from above, so every token keeps a gradient (unlike the clip, which zeroes it)::

        w_t = sg(min(exp(clamp(logp_t - old_t, -20, 20)), cispo_max))       [B, T]
        l_t = -w_t A logp_t                                                  [B, T]
        d l_t / d logp_t = -w_t A

    The weight carries no gradient anyway, so the log-ratio clamp only keeps it finite (an old
    log-prob of ``-inf`` gives the weight ``cispo_max``). Diagnostics: ``cispo_truncation_fraction``,
    the share of action tokens with ``r_t > cispo_max`` (their weight sits at the cap), and
    ``cispo_weight_max``, the largest weight ``max_t w_t`` (1 with no action token).
    Args: logps, old_logps, mask ``[B, T]``; advantages ``[B]``. Returns per-token values ``[B, T]``.
    """
    ratio = torch.exp(log_ratio(logps.detach(), old_logps))  # [B, T], no gradient
    weight = torch.clamp(ratio, max=config.cispo_max)
    per_token = -weight * advantages.unsqueeze(1) * logps
    truncated = (ratio > config.cispo_max) & mask
    metrics = {names.CISPO_TRUNCATION_FRACTION: _fraction(truncated, mask),
               names.CISPO_WEIGHT_MAX: _masked_max(weight, mask, default=1.0)}
    return PolicyTerm(per_token, metrics)


@register_policy_loss("gspo", level="sequence")
def gspo_policy_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: ObjectiveConfig
) -> PolicyTerm:
    """Clipped surrogate on the length-normalised sequence ratio (GSPO, Zheng et al. 2025).

    GSPO maximises ``1/G sum_i min(s_i A_i, clip(s_i, 1-eps, 1+eps) A_i)`` with
    ``s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|)``::

        s   = exp( sum_t m_t clamp(logp_t - old_t, -20, 20) / sum_t m_t )   [B]
        l   = -min(s A, clip(s, 1 - eps_low, 1 + eps_high) A)                [B]

    The gradient flows through ``s`` into every action token's ``logp`` (sequence-level
    weighting, not a per-token ratio). A row without action tokens gets ``s = 1``; the
    ``"sequence"`` reduction leaves it out. Diagnostics over rows with action tokens: the
    sign-aware ``gspo_seq_clip_fraction[_low|_high]`` (the sequence ratio's statistics,
    ``seq_ratio_*``, are common to every policy: :func:`compute_policy_loss`).
    Args: logps, old_logps, mask ``[B, T]``; advantages ``[B]``. Returns per-sequence values ``[B]``.
    """
    counts = mask.sum(dim=1)  # [B]
    valid = counts > 0
    token_log_ratio = torch.where(mask, log_ratio(logps, old_logps), torch.zeros_like(logps))  # [B, T]
    seq_log_ratio = token_log_ratio.sum(dim=1) / counts.clamp(min=1)  # [B]
    seq_ratio = torch.exp(seq_log_ratio)  # [B]
    clipped = torch.clamp(seq_ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    per_seq = -torch.minimum(seq_ratio * advantages, clipped * advantages)

    s = seq_ratio.detach()
    low = (s < 1.0 - config.epsilon_low) & (advantages < 0) & valid
    high = (s > 1.0 + config.epsilon_high) & (advantages > 0) & valid
    metrics = {
        names.GSPO_SEQ_CLIP_FRACTION_LOW: _fraction(low, valid),
        names.GSPO_SEQ_CLIP_FRACTION_HIGH: _fraction(high, valid),
        names.GSPO_SEQ_CLIP_FRACTION: _fraction(low | high, valid),
    }
    return PolicyTerm(per_seq, metrics)


# --------------------------------------------------------------------------------------------
# Reduction and KL
# --------------------------------------------------------------------------------------------


def reduce_loss(
    values: torch.Tensor, mask: torch.Tensor, reduction: str, fixed_length: int | None = None
) -> torch.Tensor:
    """The one reduction helper: per-token ``[B, T]`` or per-sequence ``[B]`` values -> scalar.

    ``n_b = sum_t m_bt`` action tokens in row b; valid rows V = {b : n_b > 0}::

        seq_mean      1/|V| sum_{b in V} (1/n_b) sum_t m_bt v_bt      values [B, T]   (GRPO)
        fixed_length  1/|V| sum_{b in V} (1/L)   sum_t m_bt v_bt      values [B, T]   (Dr.GRPO)
        token_mean    sum_bt m_bt v_bt / sum_bt m_bt                  values [B, T]
        sequence      1/|V| sum_{b in V} v_b                          values [B]      (GSPO)

    Masked entries are selected away (``torch.where``), so garbage there never reaches the result
    and gets exactly zero gradient. With no action token at all the result is an exact 0 that
    stays connected to ``values``' graph, so ``backward()`` still works.
    """
    m = mask.bool()
    counts = m.sum(dim=1)  # [B]
    valid = counts > 0  # [B]
    num_valid = valid.sum().clamp(min=1)
    if reduction == "sequence":
        if values.shape != counts.shape:
            raise ValueError(f"reduction 'sequence' needs values of shape [B], got {tuple(values.shape)}")
        return torch.where(valid, values, torch.zeros_like(values)).sum() / num_valid
    if reduction not in _TOKEN_REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if values.shape != m.shape:
        raise ValueError(f"reduction {reduction!r} needs values of shape [B, T], got {tuple(values.shape)}")
    masked = torch.where(m, values, torch.zeros_like(values))
    if reduction == "token_mean":
        return masked.sum() / counts.sum().clamp(min=1)
    row_sums = masked.sum(dim=1)  # [B]
    if reduction == "seq_mean":
        row_values = row_sums / counts.clamp(min=1)
    else:
        if fixed_length is None or fixed_length <= 0:
            raise ValueError("reduction 'fixed_length' needs a positive fixed_length")
        row_values = row_sums / fixed_length
    return torch.where(valid, row_values, torch.zeros_like(row_values)).sum() / num_valid


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020; DeepSeekMath eq. 4).

    ::

        d_t  = clamp(ref_t - logp_t, -20, 20)                               [B, T]
        kl_t = exp(d_t) - d_t - 1   (>= 0, unbiased for KL under samples of pi_theta)

    The clamp (:data:`LOG_RATIO_BOUND`) keeps ``exp`` finite for an extreme reference log-prob.
    """
    delta = log_ratio(ref_logps, logps)
    return torch.exp(delta) - delta - 1.0


def kl_token_mean(
    logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The reference KL term: the token mean of :func:`k3_kl` over all action tokens.

    ::

        logp, ref [B, T] -> 0 where m = 0, cast to ``dtype``            (padding never reaches exp)
        KL = sum_bt m_bt kl_bt / sum_bt m_bt                            scalar; 0 with no action token

    The gradient flows into ``logps`` only (``ref_logps`` is detached). This is the ``D_KL`` of
    GRPO's objective (DeepSeekMath eq. 3) averaged per token, whatever the policy reduction.
    """
    m = mask.bool()
    zero = torch.zeros((), dtype=dtype, device=logps.device)
    masked_logps = torch.where(m, logps.to(dtype), zero)
    masked_ref = torch.where(m, ref_logps.detach().to(dtype), zero)
    return reduce_loss(k3_kl(masked_logps, masked_ref), m, "token_mean")


# --------------------------------------------------------------------------------------------
# The loss
# --------------------------------------------------------------------------------------------


def moment_figures(metrics: dict[str, float]) -> dict[str, float]:
    """Standard deviation and normalised effective sample size of the importance weights, from
    their first and second moments (``ratio_mean`` / ``ratio_sq_mean`` over action tokens,
    ``seq_ratio_mean`` / ``seq_ratio_sq_mean`` over rows)::

        std = sqrt(max(E[w^2] - E[w]^2, 0))
        ESS = E[w]^2 / E[w^2] = (sum_i w_i)^2 / (n sum_i w_i^2)      in (0, 1]; 1 iff all w_i are equal

    (Kong 1992's effective sample size over ``n``). Computed from moments, so the trainer can pool
    micro-batches exactly: it averages the moments over the step, then calls this again."""
    out = {}
    for sq_key, (mean_key, std_key, ess_key) in names.MOMENT_KEYS.items():
        mean, sq = metrics[mean_key], metrics[sq_key]
        out[std_key] = math.sqrt(max(sq - mean * mean, 0.0))
        out[ess_key] = min(mean * mean / sq, 1.0) if sq > 0 else 1.0
    return out


def compute_policy_loss(batch: PolicyBatch, config: ObjectiveConfig) -> LossOutput:
    """Policy loss plus optional reference KL, with diagnostics.

    ::

        policy_loss = reduce_loss(POLICY_LOSSES[config.policy](logp, old, A, m, config), m, config.reduction)
        kl          = sum_t m_t kl_t / sum_t m_t              (token mean over all action tokens)
        loss        = policy_loss + beta * kl

    The KL is computed only when ``beta > 0`` (then ``batch.ref_logps`` is required, else
    ``ValueError``); otherwise it is reported as 0. Computation happens in at least float32.

    Metrics (Python floats), always present:
        ``loss``, ``policy_loss``, ``kl``;
        ``ratio_min``, ``ratio_mean``, ``ratio_max``: token ratio ``r_t`` over action tokens,
        before any clipping but after the :data:`LOG_RATIO_BOUND` clamp (so always finite);
        ``max_abs_log_ratio``: ``max |logp - old|`` over action tokens, clamped the same way (20
        means some token hit the bound; 0 and ratios 1 exactly on the first update of a rollout);
        ``kl_old``: KL(pi_old || pi) between the policy that sampled the rollout and this one, the
        k3 token mean ``sum_t m_t (r_t - 1 - log r_t) / sum_t m_t`` (>= 0; exactly 0 on update 0):
        the step-size guard, how far the updates since the rollout moved the policy on its tokens;
        ``clip_fraction_low`` (``r < 1-eps_low`` and ``A < 0``), ``clip_fraction_high``
        (``r > 1+eps_high`` and ``A > 0``), ``clip_fraction`` (either): fractions of action tokens,
        sign-aware like TRL, i.e. the tokens whose gradient the token clip removes. The same
        definition is used for every policy, so for ``"cispo"`` and ``"gspo"`` these are a
        diagnostic of how far tokens moved, not what those losses clip;
        ``num_action_tokens``, ``num_valid_rows`` (rows with at least one action token);
        ``ratio_std`` and ``ratio_ess`` (:func:`moment_figures` of ``r_t`` over action tokens;
        ``ratio_sq_mean`` is the second moment they come from);
        ``kl_new_old``: KL(pi || pi_old) estimated on the rollout's tokens (drawn from pi_old),
        ``sum_t m_t (r_t log r_t - r_t + 1) / sum_t m_t`` (>= 0, exactly 0 on update 0; unbiased
        since E_old[r log r] = KL(pi || pi_old) and E_old[r - 1] = 0);
        ``seq_ratio_min/mean/max/std/ess`` (and ``seq_ratio_sq_mean``): the sequence ratio
        ``s = exp(sum_t m_t log r_t / sum_t m_t)`` over rows with action tokens, for every policy
        (GSPO's ratio; for the others, how far whole trajectories moved).
    Plus the policy's own metrics: ``cispo_truncation_fraction`` and ``cispo_weight_max`` for
    ``"cispo"``; ``gspo_seq_clip_fraction[_low|_high]`` for ``"gspo"``.
    With no action token, ratio statistics are 1 and fractions 0.
    """
    if not isinstance(batch, PolicyBatch):
        raise TypeError(f"batch must be a PolicyBatch, got {type(batch).__name__}")
    if not isinstance(config, ObjectiveConfig):
        raise TypeError(f"config must be an ObjectiveConfig, got {type(config).__name__}")
    use_kl = config.beta > 0
    if use_kl and batch.ref_logps is None:
        raise ValueError(f"beta={config.beta} > 0 needs ref_logps in the batch")
    spec = POLICY_LOSSES.get(config.policy)
    if spec is None:
        raise ValueError(f"policy {config.policy!r} is not registered")

    dtype = torch.promote_types(batch.logps.dtype, torch.float32)
    m = batch.mask.bool()
    zero = torch.zeros((), dtype=dtype, device=batch.logps.device)
    # Replace masked positions by 0 so that padding garbage cannot overflow exp() or leak NaN.
    logps = torch.where(m, batch.logps.to(dtype), zero)
    old = torch.where(m, batch.old_logps.detach().to(dtype), zero)
    advantages = batch.advantages.detach().to(dtype)

    term = spec.fn(logps, old, advantages, m, config)
    expected = m.shape if spec.level == "token" else m.shape[:1]
    if term.values.shape != expected:
        raise ValueError(
            f"policy {config.policy!r} ({spec.level}-level) returned shape {tuple(term.values.shape)}, "
            f"expected {tuple(expected)}"
        )
    policy_loss = reduce_loss(term.values, m, config.reduction, config.fixed_length)

    if use_kl:
        kl = kl_token_mean(logps, batch.ref_logps, m, dtype)
        loss = policy_loss + config.beta * kl
    else:
        kl = zero
        loss = policy_loss

    with torch.no_grad():
        # Few, whole-tensor kernels: this runs on every micro-batch (benchmarks/update.py times it
        # against TRL's loss). Min/max are taken on log-ratios (exp is monotonic); the defaults for
        # a batch without action tokens are filled in on the host.
        clamped = log_ratio(logps.detach(), old)  # (B, T); 0 on masked positions
        ratio = torch.exp(clamped)
        adv = advantages.unsqueeze(1)  # (B, 1)
        low = (ratio < 1.0 - config.epsilon_low) & (adv < 0) & m
        high = (ratio > 1.0 + config.epsilon_high) & (adv > 0) & m
        counts = m.sum(dim=1)  # (B,)
        valid = counts > 0  # (B,)
        seq_log_ratio = clamped.sum(dim=1) / counts.clamp(min=1)  # (B,) mean_t log r_t (masked entries are 0)
        seq_ratio = torch.exp(seq_log_ratio)
        floats = torch.stack([
            loss.detach(), policy_loss.detach(), kl.detach(),
            torch.where(m, clamped, math.inf).amin() if m.numel() else zero,
            torch.where(m, clamped, -math.inf).amax() if m.numel() else zero,
            (ratio * m).sum(),
            ((ratio - 1.0 - clamped) * m).sum(),  # k3 of KL(old || new) per token, summed (no cancellation)
            (ratio * ratio * m).sum(),
            ((ratio * clamped - ratio + 1.0) * m).sum(),  # r log r - r + 1 >= 0: KL(new || old) per token
            torch.where(valid, seq_log_ratio, math.inf).amin() if valid.numel() else zero,
            torch.where(valid, seq_log_ratio, -math.inf).amax() if valid.numel() else zero,
            (seq_ratio * valid).sum(),
            (seq_ratio * seq_ratio * valid).sum(),
        ]).tolist()
        ints = torch.stack([counts.sum(), valid.sum(), low.sum(), high.sum(), (low | high).sum()]).tolist()
        (loss_value, policy_value, kl_value, log_ratio_min, log_ratio_max, ratio_sum, kl_old_sum, ratio_sq_sum,
         kl_new_old_sum, seq_log_min, seq_log_max, seq_sum, seq_sq_sum) = floats
        tokens, valid_rows, n_low, n_high, n_clipped = ints
        # Divided, not multiplied by 1/n: n * (1/n) is not 1 for every n, and update 0's ratios are
        # all exactly 1, so its mean must be 1.0, its std 0.0 and its ESS 1.0 exactly.
        n_tokens, n_rows = max(tokens, 1), max(valid_rows, 1)
        ratio_mean, ratio_sq = (ratio_sum / n_tokens, ratio_sq_sum / n_tokens) if tokens else (1.0, 1.0)
        seq_mean, seq_sq = (seq_sum / n_rows, seq_sq_sum / n_rows) if valid_rows else (1.0, 1.0)
        metrics = {
            names.LOSS: loss_value,
            names.POLICY_LOSS: policy_value,
            names.KL: kl_value,
            names.RATIO_MIN: math.exp(log_ratio_min) if tokens else 1.0,
            names.RATIO_MEAN: ratio_mean,
            names.RATIO_MAX: math.exp(log_ratio_max) if tokens else 1.0,
            names.MAX_ABS_LOG_RATIO: max(log_ratio_max, -log_ratio_min) + 0.0 if tokens else 0.0,  # no -0.0
            names.KL_OLD: max(0.0, kl_old_sum / n_tokens),  # max: rounding never shows below 0
            names.CLIP_FRACTION_LOW: n_low / n_tokens,
            names.CLIP_FRACTION_HIGH: n_high / n_tokens,
            names.CLIP_FRACTION: n_clipped / n_tokens,
            names.NUM_ACTION_TOKENS: float(tokens),
            names.NUM_VALID_ROWS: float(valid_rows),
            names.RATIO_SQ_MEAN: ratio_sq,
            names.KL_NEW_OLD: max(0.0, kl_new_old_sum / n_tokens),
            names.SEQ_RATIO_MIN: math.exp(seq_log_min) if valid_rows else 1.0,
            names.SEQ_RATIO_MEAN: seq_mean,
            names.SEQ_RATIO_MAX: math.exp(seq_log_max) if valid_rows else 1.0,
            names.SEQ_RATIO_SQ_MEAN: seq_sq,
        }
        metrics.update(moment_figures(metrics))
        if term.metrics:
            extra = list(term.metrics)
            for name in extra:
                if name in metrics:
                    raise ValueError(f"policy {config.policy!r} metric {name!r} clashes with a common metric")
            values = torch.stack([term.metrics[k].detach().to(torch.float64).reshape(()) for k in extra])
            metrics.update(zip(extra, values.tolist()))

    return LossOutput(loss=loss, policy_loss=policy_loss.detach(), kl=kl.detach(), metrics=metrics)


# --------------------------------------------------------------------------------------------
# Split-invariant weighting (one micro-batch of a rollout)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutTotals:
    """Rollout-wide counts that weight one micro-batch's loss (see :func:`compute_weighted_loss`).

    Attributes:
        valid_rows: ``R``, rows with at least one action token, over all processes.
        action_tokens: ``N``, action tokens, over all processes.
        local_rows: rows of this process's share of the rollout (all its micro-batches together).
        world_size: ``W``, number of processes (DDP averages their gradients).
    """

    valid_rows: float
    action_tokens: float
    local_rows: float
    world_size: int = 1


class WeightedLoss(NamedTuple):
    """Result of :func:`compute_weighted_loss`.

    loss: differentiable scalar, this micro-batch's part of the rollout objective; backpropagate it.
    policy: the unweighted policy term of the micro-batch (:func:`compute_policy_loss` with
        ``beta = 0``) and its metrics.
    kl: detached scalar, the micro-batch's share of the rollout's KL token mean, ``k n / N``
        (0 when ``beta = 0``); summed over micro-batches it is the rollout's KL.
    share: the policy weight ``r / R`` (``n / N`` for ``token_mean``).
    world_size: ``W`` as applied (1 without :class:`RolloutTotals`).
    """

    loss: torch.Tensor
    policy: LossOutput
    kl: torch.Tensor
    share: float
    world_size: float


@functools.lru_cache(maxsize=64)
def _without_kl(config: ObjectiveConfig) -> ObjectiveConfig:
    return config if config.beta == 0 else dataclasses.replace(config, beta=0.0)


def compute_weighted_loss(
    batch: PolicyBatch,
    config: ObjectiveConfig,
    totals: RolloutTotals | None = None,
    aux_loss: torch.Tensor | None = None,
    aux_coef: float = 0.0,
) -> WeightedLoss:
    """One micro-batch's loss, weighted so that an optimizer step's gradient does not depend on the split.

    A rollout (all processes) holds ``R`` valid rows and ``N`` action tokens; this micro-batch
    (``batch``: logps, old, ref, m ``[B, T]``, A ``[B]``) holds ``r`` valid rows and ``n`` action
    tokens, and this process holds ``B_local`` of the rollout's rows. With ``p`` the policy term
    (:func:`compute_policy_loss` without KL) and ``k`` the KL token mean (:func:`kl_token_mean`)::

        s    = r / R                    (n / N for reduction "token_mean")
        loss = W * (p * s + beta * k * n / N) + aux_coef * aux * B / B_local

    Summed over micro-batches and averaged over the ``W`` processes (DDP) this is exactly
    ``policy objective over the rollout + beta * KL token mean over the rollout``: for
    ``seq_mean`` / ``fixed_length`` / ``sequence`` ``p`` is a mean over the ``r`` rows, so
    ``sum p r / R`` is the mean over all ``R``; for ``token_mean`` the same holds with tokens.
    This holds whatever the per-device batch size, accumulation steps, process count or a shorter
    last window. The MoE aux loss (a statistic of each batch, not split-invariant by nature) enters
    as its row-weighted mean. ``R``, ``N`` are clamped to at least 1.

    Without ``totals`` (evaluation) the micro-batch is the whole rollout: ``R = max(r, 1)``,
    ``N = max(n, 1)``, ``W = 1``, ``B_local = B``.
    """
    policy = compute_policy_loss(batch, _without_kl(config))
    rows, tokens = policy.metrics[names.NUM_VALID_ROWS], policy.metrics[names.NUM_ACTION_TOKENS]
    if totals is None:
        total_rows, total_tokens, row_share, world = max(rows, 1.0), max(tokens, 1.0), 1.0, 1.0
    else:
        total_rows, total_tokens = max(float(totals.valid_rows), 1.0), max(float(totals.action_tokens), 1.0)
        row_share = batch.mask.size(0) / float(totals.local_rows)
        world = float(totals.world_size)
    share = tokens / total_tokens if config.reduction == "token_mean" else rows / total_rows
    loss = policy.loss * (share * world)
    kl = torch.zeros((), device=batch.logps.device)
    if config.beta > 0:
        if batch.ref_logps is None:
            raise ValueError(f"beta={config.beta} > 0 needs ref_logps in the batch")
        kl = kl_token_mean(batch.logps, batch.ref_logps, batch.mask) * (tokens / total_tokens)
        loss = loss + config.beta * kl * world
    if aux_loss is not None:
        loss = loss + aux_coef * aux_loss * row_share
    return WeightedLoss(loss=loss, policy=policy, kl=kl.detach(), share=share, world_size=world)


# --------------------------------------------------------------------------------------------
# Small masked statistics (no gradient, no host sync)
# --------------------------------------------------------------------------------------------


def _fraction(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Share of masked-in entries where ``flags`` holds; 0 when the mask is empty."""
    return (flags & mask).sum().to(torch.float64) / mask.sum().clamp(min=1).to(torch.float64)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, default: float) -> torch.Tensor:
    n = mask.sum()
    mean = torch.where(mask, x, torch.zeros_like(x)).sum() / n.clamp(min=1)
    return torch.where(n > 0, mean, torch.full_like(mean, default))


def _masked_min(x: torch.Tensor, mask: torch.Tensor, default: float) -> torch.Tensor:
    if not x.numel():
        return x.new_tensor(default)
    value = torch.where(mask, x, torch.full_like(x, math.inf)).amin()
    return torch.where(mask.any(), value, torch.full_like(value, default))


def _masked_max(x: torch.Tensor, mask: torch.Tensor, default: float) -> torch.Tensor:
    if not x.numel():
        return x.new_tensor(default)
    value = torch.where(mask, x, torch.full_like(x, -math.inf)).amax()
    return torch.where(mask.any(), value, torch.full_like(value, default))
