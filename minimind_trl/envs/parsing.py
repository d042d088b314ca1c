"""Parse ``<tool_call>`` blocks out of generated text.

The chat format writes a call as::

    <tool_call>
    {"name": "calculate_math", "arguments": {"expression": "12*3"}}
    </tool_call>

`parse_tool_calls(text)` returns a `ToolCallParse`: ``calls`` is the list of well-formed calls
``[{"name": str, "arguments": dict}]`` in text order, ``malformed`` the number of bad blocks and
``errors`` one short reason per bad block. The object also behaves like its ``calls`` list
(iteration, ``len``, indexing).

A block is malformed when its body is not a JSON object, has no non-empty string ``"name"``,
has ``"arguments"`` that is neither an object nor a JSON string encoding one (a missing
``"arguments"`` means ``{}``), or repeats a key at any depth (JSON readers disagree on which
copy wins, so ``{"name": "a", "name": "b"}`` is refused rather than read as ``b``); an opening
tag without a closing tag (before the next opening tag or the end of the text) and a closing tag
without an opening tag also count as one malformed block each. Other keys in the object are
ignored.

This is the block grammar only. How many malformed *calls* a model turn has (every block of a
reply read as plain text) is the protocol's rule: `minimind_trl.envs.protocol.turn_malformed_calls`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MAX_BLOCK_CHARS = 65_536
_TAG = re.compile(r"</?tool_call>")


@dataclass(frozen=True)
class ToolCallParse:
    """Result of `parse_tool_calls`: the good calls, the malformed-block count and reasons."""

    calls: list[dict] = field(default_factory=list)
    malformed: int = 0
    errors: list[str] = field(default_factory=list)

    def __iter__(self):
        return iter(self.calls)

    def __len__(self) -> int:
        return len(self.calls)

    def __getitem__(self, index):
        return self.calls[index]


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise ValueError(f"duplicate key {repeated[:64]!r}")
    return dict(pairs)


def loads_call_json(text: str):
    """``json.loads`` that refuses an object repeating a key (module docstring)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def parse_call_body(body: str) -> tuple[dict | None, str | None]:
    """(call, None) for a well-formed block body, else (None, reason)."""
    if len(body) > MAX_BLOCK_CHARS:
        return None, "tool call block too long"
    try:
        obj = loads_call_json(body)
    except (ValueError, RecursionError) as exc:
        duplicate = str(exc).startswith("duplicate key")
        return None, f"tool call repeats a key ({exc})" if duplicate else "tool call is not valid JSON"
    if not isinstance(obj, dict):
        return None, "tool call is not a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "tool call has no name"
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads_call_json(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None, "tool call arguments are not valid JSON (or repeat a key)"
    if not isinstance(arguments, dict):
        return None, "tool call arguments are not a JSON object"
    return {"name": name.strip(), "arguments": arguments}, None


def parse_tool_calls(text: str) -> ToolCallParse:
    """Find every ``<tool_call>…</tool_call>`` block in ``text`` (see the module docstring)."""
    calls, errors = [], []
    open_end = None  # end index of a pending opening tag
    for tag in _TAG.finditer(text or ""):
        if tag.group() == TOOL_CALL_OPEN:
            if open_end is not None:
                errors.append("unclosed <tool_call>")
            open_end = tag.end()
        elif open_end is None:
            errors.append("</tool_call> without <tool_call>")
        else:
            call, error = parse_call_body(text[open_end:tag.start()].strip())
            if call is None:
                errors.append(error)
            else:
                calls.append(call)
            open_end = None
    if open_end is not None:
        errors.append("unclosed <tool_call>")
    return ToolCallParse(calls, len(errors), errors)
