"""Training: the GRPOTrainer subclass, its config, diagnostics, run folders, recipes and kinds, the CLI.

Public names, each resolved from its module on first use: :class:`MiniMindGRPOConfig`,
:class:`MiniMindGRPOTrainer`, :class:`MiniMindToolGRPOTrainer`, :class:`NonFiniteError`,
:func:`load_recipe`, :func:`get_kind`, :func:`run_training`. The package imports none of its
modules itself: importing one of them (``minimind_trl.sft`` imports ``trainer.policy_pass``) then
loads only what that one needs, and no module below the trainer closes a circle through here.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MiniMindGRPOConfig": "minimind_trl.trainer.config",
    "MiniMindGRPOTrainer": "minimind_trl.trainer.grpo_trainer",
    "MiniMindToolGRPOTrainer": "minimind_trl.trainer.grpo_trainer",
    "NonFiniteError": "minimind_trl.trainer.grpo_trainer",
    "load_recipe": "minimind_trl.trainer.recipe",
    "get_kind": "minimind_trl.trainer.kinds",
    "run_training": "minimind_trl.trainer.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
