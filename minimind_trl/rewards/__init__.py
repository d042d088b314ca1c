"""Rewards for GT-verified tool use: the verifier and TRL reward functions. (Trajectory metrics:
training logs in `minimind_trl.trainer`, evaluation in `minimind_trl.eval.metrics`.)

Importing this package registers the built-in names with `minimind_trl.plugins`:

* reward functions: ``task_reward`` (a factory: options ``success_weight``,
  ``coverage_weight``, ``malformed_penalty``), ``success_reward``, ``coverage_reward``,
  ``format_reward``, ``minimind_agent_reward`` (upstream parity; factory), ``reward_model``
  (factory; option ``path``);
* verifiers: ``gt`` (`verify`).
"""

from minimind_trl.plugins import (
    register_reward_factory,
    register_reward_function,
    register_verifier,
)
from minimind_trl.rewards.numbers import NumberMention, extract_numbers, find_numbers
from minimind_trl.rewards.reward_model import RewardModelScorer, make_reward_model_reward
from minimind_trl.rewards.rewards import (
    coverage_reward,
    evaluate_completion,
    format_reward,
    make_task_reward,
    success_reward,
    task_reward,
)
from minimind_trl.rewards.trajectory import CompletionView, view_completion
from minimind_trl.rewards.upstream import lenient_gt_hits, make_minimind_agent_reward, rep_penalty
from minimind_trl.rewards.verifier import Verification, final_answer_text, verify

register_reward_factory("task_reward")(make_task_reward)
register_reward_factory("minimind_agent_reward")(make_minimind_agent_reward)
register_reward_factory("reward_model")(make_reward_model_reward)
for _func in (success_reward, coverage_reward, format_reward):
    register_reward_function()(_func)
register_verifier("gt")(verify)

__all__ = [
    "CompletionView", "NumberMention", "RewardModelScorer", "Verification",
    "coverage_reward", "evaluate_completion", "extract_numbers", "final_answer_text",
    "find_numbers", "format_reward", "lenient_gt_hits", "make_minimind_agent_reward",
    "make_reward_model_reward", "make_task_reward", "rep_penalty",
    "success_reward", "task_reward", "verify", "view_completion",
]
