"""The training/evaluation protocol (`minimind_trl.envs.protocol`): the malformed-call rule, the
error-observation rule, records from TRL's parsed completions, and the import direction."""

import ast
import json
import pathlib

import pytest
from trl_tool_loop import record_from_completion

from minimind_trl.envs import environment, protocol, rollout
from minimind_trl.envs.environment import install_parse_guard
from minimind_trl.envs.protocol import (
    is_error_observation,
    message_malformed_calls,
    parse_model_turn,
    prompt_ids_for,
    turn_malformed_calls,
)
from minimind_trl.rewards import format_reward, view_completion
from minimind_trl.tokenization import load_tokenizer

GOOD = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "1+1"}}\n</tool_call>'
BAD = '<tool_call>\n{"name": oops}\n</tool_call>'
DEEP = '<tool_call>\n{"name": "calculate_math", "arguments": ' + "[" * 3000 + "]" * 3000 + "}\n</tool_call>"
CASES = {  # reply: (TRL reads it as calls, malformed calls by the protocol rule)
    "good": (GOOD, True, 0),
    "two good": (GOOD + "\n" + GOOD, True, 0),
    "text around a good call": ("Let me see.\n" + GOOD + "\nDone.", True, 0),
    "bad": (BAD, False, 1),
    "good then bad": (GOOD + "\n" + BAD, False, 2),
    "bad then good": (BAD + "\n" + GOOD, False, 2),
    "unclosed": ('<tool_call>\n{"name": "calculate_math"', False, 1),
    "good then unclosed": (GOOD + '\n<tool_call>\n{"name": "x"', False, 2),
    "nested": ("<tool_call>\n" + GOOD, False, 2),
    "stray close": ("It is 2. </tool_call>", False, 1),
    "bad json": ("<tool_call>\n{oops}\n</tool_call> It is 2.", False, 1),
    "nested too deep": (DEEP, False, 1),
    "bad block in the reasoning": ("<think>\nmaybe " + BAD + "\n</think>\n\nIt is 2.", False, 0),
    "no block": ("It is 2.", False, 0),
}


@pytest.fixture(scope="module")
def tokenizer():
    """Its own tokenizer, not the shared one: `install_parse_guard` changes it."""
    tok = load_tokenizer()
    install_parse_guard(tok)  # as the trainer does: every parser failure is plain text
    return tok


@pytest.mark.parametrize("name", list(CASES))
def test_one_malformed_count_for_records_rewards_and_text(tokenizer, registry, name):
    reply, as_calls, expected = CASES[name]
    schemas = registry.schemas()
    prompt = prompt_ids_for(tokenizer, [{"role": "user", "content": "q"}], schemas)
    ids = tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    message = parse_model_turn(tokenizer, ids, prompt, schemas, reply)
    assert bool(message.get("tool_calls")) is as_calls  # TRL's own parse of the reply
    record = record_from_completion([message], ids, None, tokenizer.eos_token_id)
    assert record.malformed_calls == message_malformed_calls(message) == expected
    assert turn_malformed_calls(reply, read_as_text=not as_calls) == expected  # the rollout's count
    assert view_completion([message]).malformed == expected  # rewards on TRL's messages
    assert view_completion(reply).malformed == expected  # rewards on text (parse inferred)
    assert format_reward([], [[message], reply]) == [-1.0 if expected else 0.0] * 2


def test_text_alone_follows_the_block_grammar():
    """Without TRL's parse, a turn is plain text iff its reply has a malformed block; a reply with
    only good blocks is a call turn (0), whatever else a parser might have refused."""
    assert turn_malformed_calls(GOOD) == 0
    assert turn_malformed_calls(GOOD, read_as_text=True) == 1  # TRL refused it: the call never ran
    assert turn_malformed_calls(GOOD + BAD, read_as_text=False) == 0


def test_error_observations():
    assert is_error_observation('{"error": "division by zero"}')
    assert is_error_observation("{'error': 'Tool nope not found.'}")  # TRL's repr
    assert is_error_observation('  {"error": null}')
    assert not is_error_observation('{"result": "2"}')
    assert not is_error_observation("error")
    assert not is_error_observation("[" * 5000)


def _package_imports(module) -> set[str]:
    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_imports_run_one_way_rollout_environment_protocol():
    assert "minimind_trl.envs.protocol" in _package_imports(environment)
    assert "minimind_trl.envs.protocol" in _package_imports(rollout)
    assert "minimind_trl.envs.rollout" not in _package_imports(environment)
    assert not {m for m in _package_imports(protocol)
                if m.startswith("minimind_trl") and m != "minimind_trl.envs.parsing"}


def test_task_prompt_ids_renders_the_rows_tools_or_the_default_only_when_it_has_none(tokenizer):
    """``rollout.task_prompt_ids`` (evaluation's and training's one rendering of a task's prompt): the
    tools on the row's system message win over ``default_tools``; a row without tools gets
    ``default_tools`` in its prompt but reports ``tools`` None; placeholders go; thinking opens on request."""
    own = {"name": "calculate_math", "description": "Evaluate.", "parameters": {"type": "object", "properties": {}}}
    other = {"name": "lookup_rate", "description": "Rates.", "parameters": {"type": "object", "properties": {}}}
    system = {"role": "system", "content": "You are a calculator.", "tools": json.dumps([own])}
    user = {"role": "user", "content": "What is 3*7?"}
    placeholder = {"role": "assistant", "content": ""}
    tools, ids = rollout.task_prompt_ids(tokenizer, {"conversations": [system, user, placeholder]}, False, [other])
    assert tools == [own]
    messages = [{"role": "system", "content": "You are a calculator."}, user]
    assert ids == protocol.prompt_ids_for(tokenizer, messages, [own], False)
    text = tokenizer.decode(ids)
    assert "calculate_math" in text and "lookup_rate" not in text and "What is 3*7?" in text
    plain = {"conversations": [{"role": "system", "content": "You are a calculator."}, user]}
    tools, ids = rollout.task_prompt_ids(tokenizer, plain, True, [other])
    assert tools is None
    assert ids == protocol.prompt_ids_for(tokenizer, messages, [other], True)
    assert "lookup_rate" in tokenizer.decode(ids)
    assert ids != protocol.prompt_ids_for(tokenizer, messages, [other], False)  # the think opener
    assert rollout.task_prompt_ids(tokenizer, plain, False)[1] == protocol.prompt_ids_for(tokenizer, messages, None)
