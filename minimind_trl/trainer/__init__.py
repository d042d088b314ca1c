"""Training: the GRPOTrainer subclass, its config, diagnostics, run folders, recipes, the CLI.

Public names (imported lazily, so ``minimind-trl train --help`` does not load TRL):
:class:`MiniMindGRPOConfig`, :class:`MiniMindGRPOTrainer`, :class:`MiniMindToolGRPOTrainer`,
:class:`NonFiniteError`, :func:`load_recipe`, :func:`run_training`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MiniMindGRPOConfig": "minimind_trl.trainer.config",
    "MiniMindGRPOTrainer": "minimind_trl.trainer.grpo_trainer",
    "MiniMindToolGRPOTrainer": "minimind_trl.trainer.grpo_trainer",
    "NonFiniteError": "minimind_trl.trainer.grpo_trainer",
    "load_recipe": "minimind_trl.trainer.recipe",
    "run_training": "minimind_trl.trainer.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
