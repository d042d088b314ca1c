"""Between the upstream JSONL conversation schema and chat-template messages.

Upstream rows (SFT and agent RL) store structured fields as JSON *strings*: the system turn's
``tools`` is a JSON list of tool schemas, and an assistant turn's ``tool_calls`` is a JSON list of
``{"name": ..., "arguments": {...}}`` objects (``arguments`` an object, not a string). Our writers
use exactly that form (:func:`encode_tool_calls`).

The chat template takes Python objects: ``tools`` as a list of OpenAI function schemas passed
separately, and ``tool_calls`` on a message as ``[{"type": "function", "function": {"name",
"arguments"}}]``. :func:`conversations_to_messages` does that conversion with the tokenizer's own
:func:`minimind_trl.tokenization.template.normalize_conversation` (one implementation of what the
template accepts), after dropping keys whose value is ``None`` (rows read back through
``datasets`` carry every key of every turn, absent ones as ``None``), and reports problems as
:class:`DataFormatError` naming file, line and field.
"""

from __future__ import annotations

import json
from typing import Any

from minimind_trl.data.validation import DataFormatError, loads_json


def encode_tool_calls(calls: list[dict]) -> str:
    """The upstream ``tool_calls`` string for ``[{"name", "arguments": dict}, ...]``."""
    return json.dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls], ensure_ascii=False)


def _decode_json(value: Any, field: str, path, line) -> Any:
    return loads_json(value, path, line, field) if isinstance(value, str) else value


def decode_tool_calls(value: Any, field: str = "tool_calls", path=None, line=None) -> list[dict]:
    """Parse a ``tool_calls`` value into ``[{"name": str, "arguments": dict}, ...]``."""
    calls = _decode_json(value, field, path, line)
    if not isinstance(calls, list) or not calls:
        raise DataFormatError(path, line, field, "must be a non-empty list of tool calls")
    result = []
    for index, call in enumerate(calls):
        inner = call.get("function") if isinstance(call, dict) and "function" in call else call
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str) or not inner["name"]:
            raise DataFormatError(path, line, f"{field}[{index}].name", "each call needs a non-empty string name")
        arguments = _decode_json(inner.get("arguments", {}), f"{field}[{index}].arguments", path, line)
        if not isinstance(arguments, dict):
            raise DataFormatError(path, line, f"{field}[{index}].arguments", "must be a JSON object")
        result.append({"name": inner["name"], "arguments": arguments})
    return result


def conversations_to_messages(conversations: list[dict], path=None, line=None) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` for ``tokenizer.apply_chat_template(messages, tools=tools, ...)``.

    ``tools`` comes from the system turn's ``tools`` field (``None`` when there is none) and is
    removed from the message; ``tool_calls`` strings become OpenAI-form lists.
    """
    from minimind_trl.tokenization.template import normalize_conversation

    if not isinstance(conversations, list):
        raise DataFormatError(path, line, "conversations", "must be a list of messages")
    cleaned = [{key: value for key, value in turn.items() if value is not None} if isinstance(turn, dict) else turn
               for turn in conversations]
    try:
        return normalize_conversation(cleaned, where="conversations")
    except ValueError as exc:
        field, _, reason = str(exc).partition(": ")
        raise DataFormatError(path, line, field, reason or str(exc)) from None


def task_prompt(task: dict, path=None, line=None) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of a task row's prompt: the conversation without the trailing empty
    assistant placeholder, ready for ``apply_chat_template(..., add_generation_prompt=True)``."""
    messages, tools = conversations_to_messages(task.get("conversations"), path, line)
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("content") \
            and not messages[-1].get("tool_calls"):
        messages = messages[:-1]
    return messages, tools
