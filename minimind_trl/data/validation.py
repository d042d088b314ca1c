"""Reading JSONL task files and checking each row against the agent-math task schema.

A task row is ``{"conversations": [...], "gt": [...]}`` with optional ``"id"`` and ``"meta"``.
The prompt is an optional leading system turn, then user/assistant turns alternating and ending
with a user turn, optionally followed by one placeholder assistant turn with empty content (the
upstream ``agent_rl_math.jsonl`` layout is ``[system with tools, user, assistant ""]``). The
system turn must carry ``"tools"``: a JSON string (a list is also accepted) holding a non-empty
list of tool schemas, each either ``{"type": "function", "function": {"name", ...}}`` or the
flat ``{"name", ...}``. ``gt`` is a non-empty list of strings and/or numbers (``len(gt)`` is the
expected number of tool calls).

Problems raise :class:`DataFormatError`, which names the file, the 1-based line and the field.
Files are read by the package's one bounded JSON/JSONL reader (:func:`~minimind_trl.fsio.iter_jsonl`,
:func:`~minimind_trl.fsio.read_json_file`, their bounds and the error classes), which lives in
:mod:`minimind_trl.fsio`; this module owns the task-row schema.
"""

from __future__ import annotations

import os
from typing import Any

from minimind_trl.fsio import DataError, DataFormatError, loads_json

__all__ = ["MAX_GT_MAGNITUDE", "ROLES", "GenerationError", "parse_tools", "validate_task_row"]

ROLES = ("system", "user", "assistant", "tool")


class GenerationError(DataError):
    """The task generator could not produce a consistent task (e.g. a tool disagrees with the
    exact value, or every stratum ran out of new questions)."""


MAX_GT_MAGNITUDE = 10**18
"""A numeric ``gt`` value is finite with ``|x| <= 1e18``: no tool result can be larger."""


def parse_tools(value: Any, path=None, line=None, field: str = "conversations[0].tools") -> list[dict]:
    """Parse a system turn's ``tools`` (JSON string or list) into a list of tool-schema dicts."""
    if isinstance(value, str):
        value = loads_json(value, path, line, field)
    if not isinstance(value, list) or not value:
        raise DataFormatError(path, line, field, "must be a non-empty JSON list of tool schemas")
    for index, tool in enumerate(value):
        inner = tool.get("function") if isinstance(tool, dict) and "function" in tool else tool
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str) or not inner["name"]:
            raise DataFormatError(path, line, f"{field}[{index}]", "each tool needs a non-empty string 'name'")
    return value


def _check_gt(gt: Any, path, line) -> None:
    if not isinstance(gt, list):
        raise DataFormatError(path, line, "gt", f"must be a list of values, got {type(gt).__name__}")
    if not gt:
        raise DataFormatError(path, line, "gt", "must not be empty")
    for index, value in enumerate(gt):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not abs(value) <= MAX_GT_MAGNITUDE:  # also NaN; no float() of a huge int
                shown = repr(value) if isinstance(value, float) else f"an integer of {len(str(abs(value)))} digits"
                raise DataFormatError(path, line, f"gt[{index}]", f"a number must be finite with |x| <= 1e18 "
                                      f"(the tools' bound), got {shown}", "number")
        elif not isinstance(value, str) or not value.strip():
            raise DataFormatError(path, line, f"gt[{index}]",
                                  f"must be a non-empty string or a finite number, got {value!r}")


def _check_roles(conversations: list, path, line) -> None:
    """Optional system first; user/assistant alternate; the prompt ends with a user turn."""
    roles = [message["role"] for message in conversations]
    body = roles[1:] if roles[0] == "system" else roles
    if body and body[-1] == "assistant" and not conversations[-1]["content"].strip():
        body = body[:-1]  # the empty placeholder answer of the upstream layout
    offset = 1 if roles[0] == "system" else 0
    if not body:
        raise DataFormatError(path, line, "conversations", "has no user turn")
    for index, role in enumerate(body):
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise DataFormatError(path, line, f"conversations[{index + offset}].role",
                                  f"expected {expected!r} here (prompt turns alternate user/assistant), got {role!r}")
    if body[-1] != "user":
        last = len(body) - 1 + offset
        raise DataFormatError(path, line, f"conversations[{last}].role",
                              "the prompt must end with a user turn (optionally followed by an empty assistant turn)")


def validate_task_row(row: Any, path: str | os.PathLike | None = None, line: int | None = None) -> dict:
    """Check one task row; returns it unchanged or raises :class:`DataFormatError`."""
    if not isinstance(row, dict):
        raise DataFormatError(path, line, "<row>", f"must be a JSON object, got {type(row).__name__}")
    conversations = row.get("conversations")
    if conversations is None:
        raise DataFormatError(path, line, "conversations", "is missing")
    if not isinstance(conversations, list) or not conversations:
        raise DataFormatError(path, line, "conversations", "must be a non-empty list of messages")
    for index, message in enumerate(conversations):
        if not isinstance(message, dict):
            raise DataFormatError(path, line, f"conversations[{index}]", "must be an object")
        role = message.get("role")
        if role not in ROLES or role == "tool":
            raise DataFormatError(path, line, f"conversations[{index}].role",
                                  f"must be one of 'system', 'user', 'assistant' in a task prompt, got {role!r}")
        if role == "system" and index != 0:
            raise DataFormatError(path, line, f"conversations[{index}].role", "a system turn may only come first")
        if not isinstance(message.get("content"), str):
            raise DataFormatError(path, line, f"conversations[{index}].content", "must be a string")
    _check_roles(conversations, path, line)
    if conversations[0]["role"] != "system" or conversations[0].get("tools") in (None, ""):
        raise DataFormatError(path, line, "conversations[0].tools",
                              "the first turn must be a system turn offering tools")
    parse_tools(conversations[0]["tools"], path, line)
    if "gt" not in row:
        raise DataFormatError(path, line, "gt", "is missing")
    _check_gt(row["gt"], path, line)
    if row.get("id") is not None and (not isinstance(row["id"], str) or not row["id"].strip()):
        raise DataFormatError(path, line, "id", "must be a non-empty string when present")
    if row.get("meta") is not None and not isinstance(row["meta"], dict):
        raise DataFormatError(path, line, "meta", "must be an object when present")
    return row
