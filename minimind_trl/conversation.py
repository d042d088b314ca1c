"""The conversation schema: upstream JSONL conversations, chat-template messages, task prompts.

This module is the ground floor of the package (it imports nothing from ``minimind_trl``): data
preparation, the tokenizer, the SFT/DPO datasets, the training environment and the evaluation
rollout all read conversations through it.

Two forms of one conversation:

* *upstream* (JSONL rows, SFT and agent-RL data): structured fields are JSON **strings**: the
  system turn's ``tools`` is a JSON list of tool schemas, an assistant turn's ``tool_calls`` a JSON
  list of ``{"name": ..., "arguments": {...}}`` (``arguments`` an object). Our writers produce
  exactly that (`encode_tool_calls`). Rows read back through ``datasets`` carry every key of every
  turn, the absent ones as ``None``.
* *messages* (what ``tokenizer.apply_chat_template(messages, tools=tools)`` takes): ``tools`` a
  list passed separately, and ``tool_calls`` on a message in the OpenAI form ``[{"type":
  "function", "function": {"name", "arguments"}}]``. String ``arguments`` stay strings, so they
  render exactly as written.

`normalize_conversation` turns the first into the second (the input is not modified);
`conversations_to_messages` does the same after dropping ``None``-valued keys. Problems raise
`ConversationError` (a ``ValueError``) whose ``field`` names the message and key
(``conversations[2].tool_calls[0]``); ``minimind_trl.data.formats`` re-raises it as a
``DataFormatError`` naming the file and line.

The task prompt (one rule for training, evaluation, distillation and data tools): a task row's
``conversations`` without its trailing *placeholders*, where a placeholder is an assistant turn
with no content (missing, ``None``, ``""`` or an empty part list) and no tool calls. Every
trailing placeholder is dropped, so the rule is idempotent (training applies it to a prompt that
the dataset builder already cut, evaluation to the raw row: both get the same messages). A
whitespace-only content or an assistant turn carrying tool calls is not a placeholder and stays.
`task_prompt` gives ``(messages, tools)``, `prompt_turns` the same turns in the upstream form
(``tools`` still a JSON string on the system turn, as TRL's prompt column carries it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any


class ConversationError(ValueError):
    """A conversation that does not follow the schema: ``field`` (``conversations[i].key``) and
    ``reason``; ``str()`` is ``"{field}: {reason}"``."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def loads_json(text: str, field: str) -> Any:
    """``json.loads`` whose failure is a `ConversationError` naming ``field``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConversationError(field, f"not valid JSON ({exc.msg} at char {exc.pos})") from None


JsonLoader = Callable[[str, str], Any]
"""``loads(text, field) -> value``: how JSON strings inside a conversation are parsed (the data
layer passes its bounded reader, which also refuses deep nesting and lone surrogates)."""


def openai_tool(schema: dict) -> dict:
    """A tool schema in the OpenAI form: a flat ``{"name", ...}`` wrapped as ``{"type":
    "function", "function": {...}}``; a schema that already has ``"function"`` is returned as is."""
    return schema if "function" in schema else {"type": "function", "function": schema}


def openai_tool_call(call: Any, where: str) -> dict:
    """One tool call (OpenAI ``{"type", "function": {...}}`` or bare ``{"name", "arguments"}``)
    as ``{"type": "function", "function": {"name", "arguments"}}``; ``arguments`` (default ``{}``)
    must be an object or a string, which is kept verbatim."""
    if not isinstance(call, dict):
        raise ConversationError(where, f"a tool call must be an object, got {type(call).__name__}")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ConversationError(where, "a tool call needs a non-empty string 'name'")
    arguments = fn.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        raise ConversationError(f"{where}.arguments",
                                f"must be an object or a JSON string, got {type(arguments).__name__}")
    return {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def normalize_conversation(conversations: list[dict], where: str = "conversations"
                           ) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of an upstream-form conversation, for ``apply_chat_template``.

    The system message's ``tools`` (JSON string or list) is parsed and returned separately
    (``None`` when there is none); an assistant's ``tool_calls`` (JSON string, list or one
    object) becomes the OpenAI form. The input is not modified. Errors name ``where`` and the
    message index."""
    if not isinstance(conversations, list) or not conversations:
        raise ConversationError(where, "must be a non-empty list of messages")
    messages: list[dict] = []
    tools: list[dict] | None = None
    for index, raw in enumerate(conversations):
        here = f"{where}[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
            raise ConversationError(here, "a message must be an object with a string 'role'")
        message = copy.deepcopy(raw)
        raw_tools = message.pop("tools", None)
        if raw_tools not in (None, "", []):
            if index != 0 or message["role"] != "system":
                raise ConversationError(f"{here}.tools", "tools may only be given on the first (system) message")
            tools = loads_json(raw_tools, f"{here}.tools") if isinstance(raw_tools, str) else raw_tools
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise ConversationError(f"{here}.tools", "must be a list of tool schema objects")
        raw_calls = message.pop("tool_calls", None)
        if raw_calls not in (None, "", []):
            calls = loads_json(raw_calls, f"{here}.tool_calls") if isinstance(raw_calls, str) else raw_calls
            if not isinstance(calls, list):
                calls = [calls]
            message["tool_calls"] = [openai_tool_call(c, f"{here}.tool_calls[{i}]") for i, c in enumerate(calls)]
        messages.append(message)
    return messages, tools


