"""Rewards for GT-verified tool use: the verifier and TRL reward functions. (Trajectory metrics:
training logs in `minimind_trl.trainer`, evaluation in `minimind_trl.eval.metrics`.)

The registries live in `minimind_trl.rewards.registry`: built-in reward names

* ``task_reward`` (a factory: options ``success_weight``, ``coverage_weight``,
  ``malformed_penalty``), ``success_reward``, ``coverage_reward``, ``format_reward``,
  ``minimind_agent_reward`` (upstream parity; factory given the run's tools), ``reward_model``
  (factory; option ``path``);
* verifiers: ``gt`` (`verify`);

plugin names by `register_reward_function` / `register_reward_factory` / `register_verifier`, and a
run's rewards built by `build_reward_functions(specs, registry)` with the run's `ToolRegistry`.
"""

from minimind_trl.rewards.numbers import NumberMention, extract_numbers, find_numbers
from minimind_trl.rewards.registry import (
    build_reward_functions,
    get_reward_function,
    get_verifier,
    register_reward_factory,
    register_reward_function,
    register_verifier,
    reward_function_names,
    uses_tool_registry,
)
from minimind_trl.rewards.reward_model import RewardModelScorer, make_reward_model_reward
from minimind_trl.rewards.rewards import (
    coverage_reward,
    evaluate_completion,
    format_reward,
    make_task_reward,
    prompt_question,
    success_reward,
    task_reward,
)
from minimind_trl.rewards.trajectory import CompletionView, view_completion
from minimind_trl.rewards.upstream import lenient_gt_hits, make_minimind_agent_reward, rep_penalty
from minimind_trl.rewards.verifier import Verification, final_answer_text, verify

__all__ = [
    "CompletionView", "NumberMention", "RewardModelScorer", "Verification", "build_reward_functions",
    "coverage_reward", "evaluate_completion", "extract_numbers", "final_answer_text",
    "find_numbers", "format_reward", "get_reward_function", "get_verifier", "lenient_gt_hits",
    "make_minimind_agent_reward", "make_reward_model_reward", "make_task_reward", "prompt_question",
    "register_reward_factory", "register_reward_function", "register_verifier", "rep_penalty",
    "reward_function_names", "success_reward", "task_reward", "uses_tool_registry", "verify",
    "view_completion",
]
