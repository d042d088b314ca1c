"""The conversation schema (`minimind_trl.conversation`): upstream rows to messages, the one
task-prompt rule, tool-call encoding, and the data layer's file-and-line errors on top."""

import json

import pytest

from minimind_trl import conversation
from minimind_trl.conversation import (
    ConversationError,
    conversations_to_messages,
    decode_tool_calls,
    encode_tool_calls,
    is_placeholder,
    normalize_conversation,
    openai_tool,
    prompt_turns,
    task_prompt,
)
from minimind_trl.data import formats
from minimind_trl.fsio import DataFormatError

TOOL = {"name": "calculate_math", "description": "Evaluate.", "parameters": {"type": "object", "properties": {}}}
SYSTEM = {"role": "system", "content": "You are a calculator.", "tools": json.dumps([TOOL])}
USER = {"role": "user", "content": "What is 3*7?"}
CALLS = [{"name": "calculate_math", "arguments": {"expression": "3*7"}}]


def test_the_schema_module_is_the_ground_floor():
    source = open(conversation.__file__, encoding="utf-8").read()
    assert "minimind_trl" not in "".join(line for line in source.splitlines()
                                         if line.startswith(("import ", "from ")))


def test_conversations_to_messages_moves_tools_out_and_drops_none_keys():
    row = [dict(SYSTEM, tool_calls=None), dict(USER, reasoning_content=None),
           {"role": "assistant", "content": "", "tool_calls": encode_tool_calls(CALLS)}]
    messages, tools = conversations_to_messages(row)
    assert tools == [TOOL] and "tools" not in messages[0] and "reasoning_content" not in messages[1]
    assert messages[2]["tool_calls"] == [{"type": "function", "function": CALLS[0]}]
    assert isinstance(row[0]["tools"], str)  # input untouched
    assert normalize_conversation(row[:1] + row[2:])[1] == [TOOL]


def test_task_prompt_rule():
    """Every trailing placeholder (assistant, no content, no calls) goes; nothing else does."""
    base = [SYSTEM, USER]
    expected = conversations_to_messages(base)
    assert task_prompt({"conversations": base + [{"role": "assistant", "content": ""}]}) == expected
    none_filled = {"role": "assistant", "content": None, "tool_calls": None}  # as datasets reads it back
    assert task_prompt({"conversations": base + [none_filled]}) == expected
    assert task_prompt({"conversations": base}) == expected
    # Two placeholders: both go (data.formats.row_task_prompt, once named task_prompt, used to drop only one;
    # training cut one in the dataset builder and the rest when rendering, and evaluation dropped both).
    two = base + [{"role": "assistant", "content": ""}, {"role": "assistant"}]
    assert task_prompt({"conversations": two}) == expected
    assert formats.row_task_prompt({"conversations": two}) == expected
    # An assistant turn with calls and no content is not a placeholder: evaluation always kept it
    # (trainer/build.grpo_dataset and data/gold.py still cut it before rendering: they move to
    # prompt_turns in the final pass).
    calling = base + [{"role": "assistant", "content": "", "tool_calls": encode_tool_calls(CALLS)}]
    assert len(task_prompt({"conversations": calling})[0]) == 3
    # Whitespace content is content (as it was for training and evaluation).
    spaced = base + [{"role": "assistant", "content": "  "}]
    assert task_prompt({"conversations": spaced})[0][-1]["content"] == "  "


@pytest.mark.parametrize("tail", [[], [{"role": "assistant", "content": ""}],
                                  [{"role": "assistant", "content": "", "tool_calls": "[]"}],
                                  [{"role": "assistant", "content": "", "tool_calls": encode_tool_calls(CALLS)}]])
def test_prompt_turns_is_the_same_rule_in_the_upstream_form(tail):
    row = [SYSTEM, USER, *tail]
    turns = prompt_turns(row)
    assert turns[0]["tools"] == SYSTEM["tools"]  # the tools stay a JSON string, as TRL's prompt column has it
    assert conversations_to_messages(turns) == task_prompt({"conversations": row})
    assert task_prompt({"conversations": turns}) == task_prompt({"conversations": row})  # idempotent


def test_is_placeholder():
    assert is_placeholder({"role": "assistant", "content": ""})
    assert is_placeholder({"role": "assistant", "content": [], "tool_calls": []})
    assert not is_placeholder({"role": "user", "content": ""})
    assert not is_placeholder({"role": "assistant", "content": "x"})
    assert not is_placeholder({"role": "assistant", "tool_calls": encode_tool_calls(CALLS)})
    assert not is_placeholder({"role": "assistant", "tool_calls": "[not json"})
    assert not is_placeholder({"role": "assistant", "content": "", "reasoning_content": "3*7 is 21"})


def test_tool_calls_round_trip_and_errors_name_the_field():
    assert decode_tool_calls(encode_tool_calls(CALLS)) == CALLS
    openai = [{"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}}]
    assert decode_tool_calls(openai) == [{"name": "a", "arguments": {"x": 1}}]
    with pytest.raises(ConversationError) as info:
        decode_tool_calls([{"name": "a", "arguments": "[1]"}], "meta.calls")
    assert info.value.field == "meta.calls[0].arguments" and isinstance(info.value, ValueError)
    with pytest.raises(ConversationError, match=r"conversations\[1\]\.tools: tools may only"):
        normalize_conversation([USER, SYSTEM])
    assert openai_tool(TOOL) == {"type": "function", "function": TOOL}
    assert openai_tool(openai_tool(TOOL)) == openai_tool(TOOL)


def test_data_layer_errors_name_file_line_and_field():
    with pytest.raises(DataFormatError) as info:
        formats.row_messages([dict(SYSTEM, tools="[oops"), USER], "f.jsonl", 3)
    assert info.value.field == "conversations[0].tools" and "f.jsonl:3" in str(info.value)
    with pytest.raises(DataFormatError) as info:
        formats.row_task_prompt({"conversations": "nope"}, "f.jsonl", 4)
    assert info.value.field == "conversations"
    deep = '[{"name": "a", "arguments": {"x": ' + "[" * 40 + "]" * 40 + "}}]"
    with pytest.raises(DataFormatError) as info:  # the data layer parses with its bounded reader
        formats.row_tool_calls(deep, "meta.calls", "f.jsonl", 5)
    assert info.value.kind == "too_deep"
    assert decode_tool_calls(deep)[0]["name"] == "a"  # the schema alone has no depth bound
