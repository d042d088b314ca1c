"""`MiniMindGRPOTrainer`: TRL's GRPOTrainer with our objectives, exact fixed-K replay and diagnostics.

Rollouts. :class:`MiniMindToolGRPOTrainer` generates through TRL's public ``rollout_func``: the
project's multi-turn driver (`minimind_trl.envs.rollout.drive`, the one evaluation runs) returns
each row's prompt and completion ids, the sampling log-probs (``sampling_per_token_logps``) and
the environment mask (TRL's ``tool_mask``). Nothing of TRL's generation is overridden.

What is overridden, and why (TRL 1.16):

* ``_calculate_rewards``: the rewards read the tool rollout's completions as TRL's tool loop
  builds them (each turn's parsed message and the tool messages; TRL itself parses a
  ``rollout_func``'s whole completion as one message), and the gathered ``[N_global, F]`` reward
  matrix (and per-trajectory tool-call counts) is kept for the advantage and diagnostics below.
* ``_generate_and_score_completions``: runs TRL's with its own old-log-prob pass switched off,
  then replaces ``advantages`` with :func:`minimind_trl.objectives.compute_advantages` of the
  weighted reward sum (laid out group by group, all processes), and adds the rollout-wide counts
  the loss weighting needs.
* ``_prepare_inputs``: when TRL has just generated and split a rollout, freezes the old
  log-probs of the micro-batches first served after an optimizer step (``_old_pass_indices``),
  with exactly the forward call, rows, padding and dtype the update pass will use, so the old
  log-probs are the update's numbers (not only on CPU).
* ``_compute_loss``: wires the micro-batch into :func:`minimind_trl.objectives.compute_weighted_loss`
  (policy term, KL term and the split-invariant weighting live there; see "Weighting"). Update 0's
  own micro-batches keep their update-0 log-probs as their old ones (written into TRL's buffered
  micro-batch, which later updates are served), so update 0's ratio is exactly 1. On a rollout's
  update 0 it compares the sampling log-probs with the old ones (`on_policy_gap`).
* ``_get_per_token_logps_and_entropies`` (TRL's one log-prob function, also used for the
  reference model): with ``prefix_sharing`` the prefix-shared pass of
  :mod:`minimind_trl.trainer.policy_pass`, which the replay and the updates use as well.
* ``_get_grad_norm``: closes the step: reduces its figures over processes, stops the run on a
  non-finite loss or gradient (before ``optimizer.step``).
* ``log``: adds the step record to the logs (reporters) and pushes it into the step recorder
  (:class:`minimind_trl.trainer.recorder.StepRecorder`, ``metrics.jsonl``; keys:
  :mod:`minimind_trl.metric_names`). ``train`` closes the recorder.
* ``_get_train_sampler`` / ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: atomic
  checkpoints holding the rollout buffer (:mod:`minimind_trl.trainer.checkpoints`).

Weighting (split invariance). Per rollout, over all processes: ``R`` rows with at least one action
token and ``N`` action tokens, counted once in ``_generate_and_score_completions`` and carried by
every micro-batch; :func:`minimind_trl.objectives.compute_weighted_loss` turns a micro-batch's
policy loss ``p`` and KL token mean ``k`` into ``W * (p * r / R + beta * k * n / N)`` (formula,
shapes and proof there), whatever the per-device batch size, accumulation steps, process count or
a shorter last window.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import os
import time
from typing import Any

import torch
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
from trl.trainer.utils import split_tensor_dict

from minimind_trl.engine.sampling import Sampling
from minimind_trl.engine.turns import padded_generate_turns
from minimind_trl.envs.environment import install_parse_guard
from minimind_trl.envs.protocol import MAX_TOOL_TURNS, is_error_observation
from minimind_trl.envs.registry import ToolRegistry
from minimind_trl.envs.rollout import Trajectory, TurnRules, drive, task_prompt_ids
from minimind_trl.envs.tools import default_registry
from minimind_trl.metric_names import (
    ACTION_TOKENS_MEAN,
    AUX_LOSS,
    COMPLETION_TOKENS_MAX,
    COMPLETION_TOKENS_MEAN,
    ENTROPY,
    GENERATION_TOKENS_PER_SECOND,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LOSS,
    MAX_ABS_LOG_RATIO,
    MAX_SUFFIX,
    MIN_SUFFIX,
    MOMENT_KEYS,
    NONFINITE_LOSS,
    NUM_ACTION_TOKENS,
    NUM_VALID_ROWS,
    OLD_LOGP_SECONDS,
    ON_POLICY_KEYS,
    ONPOLICY_KL,
    ONPOLICY_LOGP_ABS_DIFF_MAX,
    ONPOLICY_LOGP_ABS_DIFF_MEAN,
    POLICY_LOSS,
    REPLAY_MINIBATCH,
    REPLAY_PASS,
    REWARD_MEAN,
    REWARD_STD,
    ROLLOUT,
    ROLLOUT_ACTION_TOKENS,
    ROLLOUT_GENERATED_TOKENS,
    ROLLOUT_SECONDS,
    ROLLOUT_VALID_ROWS,
    ROW_WEIGHTED_PREFIXES,
    STEP,
    TOOL_CALLS_PER_TRAJECTORY,
    TOOL_FAILURES_PER_TRAJECTORY,
    TOOL_MALFORMED_PER_TRAJECTORY,
    TOOL_VALID_PER_TRAJECTORY,
    TRUNCATION_RATE,
    UPDATE,
    UPDATE_SECONDS,
    UPDATE_TOKENS_PER_SECOND,
    ZERO_STD_GROUP_FRACTION,
    is_router_count_key,
    reward_func_mean_key,
    reward_func_std_key,
)
from minimind_trl.objectives import (
    PolicyBatch,
    RolloutTotals,
    compute_advantages,
    compute_weighted_loss,
    k3_kl,
    moment_figures,
)
from minimind_trl.trainer.checkpoints import AtomicCheckpointMixin
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.errors import NonFiniteError
from minimind_trl.trainer.moe import RouterRecorder, finalize_counts
from minimind_trl.trainer.policy_pass import build_layout, setup_policy_passes
from minimind_trl.trainer.recorder import StepRecorder
from minimind_trl.trainer.rollout_state import ReplayPosition, RolloutState, StepState

# Rollout-wide counts every training micro-batch carries (batch fields; the first two are also
# written to the record under the same names). Stored in checkpointed rollout buffers: keep them.
_VALID_ROWS_FIELD = ROLLOUT_VALID_ROWS
_ACTION_TOKENS_FIELD = ROLLOUT_ACTION_TOKENS
_LOCAL_ROWS_FIELD = "rollout_local_rows"
# Objective metrics the micro-batch record handles itself (weighted sums, not means).
_SUMMED_OBJECTIVE_METRICS = (LOSS, POLICY_LOSS, KL, NUM_ACTION_TOKENS, NUM_VALID_ROWS)


def on_policy_gap(sampling: torch.Tensor, old: torch.Tensor, mask: torch.Tensor):
    """(mean |d|, max |d|, KL, tokens) over the action tokens (``mask``), d = sampling - old log-probs
    (B, C). KL(sampling || replay) is the mean k3 estimate (`k3_kl`: the tokens were drawn from the
    sampler; ``exp(-d) - 1 + d`` >= 0, 0 iff d = 0). NaN log-probs (not scored) are left out."""
    keep = mask.bool() & ~(sampling.isnan() | old.isnan())
    sampling, old = sampling[keep].double(), old.detach()[keep].double()
    if sampling.numel() == 0:
        zero = sampling.new_zeros(())
        return zero, zero, zero, 0
    gap = (sampling - old).abs()
    return gap.mean(), gap.max(), k3_kl(sampling, old).mean(), sampling.numel()


def _tool_counts(completion: Any) -> tuple[int, int]:
    """(tool calls, failed calls) of one trajectory from its tool messages (no environment records)."""
    if not isinstance(completion, list):
        return 0, 0
    observations = [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "tool"]
    return len(observations), sum(is_error_observation(str(o)) for o in observations)


def _regroup_by_prompt(micro_batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Re-split a shuffled rollout so that rows with the same prompt share a micro-batch.

    Groups keep the (random) order of their first row; the number and size of micro-batches are
    unchanged. The optimizer step sums over all micro-batches, so its gradient does not depend on
    this order; what changes is that a group's prompt is encoded once, not once per micro-batch."""
    keys = micro_batches[0].keys()
    merged: dict[str, Any] = {}
    for key in keys:
        values = [batch[key] for batch in micro_batches]
        first = values[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            merged[key] = torch.cat(values)
        elif isinstance(first, list):
            merged[key] = [item for value in values for item in value]
        else:
            merged[key] = first
    _, prompt_of_row = torch.unique(merged["prompt_ids"].cpu(), dim=0, return_inverse=True)  # [B]
    rows = torch.arange(prompt_of_row.numel())
    first_row = torch.full((int(prompt_of_row.max()) + 1,), prompt_of_row.numel()).scatter_reduce(
        0, prompt_of_row, rows, reduce="amin")
    order = torch.argsort(first_row[prompt_of_row] * prompt_of_row.numel() + rows)  # groups, then rows
    for key, value in merged.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            merged[key] = value[order.to(value.device)]
        elif isinstance(value, list):
            merged[key] = [value[i] for i in order.tolist()]
    return split_tensor_dict(merged, len(micro_batches))


class MiniMindGRPOTrainer(AtomicCheckpointMixin, GRPOTrainer):
    """GRPOTrainer running a :class:`~minimind_trl.objectives.ObjectiveConfig` (see module docstring).

    Takes the same arguments as ``trl.GRPOTrainer``; ``args`` must be a :class:`MiniMindGRPOConfig`.
    After each optimizer step ``last_record`` holds the step's diagnostics, which the trainer
    pushes into ``step_recorder`` (``output_dir/metrics.jsonl``, main process only).
    """

    loss_is_scaled_for_ga = True  # _compute_loss applies the whole weighting itself

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, MiniMindGRPOConfig):
            raise TypeError(f"args must be a MiniMindGRPOConfig, got {type(config).__name__}")
        super().__init__(*args, **kwargs)
        self._check_zero3_generation()
        self.objective = self.args.objective_config()
        self.router_recorder = RouterRecorder.for_model(self.model) if self.args.moe_diagnostics else None
        self._setup_policy_passes()
        self.rollout = RolloutState(replayed=True)  # the training rollout the updates replay and record
        self._generating: RolloutState | None = None  # the rollout being generated and scored (train or eval)
        self.step_state = StepState()
        self.last_record: dict[str, Any] | None = None
        self.step_recorder = StepRecorder(os.path.join(self.args.output_dir, self.args.metrics_file))

    def _check_zero3_generation(self) -> None:
        """ZeRO-3 on several processes: generation must run on whole weights gathered once per
        rollout (:meth:`_generate`); the other paths deadlock when ranks diverge (issue 25 A)."""
        if not (self.is_deepspeed_enabled and is_deepspeed_zero3_enabled() and self.accelerator.num_processes > 1):
            return
        if self.args.rollout_engine != "minimind":
            raise ValueError("rollout.engine: trl under DeepSpeed ZeRO-3 with several processes deadlocks: "
                             "transformers' generate syncs every decode step across ranks, and ranks run "
                             "different numbers of turns; use rollout.engine: minimind (the default)")
        if not self.args.ds3_gather_for_generation:
            raise ValueError("ds3_gather_for_generation: false under ZeRO-3 with several processes deadlocks the "
                             "rollout (every decode step would be a collective and ranks stop at different "
                             "steps); generation needs the gathered weights")

    def _setup_policy_passes(self) -> None:
        """MiniMind's aux loss in TRL's fused pass; the prefix-shared pass on policy and reference."""
        models = [self.model, self.ref_model] if self.ref_model is not None else [self.model]
        for model in models:
            setup_policy_passes(model, self.args.prefix_sharing)

    # ------------------------------------------------------------------ rollout

    @contextlib.contextmanager
    def _generation_model(self, decode_copy: bool = True):
        """The policy with whole weights for one rollout's model turns, gathered ONCE per rollout
        (ZeRO-3: a collective every process enters together). Inside, each process runs as many
        turns and decode calls as its own rows need, with no collective (synced_gpus off in the
        engine): a per-turn gather deadlocks when ranks run different numbers of turns (issue 25 A).
        Costs one full copy of the weights per process during the rollout. ``decode_copy``: the
        minimind engine's bf16 copy on a CPU (:meth:`_decode_model`)."""
        with (
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            yield self._decode_model(model) if decode_copy else model

    def _decode_model(self, model):
        """The weights the minimind engine decodes a rollout with. Under bf16 mixed precision on a
        CPU: a bf16 copy, made once per rollout (every decode step would otherwise cast each weight
        again: autocast's cast cache lives one forward call, and a decode step is one call). The
        sampled tokens then come from bf16 matmuls, as the update's do; the old log-probs are the
        replay pass's, so update 0's ratio stays exactly 1 whatever the sampler's rounding (its
        gap is ``onpolicy/logp_abs_diff_*``). Elsewhere: the model itself."""
        if not (self.args.bf16 and self.accelerator.device.type == "cpu"):
            return model
        with torch.no_grad():
            decode_model = copy.deepcopy(model).to(torch.bfloat16)
        # Forwards installed on the instance (accelerate's autocast wrapper, the prefix-shared
        # forward) are closures over the original module, which deepcopy shares rather than copies:
        # drop them so the copy runs its class's forward on its own bf16 weights, without autocast.
        for module in decode_model.modules():
            module.__dict__.pop("forward", None)
        return decode_model

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        state = self._generating
        trajectories = state.trajectories  # the tool rollout's (MiniMindToolGRPOTrainer), else None
        if trajectories is not None:  # rewards read each turn's message, not TRL's parse of all the ids
            completions = [traj.messages for traj in trajectories]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        state.rewards_per_func = rewards_per_func  # [N_global, F], all processes, group by group
        if trajectories is not None:
            state.tool_counts = [(t.valid_calls + t.failed_calls, t.failed_calls, t.malformed_calls)
                                 for t in trajectories]
        else:
            state.tool_counts = [(*_tool_counts(c), 0) for c in completions]  # local rows
        return rewards_per_func

    @contextlib.contextmanager
    def _trl_old_logps_off(self):
        """TRL computes old log-probs when ``GA % (steps_per_generation * num_iterations) != 0``;
        with ``num_iterations`` seen as 1 and ``steps_per_generation`` as GA (one minibatch) it does
        not, and :meth:`_freeze_old_logps` does it instead."""
        saved = self.num_iterations, self.args.steps_per_generation
        self.num_iterations, self.args.steps_per_generation = 1, self.args.gradient_accumulation_steps
        try:
            yield
        finally:
            self.num_iterations, self.args.steps_per_generation = saved

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        start = time.perf_counter()
        state = self._generating = RolloutState(inputs=inputs)  # a rollout starts
        try:
            with self._trl_old_logps_off():
                output = super()._generate_and_score_completions(inputs)
        finally:
            self._generating = None
        rewards_per_func = state.rewards_per_func  # [N, F]
        if not bool(torch.isfinite(rewards_per_func).all()):
            bad = [n for i, n in enumerate(self.reward_func_names) if not torch.isfinite(rewards_per_func[:, i]).all()]
            raise NonFiniteError(f"non-finite reward (None, NaN or inf) from reward function(s) {bad}")
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).sum(dim=1)  # [N]
        group = self.num_generations if training else self.num_generations_eval
        advantages = compute_advantages(rewards, group, self.objective.advantage)  # [N]
        local = len(inputs)
        rank = self.accelerator.process_index
        output["advantages"] = advantages[rank * local : (rank + 1) * local]
        if not training:
            return output

        mask = output["completion_mask"] * output.get("tool_mask", 1)  # [B, C] action tokens
        counts = torch.stack([(mask.sum(dim=1) > 0).sum(), mask.sum()]).float()
        counts = self.accelerator.reduce(counts, reduction="sum") if self.accelerator.num_processes > 1 else counts
        output[_VALID_ROWS_FIELD], output[_ACTION_TOKENS_FIELD] = counts[0], counts[1]
        output[_LOCAL_ROWS_FIELD] = torch.tensor(float(local), device=counts.device)
        state.figures = self._describe_rollout(output, state, rewards, mask, counts)
        self.rollout = state  # the rollout the coming updates replay and record
        self.step_state.timings[ROLLOUT_SECONDS] += time.perf_counter() - start
        return output

    def _describe_rollout(self, output, state: RolloutState, rewards, mask, counts) -> dict[str, Any]:
        """Rollout-wide figures (all processes): rewards, groups, lengths, truncation, tool use."""
        completion_mask = output["completion_mask"]
        lengths = completion_mask.sum(dim=1)  # [B]
        last = output["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ends = torch.tensor([*self.eos_token_ids, self._tokenizer.pad_token_id], device=last.device)
        truncated = (lengths == 0) | ~torch.isin(last, ends)
        tools = torch.tensor(state.tool_counts or [(0, 0, 0)] * len(lengths), device=lengths.device).float()
        per_row = torch.stack([lengths.float(), mask.sum(dim=1).float(), truncated.float()], 1)  # [B, 3]
        per_row = self.accelerator.gather(torch.cat([per_row, tools], dim=1))  # [N, 6]
        grouped = rewards.view(-1, self.num_generations)
        stats: dict[str, Any] = {
            REWARD_MEAN: rewards.mean().item(),
            REWARD_STD: rewards.std().item() if rewards.numel() > 1 else 0.0,
            ZERO_STD_GROUP_FRACTION: (grouped == grouped[:, :1]).all(dim=1).float().mean().item(),
        }
        for i, name in enumerate(self.reward_func_names):
            column = state.rewards_per_func[:, i]
            stats[reward_func_mean_key(name)] = column.mean().item()
            stats[reward_func_std_key(name)] = column.std().item() if column.numel() > 1 else 0.0
        calls, failures = per_row[:, 3], per_row[:, 4]
        stats.update(
            {
                COMPLETION_TOKENS_MEAN: per_row[:, 0].mean().item(),
                COMPLETION_TOKENS_MAX: per_row[:, 0].max().item(),
                ACTION_TOKENS_MEAN: per_row[:, 1].mean().item(),
                TRUNCATION_RATE: per_row[:, 2].mean().item(),
                TOOL_CALLS_PER_TRAJECTORY: calls.mean().item(),
                TOOL_VALID_PER_TRAJECTORY: (calls - failures).mean().item(),
                TOOL_FAILURES_PER_TRAJECTORY: failures.mean().item(),
                TOOL_MALFORMED_PER_TRAJECTORY: per_row[:, 5].mean().item(),
                ROLLOUT_VALID_ROWS: counts[0].item(),
                ROLLOUT_ACTION_TOKENS: counts[1].item(),
                ROLLOUT_GENERATED_TOKENS: per_row[:, 0].sum().item(),
            }
        )
        stats.update(dict.fromkeys(ON_POLICY_KEYS))  # measured by the rollout's first update
        return stats

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        inputs = super()._prepare_inputs(generation_batch)  # serves micro-step self._step (training_step counts it)
        self.step_state.position = ReplayPosition.of_micro_step(self._step, self.args)
        if not self.rollout.replayed:  # a rollout was just generated, shuffled and split
            if self.args.prefix_sharing and len(self._buffered_inputs) > 1:
                self._buffered_inputs = _regroup_by_prompt(self._buffered_inputs)
                inputs = self._buffered_inputs[self.step_state.position.buffer_index]
            if self.args.minibatches > 1:
                self._count_minibatches(self._buffered_inputs)
            self._freeze_old_logps(self._buffered_inputs)
            self.rollout.replayed = True
        return inputs

    def _count_minibatches(self, micro_batches: list[dict[str, Any]]) -> None:
        """With M minibatches each optimizer step's loss is weighted by its own minibatch's valid
        rows and action tokens over all processes (and this process's rows of it), not the whole
        rollout's: micro-batches ``m*GA .. (m+1)*GA - 1`` are minibatch ``m``."""
        accumulation = self.args.gradient_accumulation_steps
        local = []  # (M, 3): valid rows, action tokens, local rows
        for m in range(self.args.minibatches):
            counts = torch.zeros(3)
            for batch in micro_batches[m * accumulation:(m + 1) * accumulation]:
                mask = self._action_mask(batch).cpu()  # (B, C)
                counts += torch.tensor([(mask.sum(dim=1) > 0).sum(), mask.sum(), mask.size(0)], dtype=torch.float32)
            local.append(counts)
        local = torch.stack(local).to(self.accelerator.device)
        totals = self.accelerator.reduce(local.clone(), reduction="sum") if self.accelerator.num_processes > 1 \
            else local
        for i, batch in enumerate(micro_batches):
            m = i // accumulation
            batch[_VALID_ROWS_FIELD], batch[_ACTION_TOKENS_FIELD] = totals[m, 0], totals[m, 1]
            batch[_LOCAL_ROWS_FIELD] = local[m, 2]

    def _old_pass_indices(self, count: int) -> range:
        """The buffer's micro-batches that need the separate old-log-prob pass: those first served
        after an optimizer step. Update 0's own micro-batches (buffer ``0 .. GA-1``: the whole
        rollout in the E form, minibatch 0 in the M form) run before the policy moves, so their
        update-0 forward *is* their old log-probs and :meth:`_compute_loss` keeps it. A rollout
        regenerated mid-replay (resume) and MoE models (whose old pass also records router choices)
        take the pass for every micro-batch."""
        if self.step_state.position.update != 0 or self.router_recorder is not None:
            return range(count)
        return range(min(self.args.gradient_accumulation_steps, count), count)

    @torch.no_grad()
    def _freeze_old_logps(self, micro_batches: list[dict[str, Any]]) -> None:
        """Old log-probs (and router choices) of the not yet updated policy, per training micro-batch
        of :meth:`_old_pass_indices` (no entropies: nothing reads them)."""
        if self.args.updates_per_rollout == 1:
            return  # the single update uses per_token_logps.detach(): ratio exactly 1
        indices = self._old_pass_indices(len(micro_batches))
        if not indices:
            return  # E form: update 0 serves every micro-batch and records its own
        start = time.perf_counter()
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for index in indices:
                batch = micro_batches[index]
                logps, _, _, router = self._policy_forward(self.model_wrapped, batch, keep_topk=True,
                                                           compute_entropy=False)
                batch["old_per_token_logps"] = logps
                if router is not None:
                    batch["old_router_topk"] = router
        self.step_state.timings[OLD_LOGP_SECONDS] += time.perf_counter() - start

    # ------------------------------------------------------------------ update

    def _policy_forward(self, model, inputs, keep_topk: bool = False, compute_entropy: bool = True):
        """The one forward both passes use: (logps [B,C], entropies [B,C] or None, aux, router topk
        or counts). Entropies or not, the log-probs are the same numbers (tested)."""
        if self.args.prefix_sharing:
            return self._shared_policy_forward(model, inputs, keep_topk, compute_entropy)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # [B, P+C]
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # [B, P+C]
        logits_to_keep = inputs["completion_ids"].size(1)
        recorder = self.router_recorder
        capture = recorder.capture() if recorder is not None else contextlib.nullcontext(None)
        with capture as router_logits:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                compute_entropy=compute_entropy,
                compute_aux_loss=self.aux_loss_enabled,
            )
        router = None
        if router_logits:
            batch, length = input_ids.shape
            if keep_topk:
                router = recorder.topk(router_logits, batch, length)
            else:
                mask = self._action_mask(inputs).bool()  # [B, C]
                positions = torch.zeros_like(attention_mask, dtype=torch.float64)  # [B, P+C]
                positions[:, length - logits_to_keep - 1 : length - 1] = mask.double()  # hidden state scoring token t
                router = recorder.counts(router_logits, attention_mask, positions, inputs.get("old_router_topk"))
        return logps, entropies, aux, router

    def _shared_policy_forward(self, model, inputs, keep_topk: bool, compute_entropy: bool = True):
        """:meth:`_policy_forward` through the prefix-shared pass; router statistics weighted per row."""
        layout = build_layout(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                              inputs["completion_mask"])
        # Score the action tokens only: tool-observation tokens stay in the packed context, but their
        # log-probs and entropies (about a quarter of a tool-use completion) are never used.
        layout = dataclasses.replace(layout, completion_mask=layout.completion_mask & self._action_mask(inputs).bool())
        recorder = self.router_recorder
        capture = recorder.capture() if recorder is not None else contextlib.nullcontext(None)
        with capture as router_logits:
            out = self._shared_pass(model, layout, compute_entropy=compute_entropy,
                                    compute_aux_loss=self.aux_loss_enabled)
        router = None
        if router_logits:
            if keep_topk:
                router = recorder.topk(router_logits, 1, layout.num_tokens)
            else:
                actions = layout.action_weights(self._action_mask(inputs))[None]  # [1, N]
                router = recorder.counts(router_logits, layout.weights[None], actions, inputs.get("old_router_topk"))
        return out.log_probs, out.entropy, out.aux_loss, router

    def _shared_pass(self, model, layout, compute_entropy: bool, compute_aux_loss: bool):
        with self.accelerator.autocast():
            return model(prefix_layout=layout, temperature=self.temperature, compute_entropy=compute_entropy,
                         compute_aux_loss=compute_aux_loss, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                         cast_attention_to_fp32=self.args.cast_attention_to_fp32)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's log-prob function (reference pass, TRL's own callers) on the prefix-shared pass,
        chunked into ``batch_size`` rows as TRL does; multimodal inputs take TRL's path."""
        if not self.args.prefix_sharing or any(value is not None for value in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal,
            )
        split = input_ids.size(1) - logits_to_keep
        batch_size = batch_size or input_ids.size(0)
        logps, entropies, auxes = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            layout = build_layout(input_ids[rows, :split], attention_mask[rows, :split],
                                  input_ids[rows, split:], attention_mask[rows, split:])
            out = self._shared_pass(model, layout, compute_entropy, compute_aux_loss)
            logps.append(out.log_probs)
            entropies.append(out.entropy)
            auxes.append(out.aux_loss)
        entropy = torch.cat(entropies) if compute_entropy else None
        aux = torch.stack(auxes).mean() if compute_aux_loss and auxes[0] is not None else None
        return torch.cat(logps), entropy, aux

    @staticmethod
    def _action_mask(inputs) -> torch.Tensor:
        mask = inputs["completion_mask"]
        return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask

    def _compute_loss(self, model, inputs):
        """Forward pass, then :func:`~minimind_trl.objectives.compute_weighted_loss` (see "Weighting")."""
        mask = self._action_mask(inputs).bool()  # [B, C]
        logps, entropies, aux, router = self._policy_forward(model, inputs)
        old = inputs.get("old_per_token_logps")
        if old is None:  # K = 1, evaluation, or update 0 of a micro-batch the old pass left out
            old = logps.detach()
            if self.model.training and self.args.updates_per_rollout > 1:
                if self.step_state.position.update != 0:
                    raise RuntimeError(
                        f"update {self.step_state.position.update} of a rollout was served a micro-batch "
                        "without old log-probs: the trainer relies on TRL serving its buffered "
                        "micro-batch itself (TRL's _prepare_inputs), not a copy")
                inputs["old_per_token_logps"] = old  # the buffered micro-batch: later updates replay it
        batch = PolicyBatch(logps, old, inputs["advantages"], mask, inputs.get("ref_per_token_logps"))
        totals = None  # evaluation: this batch alone
        if _VALID_ROWS_FIELD in inputs:  # training: rollout-wide weights
            totals = RolloutTotals(
                valid_rows=float(inputs[_VALID_ROWS_FIELD]), action_tokens=float(inputs[_ACTION_TOKENS_FIELD]),
                local_rows=float(inputs[_LOCAL_ROWS_FIELD]), world_size=self.accelerator.num_processes,
            )
        weighted = compute_weighted_loss(batch, self.objective, totals, aux, self.router_aux_loss_coef)
        if self.model.training:
            self._record_micro_batch(weighted, entropies, mask, aux, router)
            sampling = inputs.get("sampling_per_token_logps")
            if sampling is not None and self.step_state.position.update == 0:
                self._record_on_policy(sampling, old, mask)
            self.step_state.update_tokens += float(
                torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1).sum())
        return weighted.loss

    def _record_micro_batch(self, weighted, entropies, mask, aux, router) -> None:
        stats, metrics = self.step_state.stats, weighted.policy.metrics
        loss, share, world = weighted.loss, weighted.share, weighted.world_size
        rows, tokens = metrics[NUM_VALID_ROWS], metrics[NUM_ACTION_TOKENS]
        finite = bool(torch.isfinite(loss.detach()))
        if not finite:
            self.step_state.nonfinite.append(
                f"loss={loss.item()} (policy_loss={metrics[POLICY_LOSS]}, max_abs_log_ratio="
                f"{metrics[MAX_ABS_LOG_RATIO]}, aux={None if aux is None else float(aux)})"
            )
        stats.add_max(NONFINITE_LOSS, 0.0 if finite else 1.0)
        stats.add_sum(LOSS, loss.detach() / world)
        stats.add_sum(POLICY_LOSS, metrics[POLICY_LOSS] * share)
        stats.add_sum(KL, weighted.kl)
        stats.add_sum(NUM_ACTION_TOKENS, tokens)
        stats.add_mean(ENTROPY, (entropies.detach() * mask).sum() / max(tokens, 1.0), tokens)
        for name, value in metrics.items():
            if name in _SUMMED_OBJECTIVE_METRICS:
                continue
            if name.endswith(MIN_SUFFIX):
                stats.add_min(name, value)
            elif name.endswith(MAX_SUFFIX) or name == MAX_ABS_LOG_RATIO:
                stats.add_max(name, value)
            else:
                stats.add_mean(name, value, rows if name.startswith(ROW_WEIGHTED_PREFIXES) else tokens)
        if aux is not None:
            stats.add_mean(AUX_LOSS, aux.detach(), mask.size(0))
        for name, value in (router or {}).items():
            stats.add_sum(name, value)

    def _record_on_policy(self, sampling, old, mask) -> None:
        """Sampling vs replay log-probs (`on_policy_gap`); `_finish_step` moves them to the rollout's figures."""
        mean_gap, max_gap, kl, tokens = on_policy_gap(sampling, old, mask)
        stats = self.step_state.stats
        stats.add_mean(ONPOLICY_LOGP_ABS_DIFF_MEAN, mean_gap, tokens)
        stats.add_max(ONPOLICY_LOGP_ABS_DIFF_MAX, max_gap)
        stats.add_mean(ONPOLICY_KL, kl, tokens)

    def training_step(self, model, inputs, num_items_in_batch):
        timings = self.step_state.timings
        before = timings[ROLLOUT_SECONDS] + timings[OLD_LOGP_SECONDS]
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        elapsed = time.perf_counter() - start
        spent_on_rollout = timings[ROLLOUT_SECONDS] + timings[OLD_LOGP_SECONDS] - before
        timings[UPDATE_SECONDS] += elapsed - spent_on_rollout
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self.model.training:
            self._finish_step(None if grad_norm is None else float(grad_norm))
        return grad_norm

    def _finish_step(self, grad_norm: float | None) -> None:
        """Reduce the step's figures over processes; stop on a non-finite loss or gradient."""
        step_state = self.step_state
        figures = step_state.stats.reduce(self.accelerator)
        step = self.state.global_step + 1
        loss_bad = figures.pop(NONFINITE_LOSS, 0.0) > 0
        if loss_bad or (grad_norm is not None and not math.isfinite(grad_norm)):
            detail = "; ".join(step_state.nonfinite) or (
                "the loss was non-finite on another process" if loss_bad
                else "every loss was finite, the gradient was not"
            )
            raise NonFiniteError(
                f"non-finite loss or gradient at step {step} (grad_norm={grad_norm}): {detail}. "
                "The optimizer step was not taken."
            )
        for key in ON_POLICY_KEYS:  # the rollout's, repeated by its later updates' records
            if key in figures:
                self.rollout.figures[key] = figures.pop(key)
        if all(key in figures for key in MOMENT_KEYS):  # std and ESS of the whole step, from pooled moments
            figures.update(moment_figures(figures))
        for key in MOMENT_KEYS:
            figures.pop(key, None)
        moe = {k: figures.pop(k) for k in list(figures) if is_router_count_key(k)}
        if moe and self.router_recorder is not None:
            figures.update(finalize_counts(moe, self.router_recorder.num_experts))
        figures[GRAD_NORM] = grad_norm
        step_state.figures = figures

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and LOSS in logs and self.step_state.figures is not None:
            self.last_record = self._build_record(logs)
            if self.state.is_world_process_zero:
                self.step_recorder.record(self.last_record)
            logs.update({k: v for k, v in self.last_record.items() if isinstance(v, (int, float)) and k != STEP})
        super().log(logs, start_time)

    def train(self, *args, **kwargs):
        """TRL's ``train``; the step recorder is flushed and fsynced when it returns or raises."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.step_recorder.close()

    def _build_record(self, logs: dict[str, float]) -> dict[str, Any]:
        """One metrics.jsonl row: step, rollout, update, the step's figures, the rollout's, timings."""
        step_state, self.step_state = self.step_state, StepState()  # the next step starts
        position = step_state.position
        record: dict[str, Any] = {
            STEP: self.state.global_step,
            ROLLOUT: position.rollout,
            UPDATE: position.update,
            REPLAY_PASS: position.replay_pass,
            REPLAY_MINIBATCH: position.minibatch,
            LEARNING_RATE: logs.get(LEARNING_RATE),
        }
        record.update(step_state.figures)
        record.update(self.rollout.figures)
        timings = step_state.timings
        record.update(timings)
        update_tokens = step_state.update_tokens * self.accelerator.num_processes
        record[UPDATE_TOKENS_PER_SECOND] = update_tokens / max(timings[UPDATE_SECONDS], 1e-9)
        rollout_time = timings[ROLLOUT_SECONDS]
        generated = self.rollout.figures.get(ROLLOUT_GENERATED_TOKENS, 0.0)
        record[GENERATION_TOKENS_PER_SECOND] = generated / rollout_time if rollout_time > 0 else None
        return record

    def save_state_after_failure(self) -> str:
        """Checkpoint the last good step (the failed step's gradients are dropped); returns its path."""
        path = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        self._step = self.state.global_step * self.args.gradient_accumulation_steps
        self.step_state = StepState()  # the failed step's figures go with its gradients
        if not os.path.isdir(path):
            self._save_checkpoint(self.model_wrapped, trial=None)
        return path


def tool_rollout_func(prompts: list, trainer: MiniMindToolGRPOTrainer) -> dict[str, list]:
    """TRL's ``rollout_func`` (``GRPOTrainer(rollout_func=...)``): the trainer's tool rollout."""
    return trainer.tool_rollout(prompts)


class MiniMindToolGRPOTrainer(MiniMindGRPOTrainer):
    """:class:`MiniMindGRPOTrainer` whose rollouts are multi-turn tool use, generated by the
    project's driver (`minimind_trl.envs.rollout.drive`, the one evaluation runs) through TRL's
    public ``rollout_func``: TRL's tool loop is not used, its rules are the driver's (`TurnRules`
    for training). Takes GRPOTrainer's arguments plus ``tool_registry`` (the tools the rollout
    runs and the parser reads; default `default_registry()`); the tool rounds are
    ``args.max_tool_calling_iterations``. Rows may carry ``open_thinking`` (the think opener of
    the row's prompt and tool turns; `envs.environment.with_open_thinking`); without it,
    ``chat_template_kwargs["open_thinking"]``. Reward functions get each completion as TRL's tool
    loop builds it (assistant and tool messages; `Trajectory.messages`)."""

    def __init__(self, *args, tool_registry: ToolRegistry | None = None, **kwargs):
        for name in ("rollout_func", "environment_factory", "tools"):
            if kwargs.get(name) is not None:
                raise ValueError(f"MiniMindToolGRPOTrainer runs its own rollout_func; {name}= is not accepted "
                                 "(pass tool_registry=)")
        super().__init__(*args, rollout_func=tool_rollout_func, **kwargs)
        turns = self.args.max_tool_calling_iterations
        if isinstance(turns, bool) or not isinstance(turns, int) or not 0 <= turns <= MAX_TOOL_TURNS:
            raise ValueError(f"max_tool_calling_iterations (rollout.max_tool_turns) must be an int in "
                             f"[0, {MAX_TOOL_TURNS}], got {turns!r}: a tool rollout needs a bound")
        self.tool_registry = default_registry() if tool_registry is None else tool_registry
        install_parse_guard(self._tokenizer)  # TRL parses each completion too; a parser failure is plain text

    def tool_rollout(self, prompts: list) -> dict[str, list]:
        """The rollout of this process's rows (``prompts``, each row once per generation, in
        order): TRL's ``rollout_func`` contract, per row ``prompt_ids``, ``completion_ids``,
        ``logprobs`` (each token's sampling log-prob, 0.0 on tool tokens) and ``env_mask`` (1 on
        the model's tokens). The trajectories stay in the rollout state for the rewards and the
        tool diagnostics."""
        state = self._generating
        schemas = self.tool_registry.schemas()
        default_thinking = bool(self.chat_template_kwargs.get("open_thinking", False))
        trajectories = []
        for i, (prompt, row) in enumerate(zip(prompts, state.inputs, strict=True)):
            flag = row.get("open_thinking")
            open_thinking = default_thinking if flag is None else bool(flag)
            tools, prompt_ids = task_prompt_ids(self._tokenizer, {"conversations": prompt}, open_thinking, schemas)
            trajectories.append(Trajectory(task_index=i, sample_index=0, task_id=row.get("id"),
                                           open_thinking=open_thinking, tools=tools, prompt_ids=prompt_ids))
        mode = "train" if self.model.training else "eval"
        config = self.generation_config
        sampling = Sampling(do_sample=bool(config.do_sample), temperature=config.temperature or 1.0,
                            top_k=config.top_k, top_p=1.0 if config.top_p is None else config.top_p,
                            seed=self.args.seed)
        if self.args.sampling_streams == "global_row":  # the same trajectories on any number of processes
            offset = self.accelerator.process_index * len(trajectories)  # blocks of rows, in process order
            stream, keys = f"{mode}:{self.state.global_step}", [offset + row for row in range(len(trajectories))]
        else:
            stream, keys = f"{mode}:{self.state.global_step}:{self.accelerator.process_index}", None
        rules = TurnRules(self.args.max_tool_calling_iterations, completion_tokens=self.max_completion_length,
                          context_tokens=self.model.config.max_position_embeddings)
        minimind = self.args.rollout_engine == "minimind"
        with self._generation_model(decode_copy=minimind) as model:
            training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    engine = None if minimind else functools.partial(self._padded_turns, model)
                    drive(model, self._tokenizer, trajectories, self.tool_registry, rules, sampling,
                          schedule="turn_by_turn", stream=stream, row_keys=keys, eos_token_ids=self.eos_token_ids,
                          turn_engine=engine)
            finally:
                model.train(training)
        state.trajectories = trajectories
        return {"prompt_ids": [t.prompt_ids for t in trajectories],
                "completion_ids": [t.completion_ids for t in trajectories],
                "logprobs": [t.logprobs for t in trajectories],
                "env_mask": [t.action_mask for t in trajectories]}

    def _padded_turns(self, model, contexts, budgets, row_keys):
        """``rollout.engine: trl``: a round of turns by transformers' padded ``generate`` with TRL's
        generation config (`engine.turns.padded_generate_turns`; row keys do not apply)."""
        return padded_generate_turns(model, contexts, budgets, self.eos_token_ids, self._tokenizer.pad_token_id,
                                     self.generation_config)
