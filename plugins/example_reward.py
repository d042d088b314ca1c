"""Example reward plugin: credit only answers whose GT values a tool actually produced.

Load it by file path (`minimind_trl.rewards.registry`:
``get_reward_function("plugins/example_reward.py:tool_backed_success_reward")``, or in a recipe
``rewards: [{name: "plugins/example_reward.py:tool_backed_success_reward", weight: 1.0}]``) or,
once the file has been imported, by its registered name ``"tool_backed_success"``.

    R = 1 if the final answer states every GT value and some successful tool result matches a
        GT value (`Verification.success and Verification.tool_backed`), else 0.

A reward function takes TRL's arguments ``(prompts, completions, **kwargs)``; the dataset
column ``gt`` arrives in ``kwargs``. It returns one float per completion.
"""

from minimind_trl.rewards import evaluate_completion
from minimind_trl.rewards.registry import register_reward_function
from minimind_trl.rewards.rewards import gt_column, question_column


@register_reward_function("tool_backed_success")
def tool_backed_success_reward(prompts, completions, **kwargs):
    """1.0 for a verified answer backed by a tool result, else 0.0."""
    rewards = []
    questions = question_column(prompts, len(completions))
    for completion, gt, question in zip(completions, gt_column(kwargs, len(completions)), questions):
        _, verification = evaluate_completion(completion, gt, question=question)
        rewards.append(float(verification.success and verification.tool_backed))
    return rewards
