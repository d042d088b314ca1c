"""TRL reward functions for GT-verified tool use.

Every function has TRL's signature ``f(prompts, completions, **kwargs) -> list[float]``; the
dataset column ``gt`` (one list of GT values per completion) arrives in ``kwargs``, and each
prompt's question (`prompt_question`: its last user message) goes to the verifier, which reads
from it whether the task asks for a percentage (`minimind_trl.rewards.verifier.asks_for_percentage`).
Completions may be strings or message lists (`minimind_trl.rewards.trajectory`). TRL logs each
function under its ``__name__`` (``rewards/<name>/mean``).

Default task reward, per completion (no length or repetition shaping):

    R = w_success · success + w_coverage · gt_coverage − w_malformed · [malformed > 0]

with success and gt_coverage from `verify` on the final answer and ``malformed`` the number of
malformed ``<tool_call>`` blocks; defaults w = (1.0, 0.5, 0.5), so R ∈ [−0.5, 1.5].
`make_task_reward` builds it with other weights. The same sum, logged per component, is
``reward_funcs=[success_reward, coverage_reward, format_reward]`` with
``reward_weights=[w_success, w_coverage, w_malformed]`` (`format_reward` is −1 or 0).
"""

from __future__ import annotations

import json
from typing import Callable

from minimind_trl.envs.protocol import message_text
from minimind_trl.rewards.trajectory import CompletionView, view_completion
from minimind_trl.rewards.verifier import Verification, verify

RewardFunction = Callable[..., list[float]]


def _gt_row(row) -> list:
    if isinstance(row, (list, tuple)):
        return list(row)
    if isinstance(row, str) and row.lstrip().startswith("["):
        try:
            parsed = json.loads(row)
        except ValueError:
            return [row]
        return parsed if isinstance(parsed, list) else [row]
    return [row]


def gt_column(kwargs: dict, n: int) -> list[list]:
    """The ``gt`` column, one list per completion (a row may also be one value, or a JSON list
    in a string — e.g. ``'[59, "20.5"]'``, as a dataset stores mixed-type lists); a clear
    error when the column is missing."""
    gt = kwargs.get("gt")
    if gt is None:
        raise KeyError("this reward needs the dataset column 'gt' (a list of GT values per row)")
    if len(gt) != n:
        raise ValueError(f"got {len(gt)} gt rows for {n} completions")
    return [_gt_row(row) for row in gt]


_USER_TURN = "<|im_start|>user"


def prompt_question(prompt) -> str:
    """The task's question in a prompt: the text of its last user message (a message list: TRL's
    conversational prompt, a task row's ``conversations``), or of the last user turn of a rendered
    prompt string (the whole string when it has no turn markers); "" for anything else."""
    if isinstance(prompt, str):
        start = prompt.rfind(_USER_TURN)
        if start < 0:
            return prompt
        return prompt[start + len(_USER_TURN):].split("<|im_end|>", 1)[0].strip()
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return message_text(users[-1].get("content")) if users else ""
    return ""


def question_column(prompts, n: int) -> list[str]:
    """One question per completion (`prompt_question`); all "" when the caller passes no prompts."""
    if prompts is None:
        return [""] * n
    if len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompts for {n} completions")
    return [prompt_question(p) for p in prompts]


def evaluate_completion(completion, gt: list, verifier: Callable = verify, question: str = ""
                        ) -> tuple[CompletionView, Verification]:
    """(view, verification) of one completion: the final answer checked against ``gt``, with
    the completion's tool observations as possible backing and the task's ``question``."""
    view = view_completion(completion)
    return view, verifier(view.final_answer, gt, tool_results=view.observations, question=question)


def _per_completion(prompts, completions, kwargs, score: Callable[[CompletionView, Verification], float]
                    ) -> list[float]:
    gts = gt_column(kwargs, len(completions))
    questions = question_column(prompts, len(completions))
    return [float(score(*evaluate_completion(c, g, question=q))) for c, g, q in zip(completions, gts, questions)]


def success_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the final answer states every GT value (`Verification.success`), else 0.0."""
    return _per_completion(prompts, completions, kwargs, lambda view, v: v.success)


def coverage_reward(prompts, completions, **kwargs) -> list[float]:
    """The fraction of GT values stated in the final answer (`Verification.gt_coverage`)."""
    return _per_completion(prompts, completions, kwargs, lambda view, v: v.gt_coverage)


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """−1.0 when the completion has a malformed ``<tool_call>`` block, else 0.0."""
    return [-1.0 if view_completion(c).malformed else 0.0 for c in completions]


def make_task_reward(success_weight: float = 1.0, coverage_weight: float = 0.5,
                     malformed_penalty: float = 0.5, name: str = "task_reward") -> RewardFunction:
    """R = success_weight·success + coverage_weight·gt_coverage − malformed_penalty·[malformed]."""

    def reward(prompts, completions, **kwargs) -> list[float]:
        return _per_completion(
            prompts, completions, kwargs,
            lambda view, v: success_weight * v.success + coverage_weight * v.gt_coverage
            - malformed_penalty * (view.malformed > 0))

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (f"{name} = {success_weight:g}·success + {coverage_weight:g}·gt_coverage "
                      f"− {malformed_penalty:g}·[malformed tool call]")
    return reward


task_reward = make_task_reward()
