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
Every JSONL file is read through :func:`iter_jsonl` (JSON documents through :func:`read_json_file`)
with fixed bounds: a line of at most :data:`MAX_LINE_BYTES`, nesting of at most
:data:`MAX_JSON_DEPTH`, no lone surrogates, integers Python can read; invalid UTF-8 is an error, a
byte-order mark opening the file and CRLF line ends are accepted.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class DataError(Exception):
    """A data problem the user must fix (bad arguments, a non-empty output folder, ...)."""


class GenerationError(DataError):
    """The task generator could not produce a consistent task (e.g. a tool disagrees with the
    exact value, or every stratum ran out of new questions)."""


MAX_LINE_BYTES = 1 << 20
"""A JSONL row (one line, line end included) may hold at most 1 MiB; a longer line is refused
unread (a task row is a few KB; a 50 MB line would otherwise cost ~12x its size in memory)."""
MAX_JSON_DEPTH = 32
"""Arrays and objects may nest at most 32 deep, in a row and in the JSON strings it carries
(``tools``, ``tool_calls``); deeper input is refused before Python's recursion limit is met."""
MAX_JSON_FILE_BYTES = 16 << 20
"""A whole JSON document (a split or eval manifest, ``metrics.json``) may hold at most 16 MiB."""

MAX_GT_MAGNITUDE = 10**18
"""A numeric ``gt`` value is finite with ``|x| <= 1e18``: no tool result can be larger."""

FAILURE_KINDS = ("encoding", "too_long", "json", "too_deep", "number", "surrogate", "schema", "duplicate_id")
"""Kinds of malformed rows (``DataFormatError.kind``), counted per kind by ``--skip-invalid``."""


class DataFormatError(DataError):
    """A malformed row: carries ``path``, ``line`` (1-based, or None), ``field`` and ``kind`` (one
    of :data:`FAILURE_KINDS`)."""

    def __init__(self, path: str | os.PathLike | None, line: int | None, field: str, message: str,
                 kind: str = "schema"):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field if len(field) <= 200 else field[:200] + "..."  # hostile keys stay one short line
        self.reason = message
        self.kind = kind
        where = self.path or "<row>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: field '{self.field}': {message}")


def _physical_lines(path: str | os.PathLike, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """``(line_number, raw)`` for every line; ``raw`` is None for a line over ``max_bytes``, whose
    bytes are skipped in bounded chunks, never held."""
    with open(path, "rb") as handle:
        number = 0
        while True:
            raw = handle.readline(max_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_bytes:
                while raw and not raw.endswith(b"\n"):
                    raw = handle.readline(1 << 16)
                raw = None
            yield number, raw


def iter_jsonl_lines(path: str | os.PathLike, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(line_number, raw_bytes)`` for every non-blank line (blank lines are not rows);
    ``raw_bytes`` is None for a line longer than ``max_bytes`` (:func:`parse_jsonl_line` refuses it)."""
    for number, raw in _physical_lines(path, max_bytes):
        if raw is None or raw.strip():
            yield number, raw


def count_blank_lines(path: str | os.PathLike) -> int:
    """Number of whitespace-only lines in a file (they are not rows)."""
    return sum(1 for _, raw in _physical_lines(path, MAX_LINE_BYTES) if raw is not None and not raw.strip())


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_json_value(value: Any, path=None, line=None, field: str = "<row>") -> Any:
    """Walk a parsed JSON value without recursion: nesting beyond :data:`MAX_JSON_DEPTH` and a
    lone surrogate (``"\\ud800"``) in a string or key raise :class:`DataFormatError` naming the
    field; returns ``value``."""
    stack = [(value, field, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                raise DataFormatError(path, line, where, "holds a lone surrogate (not encodable as UTF-8)", "surrogate")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise DataFormatError(path, line, where, f"nests deeper than {MAX_JSON_DEPTH} levels", "too_deep")
        prefix = "" if where == "<row>" else where
        if isinstance(item, list):
            stack.extend((child, f"{prefix}[{index}]", depth + 1) for index, child in enumerate(item))
            continue
        for key, child in item.items():
            name = f"{prefix}.{key}" if prefix else key
            if _has_surrogate(key):
                raise DataFormatError(path, line, where, "has a key holding a lone surrogate", "surrogate")
            stack.append((child, name, depth + 1))
    return value


def loads_json(text: str, path=None, line=None, field: str = "<json>") -> Any:
    """``json.loads`` for untrusted text: every failure (bad JSON, nesting that would exhaust the
    recursion limit, an integer of over 4300 digits, a lone surrogate) is a :class:`DataFormatError`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        raise DataFormatError(path, line, field, f"not valid JSON ({exc.msg} at {where})", "json") from None
    except RecursionError:
        raise DataFormatError(path, line, field, f"nests deeper than {MAX_JSON_DEPTH} levels", "too_deep") from None
    except ValueError:  # int("1" * 5000): over Python's integer-string conversion limit
        raise DataFormatError(path, line, field, f"holds an integer of more than {sys.get_int_max_str_digits()} digits",
                              "number") from None
    return check_json_value(value, path, line, "<row>" if field == "<json>" else field)


def parse_jsonl_line(raw: bytes | None, path: str | os.PathLike | None, line: int | None) -> Any:
    """Decode one JSONL line; an over-long line, bad UTF-8 or invalid JSON raise
    :class:`DataFormatError` (field ``<json>``). A UTF-8 byte-order mark opening the file and
    CRLF line ends are accepted."""
    if raw is None:
        raise DataFormatError(path, line, "<json>", f"line is longer than {MAX_LINE_BYTES} bytes", "too_long")
    try:
        text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, line, "<json>", f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                              "encoding") from None
    return loads_json(text, path, line)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_value)`` for every non-blank line of a UTF-8 JSONL file, through
    the bounds above; the first malformed line raises :class:`DataFormatError`. Every command that
    reads JSONL (``data prepare`` / ``gold``, ``train``, ``eval``, ``summarize``, ``plot``) reads it here."""
    for number, raw in iter_jsonl_lines(path):
        yield number, parse_jsonl_line(raw, path, number)


def iter_jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """:func:`iter_jsonl` for files whose every row must be a JSON object."""
    for number, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise DataFormatError(path, number, "<row>", f"must be a JSON object, got {type(row).__name__}")
        yield number, row


def read_json_file(path: str | os.PathLike, max_bytes: int = MAX_JSON_FILE_BYTES) -> Any:
    """One JSON document (a manifest, ``metrics.json``), with the same bounds as a row; a file over
    ``max_bytes``, an empty file or bad UTF-8 raise :class:`DataFormatError` naming the file."""
    size = os.path.getsize(path)
    if size > max_bytes:
        raise DataFormatError(path, None, "<json>", f"file is larger than {max_bytes} bytes", "too_long")
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, "<json>", f"file is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                              "encoding") from None
    if not text.strip():
        raise DataFormatError(path, None, "<json>", "file is empty", "json")
    return loads_json(text, path, None)


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
