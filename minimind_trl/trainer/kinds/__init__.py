"""Training kinds: what each recipe ``kind:`` owns, in one registry (as the objectives have theirs).

A :class:`TrainingKind` holds everything that differs between kinds:

* its recipe sections (key -> default, :data:`REQUIRED` when the recipe must set it), the value
  tests of their keys, the top-level keys it owns (``rewards`` for grpo) and its cross-key checks;
* its training-config class (its fields are the allowed ``training`` keys), the ``training`` keys
  a section sets instead (``num_generations`` -> ``rollout.group_size``), and how a resolved recipe
  becomes that config;
* its dataset builder (rows of ``data.path/<split>.jsonl`` -> the trainer's dataset) and its
  trainer builder;
* whether the optional ``peft`` section and ``data.eval_split`` apply, the plugins it resolves
  before a model is built, and what the manifest records about its objective.

The loader (:mod:`minimind_trl.trainer.recipe`), the builders (:mod:`minimind_trl.trainer.build`)
and the CLI dispatch through :func:`get_kind`; none of them branches on the kind's name.

Kinds: ``grpo`` (our GRPOTrainer subclass with the tool environment; sections ``objective``,
``rollout``, top-level ``rewards``), ``sft`` (``MiniMindSFTTrainer``: assistant-only SFT, or
``sft.mode: pretrain`` on ``{"text"}`` rows), ``dpo`` (TRL ``DPOTrainer`` on ``{"chosen",
"rejected"}`` conversation rows) and ``distill`` (TRL ``DistillationTrainer``: on-policy
generalized-JSD distillation from a teacher, tools included) and ``reward`` (TRL
``RewardTrainer``: a sequence-classification reward model for E4 from task rows' GT answers and
near misses). The objective section's keys are
``preset`` plus the fields of :class:`~minimind_trl.objectives.ObjectiveConfig` themselves.
"""

# Each module registers its kind when imported; the order is the registry's (messages, --help).
# isort: off
from minimind_trl.trainer.kinds import grpo  # noqa: F401
from minimind_trl.trainer.kinds import sft  # noqa: F401
from minimind_trl.trainer.kinds import dpo  # noqa: F401
from minimind_trl.trainer.kinds import distill  # noqa: F401
from minimind_trl.trainer.kinds import reward  # noqa: F401
# isort: on
from minimind_trl.trainer.kinds.registry import TrainingKind, get_kind, kind_names, register_kind, registered_kinds

__all__ = ["TrainingKind", "get_kind", "kind_names", "register_kind", "registered_kinds"]
