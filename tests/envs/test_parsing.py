"""Tool-call block grammar (issue 28.7): a call repeating a key is malformed, at any depth."""

import pytest

from minimind_trl.envs.parsing import parse_tool_calls
from minimind_trl.envs.tools import default_registry


@pytest.mark.parametrize("body", [
    '{"name": "calculate_math", "name": "unit_converter", "arguments": {}}',
    '{"name": "calculate_math", "arguments": {"expression": "1+1", "expression": "2+2"}}',
    '{"name": "calculate_math", "arguments": "{\\"expression\\": \\"1\\", \\"expression\\": \\"2\\"}"}',
])
def test_a_repeated_key_is_a_malformed_call_not_last_wins(body):
    parsed = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>")
    assert parsed.calls == [] and parsed.malformed == 1


def test_the_same_call_without_the_repeat_is_read():
    call = '{"name": "calculate_math", "arguments": {"expression": "2+2"}}'
    parsed = parse_tool_calls(f"<tool_call>\n{call}\n</tool_call>")
    assert parsed.calls == [{"name": "calculate_math", "arguments": {"expression": "2+2"}}] and parsed.malformed == 0


def test_the_registry_refuses_repeated_argument_keys():
    arguments, error = default_registry().validate("calculate_math", '{"expression": "1", "expression": "2"}')
    assert arguments is None and "duplicate key 'expression'" in error
