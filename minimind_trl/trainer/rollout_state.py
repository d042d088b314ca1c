"""What one rollout and one optimizer step carry between the trainer's hooks.

TRL splits a GRPO step over many hooks (generate, score, prepare, loss, grad norm, log). Our state
travels between them in two objects instead of loose trainer attributes:

* :class:`RolloutState` -- created when a rollout starts (``_generate_and_score_completions``),
  filled while it is generated and scored (its rows, the trajectories, the reward matrix,
  tool counts), then, for a training rollout, kept as ``trainer.rollout``: the replay
  freezes its old log-probs once (``replayed``) and every record of its updates repeats its
  ``figures``. The next training rollout replaces it; an evaluation rollout never does.
* :class:`StepState` -- one optimizer step's accounting, created empty after the previous step's
  record: each micro-batch adds its figures (``stats``), action tokens and any non-finite detail;
  the rollout, replay and update add their seconds (``timings``); ``_get_grad_norm`` reduces
  ``stats`` into ``figures``; ``log`` turns ``figures`` into the metrics.jsonl record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from minimind_trl.envs.rollout import Trajectory
from minimind_trl.metric_names import TIMING_KEYS
from minimind_trl.trainer.stats import StepAccumulator


@dataclass
class RolloutState:
    """One rollout, from its start to its last update's record (module docstring).

    ``inputs``: this process's dataset rows of the rollout (TRL's ``rollout_func`` receives only
    their prompts; the tool rollout reads each row's ``open_thinking`` and ``id`` here).
    ``trajectories``: the tool rollout's `envs.rollout.Trajectory` per local row (None for a
    rollout TRL or a caller's ``rollout_func`` generated). ``rewards_per_func``: (N_global, F), all processes,
    group by group. ``tool_counts``: (calls, failed, malformed) per local row. ``figures``: the
    rollout-wide metrics.jsonl figures (the on-policy gap filled by its update 0). ``replayed``:
    its micro-batches hold their frozen old log-probs."""

    inputs: list[dict[str, Any]] = field(default_factory=list)
    trajectories: list[Trajectory] | None = None
    rewards_per_func: torch.Tensor | None = None
    tool_counts: list[tuple[int, int, int]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False


@dataclass(frozen=True)
class ReplayPosition:
    """Where a training micro-batch sits in the replay of its rollout: the one place the position
    inside K is derived (from TRL's micro-step counter ``_step``, which checkpoints save, so a
    resumed run continues at the same position).

    A rollout feeds ``K = E x M`` optimizer steps (``num_iterations`` passes E x ``minibatches`` M),
    each of ``GA`` micro-batches: ``rollout`` counts rollouts from 0, ``update`` is k = 0..K-1,
    ``replay_pass`` e = k // M, ``minibatch`` m = k % M, and ``buffer_index`` the micro-batch of
    TRL's rollout buffer (``m * GA + accumulation step``)."""

    rollout: int
    update: int
    replay_pass: int
    minibatch: int
    buffer_index: int

    @classmethod
    def of_micro_step(cls, micro_step: int, args: Any) -> ReplayPosition:
        """The position of micro-step ``micro_step`` (0-based, counted over the whole run)."""
        accumulation, minibatches = args.gradient_accumulation_steps, args.minibatches
        per_rollout = accumulation * minibatches * args.num_iterations  # TRL's generate_every
        within = micro_step % per_rollout
        update = within // accumulation
        return cls(rollout=micro_step // per_rollout, update=update, replay_pass=update // minibatches,
                   minibatch=update % minibatches, buffer_index=within % (accumulation * minibatches))


@dataclass
class StepState:
    """One optimizer step's accounting (module docstring). ``position``: the step's place in
    its rollout's replay (:class:`ReplayPosition`). ``update_tokens``: prompt + completion
    tokens of this process's training micro-batches; ``figures``: ``stats`` reduced over processes
    at the optimizer step, waiting for ``log``."""

    stats: StepAccumulator = field(default_factory=StepAccumulator)
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMING_KEYS, 0.0))
    update_tokens: float = 0.0
    nonfinite: list[str] = field(default_factory=list)
    figures: dict[str, float] | None = None
    position: ReplayPosition | None = None  # set where each micro-batch is served (_prepare_inputs)
