"""Plugin loading by dotted path and by file path (the leaf loader); tool plugins into a
`ToolRegistry` (envs); reward and verifier registries (rewards)."""

import ast
import json

import pytest

from minimind_trl import plugins
from minimind_trl.envs.tools import ToolRegistry, default_registry, load_tool_plugin
from minimind_trl.plugins import PluginError, is_spec, load_object
from minimind_trl.rewards import verify
from minimind_trl.rewards.registry import (
    get_reward_function,
    get_verifier,
    register_verifier,
    reward_function_names,
)


@pytest.fixture
def tool_plugin(repo_root):
    return str(repo_root / "plugins" / "example_tool.py")


@pytest.fixture
def reward_plugin(repo_root):
    return str(repo_root / "plugins" / "example_reward.py")


def test_load_object_by_dotted_path():
    assert load_object("minimind_trl.rewards:verify") is verify
    assert load_object("minimind_trl.rewards.verifier:Verification.__name__") == "Verification"
    assert load_object("json") is json


def test_load_object_by_file_path_is_cached(tool_plugin):
    func = load_object(f"{tool_plugin}:compound_interest")
    assert func.__name__ == "compound_interest"
    assert load_object(f"{tool_plugin}:compound_interest") is func
    assert load_object(tool_plugin).compound_interest is func


def test_builtin_tools_load_like_any_plugin():
    registry = ToolRegistry()
    added = load_tool_plugin(registry, "minimind_trl.envs.builtin_tools")
    assert added == default_registry().names()


def test_third_party_tool_plugin(tool_plugin):
    registry = default_registry(plugins=[tool_plugin])
    assert registry.names()[-1] == "compound_interest" and len(registry) == 9
    params = registry.schemas(["compound_interest"])[0]["function"]["parameters"]
    assert params["required"] == ["principal", "annual_rate_percent", "years"]
    call = registry.call
    # 1000 · 1.05² = 1102.5 ; 1000 · (1 + 0.05/12)^24 = 1104.9413…
    assert call("compound_interest", {"principal": 1000, "annual_rate_percent": 5,
                                      "years": 2}) == '{"result": "1102.5"}'
    assert call("compound_interest", {"principal": 1000, "annual_rate_percent": 5, "years": 2,
                                      "periods_per_year": 12}) == '{"result": "1104.9413"}'
    assert "exceeds" in call("compound_interest", {"principal": 1e17, "annual_rate_percent": 100,
                                                   "years": 1000})
    single = ToolRegistry()
    assert load_tool_plugin(single, f"{tool_plugin}:compound_interest") == ["compound_interest"]


def test_reward_plugin_by_file_path_and_by_name(reward_plugin):
    reward = get_reward_function(f"{reward_plugin}:tool_backed_success_reward")
    backed = ('<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "6*7"}}\n'
              '</tool_call>\n<tool_response>\n{"result": "42"}\n</tool_response>\nIt is 42.')
    guessed = "It is 42."
    wrong = backed.replace("It is 42.", "It is 41.")
    assert reward(None, [backed, guessed, wrong], gt=[[42]] * 3) == [1.0, 0.0, 0.0]
    assert "tool_backed_success" in reward_function_names()
    assert get_reward_function("tool_backed_success") is reward


def test_verifier_registry():
    assert get_verifier("gt") is verify
    assert get_verifier("minimind_trl.rewards:verify") is verify

    @register_verifier("always_wrong")
    def always_wrong(final_answer, gt, tool_results=()):
        return verify("", gt, tool_results)

    assert get_verifier("always_wrong") is always_wrong


@pytest.mark.parametrize("spec, message", [
    ("plugins/does_not_exist.py:thing", "plugin file not found"),
    ("no_such_package_xyz.module:thing",
     "cannot import plugin module 'no_such_package_xyz.module'"),
    ("minimind_trl.rewards:no_such_name", "has no attribute 'no_such_name'"),
    ("", "non-empty string"),
])
def test_bad_specs_raise_clear_errors(spec, message):
    with pytest.raises(PluginError, match=message):
        load_object(spec)


def test_bad_plugins_raise_clear_errors(tmp_path):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(PluginError, match="error while executing plugin file .*boom at import"):
        load_object(f"{broken}:x")
    with pytest.raises(PluginError, match="neither register"):
        load_tool_plugin(ToolRegistry(), "minimind_trl.rewards.numbers")
    with pytest.raises(PluginError, match="unknown reward function 'nope'"):
        get_reward_function("nope")
    with pytest.raises(PluginError, match="unknown verifier"):
        get_verifier("nope")
    assert issubclass(PluginError, ImportError)


def test_plugins_is_a_leaf_loader():
    """plugins.py imports nothing from the package (no arrow to envs or rewards) and holds no
    registry; the reward names live in rewards.registry only."""
    tree = ast.parse(open(plugins.__file__, encoding="utf-8").read())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if name and name.startswith("minimind_trl")], imported
    assert not hasattr(plugins, "_REWARD_FACTORIES") and not hasattr(plugins, "load_tool_plugin")
    for name in ("get_reward_function", "reward_function_names", "register_reward_function", "no_such_name"):
        assert not hasattr(plugins, name), name


def test_is_spec():
    assert is_spec("plugins/example_reward.py:tool_backed_success_reward")
    assert is_spec("pkg.module:attr") and is_spec("plugins/example_tool.py")
    assert not is_spec("task_reward") and not is_spec(None)
