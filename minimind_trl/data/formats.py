"""The conversation schema as the data layer reads it: errors name the file and line.

The schema itself (upstream JSONL form vs chat-template messages, the task-prompt rule, tool-call
encoding) lives in :mod:`minimind_trl.conversation`. This module wraps it for file readers, under
names of its own (``row_*``) so that an import says which error a caller gets: a
:class:`~minimind_trl.conversation.ConversationError` becomes a :class:`DataFormatError` naming
``path``, ``line`` and the field, and JSON strings inside a row are parsed with the bounded
:func:`minimind_trl.fsio.loads_json` (nesting, lone surrogates, huge integers refused).
"""

from __future__ import annotations

from typing import Any

from minimind_trl import conversation
from minimind_trl.conversation import ConversationError
from minimind_trl.fsio import DataFormatError, loads_json


def row_tool_calls(value: Any, field: str = "tool_calls", path=None, line=None) -> list[dict]:
    """`minimind_trl.conversation.decode_tool_calls` with bounded JSON parsing; problems raise
    :class:`DataFormatError` naming ``path``, ``line`` and the field."""
    try:
        return conversation.decode_tool_calls(value, field, lambda text, where: loads_json(text, path, line, where))
    except ConversationError as exc:
        raise DataFormatError(path, line, exc.field, exc.reason) from None


def row_messages(conversations: list[dict], path=None, line=None) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` for ``tokenizer.apply_chat_template(messages, tools=tools, ...)``
    (`minimind_trl.conversation.conversations_to_messages`); problems raise :class:`DataFormatError`."""
    try:
        return conversation.conversations_to_messages(conversations)
    except ConversationError as exc:
        raise DataFormatError(path, line, exc.field, exc.reason) from None


def row_task_prompt(task: dict, path=None, line=None) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of a task row's prompt (`minimind_trl.conversation.task_prompt`: every
    trailing empty assistant placeholder dropped); problems raise :class:`DataFormatError`."""
    try:
        return conversation.task_prompt(task)
    except ConversationError as exc:
        raise DataFormatError(path, line, exc.field, exc.reason) from None
