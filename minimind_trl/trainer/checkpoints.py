"""Atomic Trainer checkpoints that also hold the GRPO rollout buffer.

HF's ``Trainer._save_checkpoint`` writes ``checkpoint-N`` in place, so a kill mid-save leaves a
half-written folder that ``get_last_checkpoint`` would pick. Here the whole checkpoint (HF's
files plus one ``rollout_state_{rank}.pt`` per process) is written under
``.staging-checkpoint-N/`` (``args.output_dir`` points there while HF's writer runs), then committed as
``checkpoint-N`` by :func:`minimind_trl.fsio.commit_directory` (every file and folder fsynced, then
renamed; a checkpoint of the same step is replaced by the aside-and-swap renames): the previous
checkpoint stays the newest complete one until the rename. The rollout state (TRL's buffered
micro-batches with their frozen old log-probs, its micro-step counter and the rollout's figures)
makes a resume in the middle of a rollout replay exactly the updates an uninterrupted run would
take, and :class:`EpochReplaySampler` gives a resume in a later epoch the uninterrupted run's prompt order.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch.utils.data import Sampler
from transformers.trainer_utils import rotate_checkpoints

from minimind_trl.fsio import commit_directory, staging_path
from minimind_trl.trainer.rollout_state import RolloutState

ROLLOUT_STATE = "rollout_state_{rank}.pt"


class EpochReplaySampler(Sampler):
    """TRL's ``RepeatSampler`` draws each epoch's order from one generator seeded once, so the
    fresh sampler of a run resumed in epoch e >= 1 gave epoch 0's order. HF's loop calls
    ``set_epoch(e)`` before every epoch: here it re-seeds the generator and draws the e earlier
    permutations, so epoch e has the uninterrupted run's order, resumed or not (unchanged for an
    uninterrupted run)."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        inner = self.sampler
        if getattr(inner, "shuffle", False) and inner.seed is not None:
            inner.generator.manual_seed(inner.seed)
            for _ in range(epoch):
                torch.randperm(inner.num_samples, generator=inner.generator)


class AtomicCheckpointMixin:
    """Mix into a GRPOTrainer subclass (before it in the bases)."""

    def _get_train_sampler(self, dataset=None):
        return EpochReplaySampler(super()._get_train_sampler(dataset))

    def _save_checkpoint(self, model, trial) -> None:
        if trial is not None:
            raise ValueError("atomic checkpoints do not support hyperparameter-search trials")
        run_dir = self.args.output_dir
        name = f"checkpoint-{self.state.global_step}"
        staging = str(staging_path(os.path.join(run_dir, name)))
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self.args.output_dir = staging  # HF's writer puts checkpoint-N under the output dir: the staging one
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = run_dir
        self._save_rollout_state(os.path.join(staging, name))
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            commit_directory(os.path.join(staging, name), os.path.join(run_dir, name))
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(run_dir, save_total_limit=self.args.save_total_limit)
        self.accelerator.wait_for_everyone()

    def _save_rollout_state(self, folder: str) -> None:
        """This process's rollout buffer, micro-step counter and rollout figures."""
        os.makedirs(folder, exist_ok=True)
        buffered = None
        if self._buffered_inputs is not None:
            buffered = [
                {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                for batch in self._buffered_inputs
            ]
        state = {"step": self._step, "buffered_inputs": buffered, "rollout_stats": self.rollout.figures}
        path = os.path.join(folder, ROLLOUT_STATE.format(rank=self.accelerator.process_index))
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, ROLLOUT_STATE.format(rank=self.accelerator.process_index))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: checkpoint has no rollout state for this process (world size changed?)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        device = self.accelerator.device
        self._step = state["step"]
        # the saved buffer was replayed (old log-probs frozen) before it was saved
        self.rollout = RolloutState(figures=state["rollout_stats"], replayed=True)
        if state["buffered_inputs"] is not None:
            self._buffered_inputs = [
                {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                for batch in state["buffered_inputs"]
            ]

