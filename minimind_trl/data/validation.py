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
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class DataError(Exception):
    """A data problem the user must fix (bad arguments, a non-empty output folder, ...)."""


class GenerationError(DataError):
    """The task generator could not produce a consistent task (e.g. a tool disagrees with the
    exact value, or every stratum ran out of new questions)."""


class DataFormatError(DataError):
    """A malformed row: carries ``path``, ``line`` (1-based, or None) and ``field``."""

    def __init__(self, path: str | os.PathLike | None, line: int | None, field: str, message: str):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = self.path or "<row>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: field '{field}': {message}")


def iter_jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, raw_bytes)`` for every non-blank line (blank lines are not rows)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield number, raw


def parse_jsonl_line(raw: bytes, path: str | os.PathLike | None, line: int | None) -> Any:
    """Decode one JSONL line; bad UTF-8 or invalid JSON raise :class:`DataFormatError` (field ``<json>``)."""
    try:
        text = raw.decode("utf-8-sig" if line == 1 else "utf-8")  # tolerate a byte-order mark
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, line, "<json>", f"line is not valid UTF-8 ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, line, "<json>", f"invalid JSON: {exc.msg} at column {exc.colno}") from None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for every non-blank line of a UTF-8 JSONL file."""
    for number, raw in iter_jsonl_lines(path):
        yield number, parse_jsonl_line(raw, path, number)


def count_blank_lines(path: str | os.PathLike) -> int:
    """Number of whitespace-only lines in a file (they are not rows)."""
    with open(path, "rb") as handle:
        return sum(1 for raw in handle if not raw.strip())


def parse_tools(value: Any, path=None, line=None, field: str = "conversations[0].tools") -> list[dict]:
    """Parse a system turn's ``tools`` (JSON string or list) into a list of tool-schema dicts."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, line, field, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
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
        is_text = isinstance(value, str) and bool(value.strip())
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (is_text or is_number):
            raise DataFormatError(path, line, f"gt[{index}]", f"must be a non-empty string or a finite number, got {value!r}")


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
        raise DataFormatError(path, line, "conversations[0].tools", "the first turn must be a system turn offering tools")
    parse_tools(conversations[0]["tools"], path, line)
    if "gt" not in row:
        raise DataFormatError(path, line, "gt", "is missing")
    _check_gt(row["gt"], path, line)
    if row.get("id") is not None and (not isinstance(row["id"], str) or not row["id"].strip()):
        raise DataFormatError(path, line, "id", "must be a non-empty string when present")
    if row.get("meta") is not None and not isinstance(row["meta"], dict):
        raise DataFormatError(path, line, "meta", "must be an object when present")
    return row
