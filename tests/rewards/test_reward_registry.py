"""The reward registry: built-in names, options, and a run's tools injected into the rewards that
judge tool calls (`build_reward_functions(specs, registry)`)."""

import json

import pytest

from minimind_trl.envs.tools import run_registry
from minimind_trl.plugins import PluginError
from minimind_trl.rewards import registry as reward_registry
from minimind_trl.rewards.registry import (
    BUILTIN_REWARDS,
    build_reward_functions,
    get_reward_function,
    register_reward_factory,
    reward_function_names,
    uses_tool_registry,
)
from minimind_trl.rewards.rewards import format_reward, success_reward

PARITY = [{"name": "minimind_agent_reward", "weight": 1.0, "options": {}}]
INTEREST = {"principal": 1000, "annual_rate_percent": 5, "years": 2}  # 1000 · 1.05² = 1102.5
CONVERSION = {"value": 2, "from_unit": "km", "to_unit": "m"}


@pytest.fixture
def tool_plugin(repo_root):
    return str(repo_root / "plugins" / "example_tool.py")


def one_call(name: str, arguments: dict, observation: str, answer: str) -> str:
    """A completion with one tool call, its response and a final answer."""
    call = json.dumps({"name": name, "arguments": arguments})
    return (f"<tool_call>\n{call}\n</tool_call>\n<tool_response>\n{observation}\n</tool_response>\n"
            f"{answer}")


INTEREST_CALL = one_call("compound_interest", INTEREST, '{"result": "1102.5"}', "The amount is 1102.5.")
CONVERSION_CALL = one_call("unit_converter", CONVERSION, '{"result": "2000"}', "That is 2000 m.")


def test_builtin_names_and_weights():
    assert set(BUILTIN_REWARDS) <= set(reward_function_names())
    specs = [{"name": "success_reward", "weight": 1.0, "options": {}},
             {"name": "task_reward", "weight": 0.5, "options": {"coverage_weight": 1.0}},
             {"name": "format_reward", "weight": 2, "options": {}}]
    funcs, weights = build_reward_functions(specs, run_registry())
    assert funcs[0] is success_reward and funcs[2] is format_reward
    assert funcs[1].__name__ == "task_reward" and weights == [1.0, 0.5, 2.0]
    with pytest.raises(PluginError, match="unknown reward function 'nope'"):
        build_reward_functions([{"name": "nope", "weight": 1.0, "options": {}}], run_registry())


def test_parity_reward_counts_a_plugin_tool_of_the_run_as_valid(tool_plugin):
    # valid call, gap 0 → +0.5; GT hit → +2.5; no repeated trigram → 3.0
    # an unknown tool: valid 0, gap |0 − 1| + 1 = 2 → −1.0; GT hit +2.5 → 1.5
    (run_reward,), _ = build_reward_functions(PARITY, run_registry([tool_plugin]))
    builtin_reward = get_reward_function("minimind_agent_reward")  # no run: the built-in tools
    assert run_reward(None, [INTEREST_CALL], gt=[["1102.5"]]) == [3.0]
    assert builtin_reward(None, [INTEREST_CALL], gt=[["1102.5"]]) == [1.5]


def test_parity_reward_refuses_a_builtin_tool_excluded_by_tool_names(tool_plugin):
    registry = run_registry([tool_plugin], tool_names=["calculate_math", "compound_interest"])
    (reward,), _ = build_reward_functions(PARITY, registry)
    assert reward(None, [INTEREST_CALL, CONVERSION_CALL], gt=[["1102.5"], ["2000"]]) == [3.0, 1.5]
    builtin_reward = get_reward_function("minimind_agent_reward")
    assert builtin_reward(None, [CONVERSION_CALL], gt=[["2000"]]) == [3.0]
    with pytest.raises(TypeError, match="'registry' is not an option"):
        build_reward_functions([{**PARITY[0], "options": {"registry": None}}], registry)


def test_tool_aware_factories_by_name_and_by_spec(tmp_path, tool_plugin, monkeypatch):
    monkeypatch.setattr(reward_registry, "_REWARDS", dict(reward_registry._REWARDS))  # registered here only
    registry = run_registry([tool_plugin], tool_names=["compound_interest"])
    seen = []

    @register_reward_factory("test_tool_names_reward", uses_tool_registry=True)
    def make_names_reward(registry, scale: float = 1.0):
        seen.append(registry)

        def reward(prompts, completions, **kwargs):
            return [scale * len(registry)] * len(completions)
        return reward

    (reward,), _ = build_reward_functions(
        [{"name": "test_tool_names_reward", "weight": 1.0, "options": {"scale": 2.0}}], registry)
    assert seen == [registry] and reward(None, ["x"]) == [2.0]
    get_reward_function("test_tool_names_reward")
    assert len(seen[-1]) == 8 and "compound_interest" not in seen[-1]  # no run's tools: the built-ins

    plugin = tmp_path / "tool_count_reward.py"
    plugin.write_text(
        "from minimind_trl.rewards.registry import uses_tool_registry\n\n\n"
        "@uses_tool_registry\n"
        "def make(registry):\n"
        "    return lambda prompts, completions, **kw: [float('compound_interest' in registry)] * len(completions)\n")
    (by_spec,), _ = build_reward_functions([{"name": f"{plugin}:make", "weight": 1.0, "options": {}}], registry)
    assert by_spec(None, ["x", "y"]) == [1.0, 1.0]
    assert uses_tool_registry(make_names_reward) is make_names_reward
