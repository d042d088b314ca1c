"""Errors a training run stops on, shared by every kind (no trainer class imported here, so an SFT,
DPO or distillation run does not import TRL's GRPOTrainer to know them)."""

from __future__ import annotations


class NonFiniteError(RuntimeError):
    """A non-finite reward, loss or gradient: the run stops before the optimizer step."""


class NonFiniteStateError(NonFiniteError):
    """Non-finite weights or policy found after an optimizer step (``run.CheckFiniteWeights``):
    the state in memory is not the last good step's and is not saved."""
