"""Canonical forms of task rows: text, tool JSON, ground truth, prompt keys and row ids.

Rules (recorded verbatim in every split manifest, see :data:`NORMALISATION_RULES`):

* text: every message ``content`` (and ``reasoning_content``) is Unicode NFKC-normalised
  (full-width ASCII such as ``？`` ``，`` ``１`` becomes ``?`` ``,`` ``1``), ``\\r\\n``/``\\r``
  become ``\\n``, runs of other whitespace collapse to one space, spaces next to a line break are
  removed, three or more line breaks shrink to two, and the ends are stripped.
* tools: the system turn's ``tools`` is parsed, each flat schema ``{"name", ...}`` is wrapped as
  ``{"type": "function", "function": {...}}``, and the list is serialised with
  ``json.dumps(tools, ensure_ascii=False)`` (default ``", "``/``": "`` separators). Key order and
  tool order are kept, not sorted: the chat template renders each schema in this order, and the
  default separators are exactly how the template's ``tojson`` prints them.
* ground truth: every ``gt`` value becomes a string (integers and integral floats without a
  decimal point, other floats by ``repr``), because a JSON column mixing numbers and strings does
  not load into Arrow/``datasets``.
* prompt key (duplicate detection): the normalised contents of the user turns, joined by
  ``\\n\\n``. Two rows asking the same question are duplicates even when their system prompts or
  offered tools differ, so a question can never sit in two splits.
* id: kept when the row has one, else ``"t-"`` + the first 16 hex digits of the SHA-256 of the
  prompt key.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from minimind_trl.conversation import openai_tool
from minimind_trl.data.validation import parse_tools
from minimind_trl.fsio import sha256_text

NORMALISATION_RULES = {
    "text": "NFKC; CRLF/CR -> LF; whitespace runs other than LF -> one space; spaces around LF removed; "
    "3+ LF -> 2 LF; stripped (applies to content and reasoning_content of every turn)",
    "tools": "flat schemas wrapped as {type: function, function: ...}; json.dumps(ensure_ascii=False) with "
    "default separators; key order and tool order kept",
    "gt": "every value as a string: integers / integral floats without decimal point, other floats by repr",
    "prompt_key": "normalised user-turn contents joined by a blank line (system prompt and tools ignored)",
    "id": "kept if present, else 't-' + sha256(prompt_key)[:16]",
}

_SPACES = re.compile(r"[^\S\n]+")
_SPACE_AROUND_LF = re.compile(r" ?\n ?")
_MANY_LF = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """Apply the text rule above (idempotent)."""
    text = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _SPACES.sub(" ", text)
    text = _SPACE_AROUND_LF.sub("\n", text)
    return _MANY_LF.sub("\n\n", text).strip()


def canonical_tool_list(tools: Any, path=None, line=None, field: str = "conversations[0].tools") -> list[dict]:
    """Parse ``tools`` (JSON string or list) and wrap flat schemas in the OpenAI form
    (`minimind_trl.conversation.openai_tool`)."""
    return [openai_tool(tool) for tool in parse_tools(tools, path, line, field)]


def canonical_tools_json(tools: Any, path=None, line=None, field: str = "conversations[0].tools") -> str:
    """The canonical ``tools`` string of a system turn (see the module rules)."""
    return json.dumps(canonical_tool_list(tools, path, line, field), ensure_ascii=False)


def canonical_gt_value(value: Any) -> str:
    """One ground-truth value as a string (see the module rules)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def prompt_key(conversations: list[dict]) -> str:
    """The duplicate-detection key: normalised user contents joined by a blank line."""
    return "\n\n".join(normalize_text(m["content"]) for m in conversations if m.get("role") == "user")


def row_id_for(conversations: list[dict]) -> str:
    """A stable id derived from the prompt key."""
    return "t-" + sha256_text(prompt_key(conversations))[:16]


def normalize_conversations(conversations: list[dict], path=None, line=None) -> list[dict]:
    """A copy with normalised text and a canonical ``tools`` string; other keys are kept."""
    result = []
    for index, message in enumerate(conversations):
        message = dict(message)
        for key in ("content", "reasoning_content"):
            if isinstance(message.get(key), str):
                message[key] = normalize_text(message[key])
        if message.get("tools") not in (None, ""):
            message["tools"] = canonical_tools_json(message["tools"], path, line, f"conversations[{index}].tools")
        result.append(message)
    return result