def drop_none_values(conversations: list) -> list:
    """Each turn without its ``None``-valued keys (``datasets`` fills absent keys with ``None``);
    non-dict turns are kept for `normalize_conversation` to refuse."""
    return [{key: value for key, value in turn.items() if value is not None} if isinstance(turn, dict) else turn
            for turn in conversations]


def conversations_to_messages(conversations: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """`normalize_conversation` of a row's ``conversations`` after `drop_none_values`."""
    if not isinstance(conversations, list):
        raise ConversationError("conversations", "must be a list of messages")
    return normalize_conversation(drop_none_values(conversations), where="conversations")


def is_placeholder(message: dict) -> bool:
    """An assistant message with no content, no reasoning and no tool calls (the upstream layout's
    empty answer slot after a task's question). Works on both forms: any empty ``tool_calls`` value
    (``None``, ``""``, ``[]``, a JSON string of ``[]``) counts as none. The one placeholder rule:
    task prompts drop trailing placeholders, SFT refuses a row that holds one."""
    if message.get("role") != "assistant" or message.get("content") or message.get("reasoning_content"):
        return False
    calls = message.get("tool_calls")
    if isinstance(calls, str) and calls:
        try:
            calls = json.loads(calls)
        except (ValueError, RecursionError):
            return False
    return calls in (None, "", [])


def prompt_turns(conversations: list[dict]) -> list[dict]:
    """The task prompt in the upstream form: ``conversations`` without ``None``-valued keys and
    without every trailing placeholder (`is_placeholder`)."""
    turns = drop_none_values(conversations)
    while turns and isinstance(turns[-1], dict) and is_placeholder(turns[-1]):
        turns.pop()
    return turns


def task_prompt(task: dict) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of a task row's prompt (the rule in the module docstring), ready for
    ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``."""
    messages, tools = conversations_to_messages(task.get("conversations"))
    while messages and is_placeholder(messages[-1]):
        messages.pop()
    return messages, tools


def encode_tool_calls(calls: list[dict]) -> str:
    """The upstream ``tool_calls`` string for ``[{"name", "arguments": dict}, ...]``."""
    return json.dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls], ensure_ascii=False)


def decode_tool_calls(value: Any, field: str = "tool_calls", loads: JsonLoader = loads_json) -> list[dict]:
    """``[{"name": str, "arguments": dict}, ...]`` of a ``tool_calls`` value: a JSON string or a
    list of bare or OpenAI-form calls, each ``arguments`` an object or a JSON string of one.
    Strings are parsed by ``loads``; problems raise `ConversationError` naming ``field``."""
    calls = loads(value, field) if isinstance(value, str) else value
    if not isinstance(calls, list) or not calls:
        raise ConversationError(field, "must be a non-empty list of tool calls")
    result = []
    for index, call in enumerate(calls):
        inner = call.get("function") if isinstance(call, dict) and "function" in call else call
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str) or not inner["name"]:
            raise ConversationError(f"{field}[{index}].name", "each call needs a non-empty string name")
        where = f"{field}[{index}].arguments"
        arguments = inner.get("arguments", {})
        arguments = loads(arguments, where) if isinstance(arguments, str) else arguments
        if not isinstance(arguments, dict):
            raise ConversationError(where, "must be a JSON object")
        result.append({"name": inner["name"], "arguments": arguments})
    return result
