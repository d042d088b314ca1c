"""The MiniMind agent-RL reward, re-implemented from its published formula for parity runs.

It reproduces the upstream components, weaknesses included (length shaping, a lenient
substring GT check in which "9" matches "2932", and GT values counted as a set). Per
completion, with ``turns`` the assistant turns, each turn's *answer* its text after the first
``</think>`` (stripped) and ``response`` the last turn's raw text:

* tag balance, always: −0.5 · Σ_turns |#``<tool_call>`` − #``</tool_call>``|;
* without any well-formed tool call:
  +0.5 if 5 ≤ len(response.strip()) ≤ 800 characters else −0.5; if ``</think>`` occurs:
  +1.0 if 20 ≤ len(think.strip()) ≤ 300 else −0.5 (think = text before the first
  ``</think>``) and +0.25 if ``</think>`` occurs exactly once else −0.25; plus the optional
  reward-model score of the answer; − rep_penalty(answer);
* with tool calls: a call is *valid* when its tool is one of the run's tools (the registry the
  reward is built with) and every required argument is present and non-empty (numbers: not
  null); gap = |valid − len(gt)| + (calls − valid); +0.5 if gap = 0 else −0.5·gap. The final
  text is "" when the trajectory is unfinished, else the last turn's answer after its last
  ``</tool_call>``; + 2.5 · |{g ∈ gt hit}| / len(gt)
  using `lenient_gt_hits`; −0.5 if unfinished; − rep_penalty(final text, or the answer when
  the final text is empty);
* the total is clipped to [−3, 3].

rep_penalty(text) = min(0.5, 2 · 0.5 · d / N) over the N word/punctuation 3-grams of the
lower-cased text (tokens ``\\w+`` or single non-space symbols), d = N − #distinct 3-grams;
0 when N = 0.
"""

from __future__ import annotations

import re
from typing import Callable

from minimind_trl.envs.registry import ToolRegistry
from minimind_trl.envs.tools import default_registry
from minimind_trl.rewards.rewards import RewardFunction, gt_column
from minimind_trl.rewards.trajectory import CompletionView, view_completion

_TOKENS = re.compile(r"\w+|[^\w\s]")
_PLAIN_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.])")


def rep_penalty(text: str, n: int = 3, cap: float = 0.5) -> float:
    """Repeated n-gram share, scaled by 2·cap and capped at cap (see the module docstring)."""
    tokens = _TOKENS.findall(text.lower())
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return min(cap, (len(grams) - len(set(grams))) * cap * 2 / len(grams))


def lenient_gt_hits(text: str, gt: list) -> set[str]:
    """The upstream GT check: g is hit when str(g) is a case-insensitive substring of the text,
    or g is a plain number equal (within 1e-6) to a plain number of the text (commas removed).
    Returns the hit values as strings (a set: repeated GT values count once)."""
    lowered = text.lower()
    numbers = [float(x) for x in _PLAIN_NUMBER.findall(text.replace(",", ""))]
    hits = set()
    for g in gt:
        s = str(g).strip()
        if not s:
            continue
        plain = s.replace(",", "")
        numeric = re.fullmatch(r"[-+]?\d+(?:\.\d+)?", plain) is not None
        if s.lower() in lowered or (numeric and any(abs(float(plain) - x) < 1e-6 for x in numbers)):
            hits.add(s)
    return hits


def _turn_answer(turn: str) -> str:
    return (turn.split("</think>", 1)[1] if "</think>" in turn else turn).strip()


def _valid_call(call: dict, registry: ToolRegistry, tool_names: set[str]) -> bool:
    if call["name"] not in tool_names or call["name"] not in registry:
        return False
    for param in registry.spec(call["name"]).params.values():
        if param.required:
            value = call["arguments"].get(param.name)
            empty = value is None if param.json_type in ("number", "integer") else not value
            if empty:
                return False
    return True


def minimind_agent_score(view: CompletionView, gt: list, registry: ToolRegistry,
                         tool_names: set[str] | None = None,
                         reward_model: Callable[[str], float] | None = None) -> float:
    """The upstream reward of one completion (formula in the module docstring)."""
    names = set(registry.names()) if tool_names is None else tool_names
    turns = view.turn_texts or [""]
    answers = [_turn_answer(t) for t in turns]
    reward = -0.5 * sum(abs(a.count("<tool_call>") - a.count("</tool_call>")) for a in answers)
    answer, response = answers[-1], turns[-1]
    if not view.calls:
        reward += 0.5 if 5 <= len(response.strip()) <= 800 else -0.5
        if "</think>" in response:
            think, answer = response.split("</think>", 1)
            reward += 1.0 if 20 <= len(think.strip()) <= 300 else -0.5
            reward += 0.25 if response.count("</think>") == 1 else -0.25
            answer = answer.strip()
        if reward_model is not None:
            reward += float(reward_model(answer))
        reward -= rep_penalty(answer)
    else:
        valid = sum(_valid_call(c, registry, names) for c in view.calls)
        gap = abs(valid - len(gt)) + max(0, len(view.calls) - valid)
        reward += 0.5 if gap == 0 else -0.5 * gap
        final = "" if view.unfinished else answer.split("</tool_call>")[-1]
        if gt:
            reward += 2.5 * len(lenient_gt_hits(final, gt)) / len(gt)
        if view.unfinished:
            reward -= 0.5
        reward -= rep_penalty(final if final else answer)
    return max(-3.0, min(3.0, reward))


def make_minimind_agent_reward(registry: ToolRegistry | None = None,
                               reward_model: Callable[[str], float] | None = None,
                               name: str = "minimind_agent_reward") -> RewardFunction:
    """The upstream agent reward as a TRL reward function. ``registry`` gives the tool names
    and required arguments a call is judged against: a run passes its own tools (its
    ``rollout.tools`` plugins, narrowed to ``rollout.tool_names``; see
    `minimind_trl.rewards.registry.build_reward_functions`); only when none is given are these the
    built-in tools. ``reward_model`` (answer text → score) is added on completions without tool
    calls, as upstream does."""
    registry = default_registry() if registry is None else registry

    def reward(prompts, completions, **kwargs) -> list[float]:
        gts = gt_column(kwargs, len(completions))
        return [minimind_agent_score(view_completion(c), g, registry, reward_model=reward_model)
                for c, g in zip(completions, gts)]

    reward.__name__ = reward.__qualname__ = name
    return reward


__all__ = ["lenient_gt_hits", "make_minimind_agent_reward", "minimind_agent_score",
           "rep_penalty"]
