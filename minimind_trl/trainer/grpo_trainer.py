"""`MiniMindGRPOTrainer`: TRL's GRPOTrainer with our objectives, exact fixed-K replay and diagnostics.

What is overridden, and why (TRL 1.16):

* ``_calculate_rewards``: keeps the gathered ``[N_global, F]`` reward matrix (and per-trajectory
  tool-call counts) for the advantage and diagnostics below.
* ``_generate_and_score_completions``: runs TRL's with its own old-log-prob pass switched off,
  then replaces ``advantages`` with :func:`minimind_trl.objectives.compute_advantages` of the
  weighted reward sum (laid out group by group, all processes), and adds the rollout-wide counts
  the loss weighting needs.
* ``_prepare_inputs``: when TRL has just generated and split a rollout, freezes the old
  log-probs micro-batch by micro-batch, with exactly the forward call, rows, padding and dtype the
  update pass will use, so update 0's ratio is exactly 1 (not only on CPU).
* ``_compute_loss``: :func:`minimind_trl.objectives.compute_policy_loss`, weighted so that the
  gradient of an optimizer step does not depend on how the rollout is split (see "Weighting").
* ``_get_per_token_logps_and_entropies`` (TRL's one log-prob function, also used for the
  reference model): with ``prefix_sharing`` the prefix-shared pass of
  :mod:`minimind_trl.trainer.policy_pass`, which the replay and the updates use as well.
* ``_get_grad_norm``: closes the step: reduces its figures over processes, stops the run on a
  non-finite loss or gradient (before ``optimizer.step``).
* ``log``: adds the step record to the logs (reporters) and exposes it to the metrics callback.
* ``_save_checkpoint`` / ``_get_output_dir`` / ``_load_optimizer_and_scheduler``: atomic
  checkpoints holding the rollout buffer (:mod:`minimind_trl.trainer.checkpoints`).

Weighting (split invariance). Per rollout, over all processes: ``R`` rows with at least one action
token and ``N`` action tokens. A micro-batch with ``r`` valid rows, ``n`` action tokens, policy
loss ``p`` (the objective's mean over its own rows, or tokens for ``token_mean``) and KL token
mean ``k`` contributes ``W * (p * r / R + beta * k * n / N)`` (``W`` = number of processes, since
DDP averages gradients). Summed over micro-batches and averaged over processes this is exactly
the objective's mean over the whole rollout (``token_mean``: ``p * n / N``), whatever the
per-device batch size, accumulation steps, process count or a shorter last window. The MoE aux
loss (batch statistics, not split-invariant by nature) enters as its row-weighted mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any

import torch
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import split_tensor_dict

from minimind_trl.envs.environment import ToolEnvironmentMixin, is_error_observation
from minimind_trl.objectives import PolicyBatch, compute_advantages, compute_policy_loss, k3_kl, reduce_loss
from minimind_trl.trainer.callbacks import DiagnosticsCallback
from minimind_trl.trainer.checkpoints import AtomicCheckpointMixin
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.moe import RouterRecorder, finalize_counts
from minimind_trl.trainer.policy_pass import (
    build_layout,
    install_shared_forward,
    supports_shared_forward,
    use_minimind_aux_loss,
)
from minimind_trl.trainer.stats import StepAccumulator

_ROW_WEIGHTED = ("seq_ratio", "gspo_seq")  # per-sequence metrics of the objectives module
_TIMING_KEYS = ("rollout_seconds", "old_logp_seconds", "update_seconds")


class NonFiniteError(RuntimeError):
    """A non-finite reward, loss or gradient: the run stops before the optimizer step."""


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
    After each optimizer step ``last_record`` holds the step's diagnostics, which the built-in
    :class:`DiagnosticsCallback` appends to ``output_dir/metrics.jsonl``.
    """

    loss_is_scaled_for_ga = True  # _compute_loss applies the whole weighting itself

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, MiniMindGRPOConfig):
            raise TypeError(f"args must be a MiniMindGRPOConfig, got {type(config).__name__}")
        super().__init__(*args, **kwargs)
        self.objective = self.args.objective_config()
        self._policy_objective = dataclasses.replace(self.objective, beta=0.0)  # KL is weighted apart
        self.router_recorder = RouterRecorder.for_model(self.model) if self.args.moe_diagnostics else None
        self._setup_policy_passes()
        self._step_stats = StepAccumulator()
        self._rollout_stats: dict[str, Any] = {}
        self._timings = dict.fromkeys(_TIMING_KEYS, 0.0)
        self._update_tokens = 0.0
        self._nonfinite: list[str] = []
        self._pending: dict[str, float] | None = None
        self._last_rewards_per_func: torch.Tensor | None = None
        self._last_tool_counts: list[tuple[int, int, int]] = []  # (calls, failed, malformed) per local row
        self.last_record: dict[str, Any] | None = None
        self.diagnostics = DiagnosticsCallback(self, os.path.join(self.args.output_dir, self.args.metrics_file))
        self.add_callback(self.diagnostics)

    def _setup_policy_passes(self) -> None:
        """MiniMind's aux loss in TRL's fused pass; the prefix-shared pass on policy and reference."""
        models = [self.model, self.ref_model] if self.ref_model is not None else [self.model]
        for model in models:
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            if getattr(base.config, "use_moe", False):
                use_minimind_aux_loss(base)
            if self.args.prefix_sharing:
                if not supports_shared_forward(base):
                    raise ValueError(
                        f"training.prefix_sharing needs a MiniMind / Qwen3-layout model, got {type(base).__name__}; "
                        "set training.prefix_sharing: false"
                    )
                install_shared_forward(base)

    # ------------------------------------------------------------------ rollout

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # [N_global, F], all processes, group by group
        records = [getattr(env, "record", None) for env in (self.environments or [])]
        if records and all(record is not None for record in records):  # ToolEnvironmentMixin's records
            self._last_tool_counts = [
                (r.valid_calls + r.failed_calls, r.failed_calls, r.malformed_calls) for r in records
            ]
        else:
            self._last_tool_counts = [(*_tool_counts(c), 0) for c in completions]  # local rows
        return rewards_per_func

    @contextlib.contextmanager
    def _trl_old_logps_off(self):
        """TRL computes old log-probs when ``GA % (steps_per_generation * num_iterations) != 0``;
        with ``num_iterations`` seen as 1 it does not, and :meth:`_freeze_old_logps` does it instead."""
        saved = self.num_iterations
        self.num_iterations = 1
        try:
            yield
        finally:
            self.num_iterations = saved

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        start = time.perf_counter()
        with self._trl_old_logps_off():
            output = super()._generate_and_score_completions(inputs)
        rewards_per_func = self._last_rewards_per_func  # [N, F]
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
        output["rollout_valid_rows"], output["rollout_action_tokens"] = counts[0], counts[1]
        output["rollout_local_rows"] = torch.tensor(float(local), device=counts.device)
        self._rollout_stats = self._describe_rollout(output, rewards_per_func, rewards, mask, counts)
        self._timings["rollout_seconds"] += time.perf_counter() - start
        return output

    def _describe_rollout(self, output, rewards_per_func, rewards, mask, counts) -> dict[str, Any]:
        """Rollout-wide figures (all processes): rewards, groups, lengths, truncation, tool use."""
        completion_mask = output["completion_mask"]
        lengths = completion_mask.sum(dim=1)  # [B]
        last = output["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ends = torch.tensor([*self.eos_token_ids, self._tokenizer.pad_token_id], device=last.device)
        truncated = (lengths == 0) | ~torch.isin(last, ends)
        tools = torch.tensor(self._last_tool_counts or [(0, 0, 0)] * len(lengths), device=lengths.device).float()
        per_row = torch.stack([lengths.float(), mask.sum(dim=1).float(), truncated.float()], 1)  # [B, 3]
        per_row = self.accelerator.gather(torch.cat([per_row, tools], dim=1))  # [N, 6]
        grouped = rewards.view(-1, self.num_generations)
        stats: dict[str, Any] = {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "zero_std_group_fraction": (grouped == grouped[:, :1]).all(dim=1).float().mean().item(),
        }
        for i, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, i]
            stats[f"reward/{name}_mean"] = column.mean().item()
            stats[f"reward/{name}_std"] = column.std().item() if column.numel() > 1 else 0.0
        calls, failures = per_row[:, 3], per_row[:, 4]
        stats.update(
            {
                "completion_tokens_mean": per_row[:, 0].mean().item(),
                "completion_tokens_max": per_row[:, 0].max().item(),
                "action_tokens_mean": per_row[:, 1].mean().item(),
                "truncation_rate": per_row[:, 2].mean().item(),
                "tool_calls_per_trajectory": calls.mean().item(),
                "tool_valid_per_trajectory": (calls - failures).mean().item(),
                "tool_failures_per_trajectory": failures.mean().item(),
                "tool_malformed_per_trajectory": per_row[:, 5].mean().item(),
                "rollout_valid_rows": counts[0].item(),
                "rollout_action_tokens": counts[1].item(),
                "rollout_generated_tokens": per_row[:, 0].sum().item(),
            }
        )
        return stats

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._buffered_inputs is not previous:  # a rollout was just generated, shuffled and split
            if self.args.prefix_sharing and len(self._buffered_inputs) > 1:
                self._buffered_inputs = _regroup_by_prompt(self._buffered_inputs)
                inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
            self._freeze_old_logps(self._buffered_inputs)
        return inputs

    @torch.no_grad()
    def _freeze_old_logps(self, micro_batches: list[dict[str, Any]]) -> None:
        """Old log-probs (and router choices) of the not yet updated policy, per training micro-batch."""
        if self.num_iterations == 1:
            return  # the single update uses per_token_logps.detach(): ratio exactly 1
        start = time.perf_counter()
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for batch in micro_batches:
                logps, _, _, router = self._policy_forward(self.model_wrapped, batch, keep_topk=True)
                batch["old_per_token_logps"] = logps
                if router is not None:
                    batch["old_router_topk"] = router
        self._timings["old_logp_seconds"] += time.perf_counter() - start

    # ------------------------------------------------------------------ update

    def _policy_forward(self, model, inputs, keep_topk: bool = False):
        """The one forward both passes use: (logps [B,C], entropies [B,C], aux, router topk or counts)."""
        if self.args.prefix_sharing:
            return self._shared_policy_forward(model, inputs, keep_topk)
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
                compute_entropy=True,
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

    def _shared_policy_forward(self, model, inputs, keep_topk: bool):
        """:meth:`_policy_forward` through the prefix-shared pass; router statistics weighted per row."""
        layout = build_layout(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                              inputs["completion_mask"])
        recorder = self.router_recorder
        capture = recorder.capture() if recorder is not None else contextlib.nullcontext(None)
        with capture as router_logits:
            out = self._shared_pass(model, layout, compute_entropy=True, compute_aux_loss=self.aux_loss_enabled)
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
                         compute_aux_loss=compute_aux_loss, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)

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
        mask = self._action_mask(inputs).bool()  # [B, C]
        logps, entropies, aux, router = self._policy_forward(model, inputs)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps")
        out = compute_policy_loss(PolicyBatch(logps, old, inputs["advantages"], mask, ref), self._policy_objective)
        rows, tokens = out.metrics["num_valid_rows"], out.metrics["num_action_tokens"]

        world = float(self.accelerator.num_processes)
        if "rollout_valid_rows" in inputs:  # training: rollout-wide weights
            total_rows = float(inputs["rollout_valid_rows"].clamp(min=1))
            total_tokens = float(inputs["rollout_action_tokens"].clamp(min=1))
            row_share = mask.size(0) / float(inputs["rollout_local_rows"])
        else:  # evaluation: this batch alone
            total_rows, total_tokens, row_share, world = max(rows, 1.0), max(tokens, 1.0), 1.0, 1.0
        share = tokens / total_tokens if self.objective.reduction == "token_mean" else rows / total_rows
        loss = out.loss * (share * world)
        kl_part = torch.zeros((), device=logps.device)
        if self.objective.beta > 0:
            zero = torch.zeros((), device=logps.device)
            masked_logps, masked_ref = torch.where(mask, logps.float(), zero), torch.where(mask, ref.float(), zero)
            kl_mean = reduce_loss(k3_kl(masked_logps, masked_ref), mask, "token_mean")
            kl_part = kl_mean * (tokens / total_tokens)
            loss = loss + self.objective.beta * kl_part * world
        if aux is not None:
            loss = loss + self.router_aux_loss_coef * aux * row_share

        if self.model.training:
            self._record_micro_batch(loss, out, kl_part, entropies, mask, aux, router, share, world)
        self._update_tokens += float(torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1).sum())
        return loss

    def _record_micro_batch(self, loss, out, kl_part, entropies, mask, aux, router, share, world) -> None:
        stats, metrics = self._step_stats, out.metrics
        rows, tokens = metrics["num_valid_rows"], metrics["num_action_tokens"]
        finite = bool(torch.isfinite(loss.detach()))
        if not finite:
            self._nonfinite.append(
                f"loss={loss.item()} (policy_loss={metrics['policy_loss']}, max_abs_log_ratio="
                f"{metrics['max_abs_log_ratio']}, aux={None if aux is None else float(aux)})"
            )
        stats.add_max("nonfinite_loss", 0.0 if finite else 1.0)
        stats.add_sum("loss", loss.detach() / world)
        stats.add_sum("policy_loss", metrics["policy_loss"] * share)
        stats.add_sum("kl", kl_part.detach())
        stats.add_sum("num_action_tokens", tokens)
        stats.add_mean("entropy", (entropies.detach() * mask).sum() / max(tokens, 1.0), tokens)
        for name, value in metrics.items():
            if name in ("loss", "policy_loss", "kl", "num_action_tokens", "num_valid_rows"):
                continue
            if name.endswith("_min"):
                stats.add_min(name, value)
            elif name.endswith("_max") or name == "max_abs_log_ratio":
                stats.add_max(name, value)
            else:
                stats.add_mean(name, value, rows if name.startswith(_ROW_WEIGHTED) else tokens)
        if aux is not None:
            stats.add_mean("aux_loss", aux.detach(), mask.size(0))
        for name, value in (router or {}).items():
            stats.add_sum(name, value)

    def training_step(self, model, inputs, num_items_in_batch):
        before = self._timings["rollout_seconds"] + self._timings["old_logp_seconds"]
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        elapsed = time.perf_counter() - start
        spent_on_rollout = self._timings["rollout_seconds"] + self._timings["old_logp_seconds"] - before
        self._timings["update_seconds"] += elapsed - spent_on_rollout
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self.model.training:
            self._finish_step(None if grad_norm is None else float(grad_norm))
        return grad_norm

    def _finish_step(self, grad_norm: float | None) -> None:
        """Reduce the step's figures over processes; stop on a non-finite loss or gradient."""
        figures = self._step_stats.reduce(self.accelerator)
        self._step_stats = StepAccumulator()
        step = self.state.global_step + 1
        loss_bad = figures.pop("nonfinite_loss", 0.0) > 0
        if loss_bad or (grad_norm is not None and not math.isfinite(grad_norm)):
            detail = "; ".join(self._nonfinite) or (
                "the loss was non-finite on another process" if loss_bad else "every loss was finite, the gradient was not"
            )
            raise NonFiniteError(
                f"non-finite loss or gradient at step {step} (grad_norm={grad_norm}): {detail}. "
                "The optimizer step was not taken."
            )
        moe = {k: figures.pop(k) for k in list(figures) if k.startswith("moe.")}
        if moe and self.router_recorder is not None:
            figures.update(finalize_counts(moe, self.router_recorder.num_experts))
        figures["grad_norm"] = grad_norm
        self._nonfinite.clear()
        self._pending = figures

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and "loss" in logs and self._pending is not None:
            self.last_record = self._build_record(logs)
            logs.update({k: v for k, v in self.last_record.items() if isinstance(v, (int, float)) and k != "step"})
        super().log(logs, start_time)

    def _build_record(self, logs: dict[str, float]) -> dict[str, Any]:
        """One metrics.jsonl row: step, rollout, update, the step's figures, the rollout's, timings."""
        index = self.state.global_step - 1
        figures, self._pending = self._pending, None
        record: dict[str, Any] = {
            "step": self.state.global_step,
            "rollout": index // self.num_iterations,
            "update": index % self.num_iterations,
            "learning_rate": logs.get("learning_rate"),
        }
        record.update(figures)
        record.update(self._rollout_stats)
        timings, self._timings = self._timings, dict.fromkeys(_TIMING_KEYS, 0.0)
        record.update(timings)
        update_tokens = self._update_tokens * self.accelerator.num_processes
        self._update_tokens = 0.0
        record["update_tokens_per_second"] = update_tokens / max(timings["update_seconds"], 1e-9)
        rollout_time = timings["rollout_seconds"]
        generated = self._rollout_stats.get("rollout_generated_tokens", 0.0)
        record["generation_tokens_per_second"] = generated / rollout_time if rollout_time > 0 else None
        return record

    def save_state_after_failure(self) -> str:
        """Checkpoint the last good step (the failed step's gradients are dropped); returns its path."""
        path = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        self._step = self.state.global_step * self.args.gradient_accumulation_steps
        self._step_stats = StepAccumulator()
        self._nonfinite.clear()
        if not os.path.isdir(path):
            self._save_checkpoint(self.model_wrapped, trial=None)
        return path


class MiniMindToolGRPOTrainer(ToolEnvironmentMixin, MiniMindGRPOTrainer):
    """:class:`MiniMindGRPOTrainer` with the tool environment's hooks (registry schemas in the
    prompt, per-row think opener, per-trajectory records used by the tool diagnostics); pass a
    ``make_environment_class`` class as ``environment_factory``."""
