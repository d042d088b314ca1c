"""The MiniMind chat template, the matching response-parsing template, and row normalisation.

Rendering contract (``tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
open_thinking=..., tokenize=False)``), byte-exact with upstream MiniMind's format:

* Tools go into the system turn as the ``# Tools`` preamble, one JSON object per line inside
  ``<tools>...</tools>``, after the system text (if any) and a blank line.
* Tools come from the ``tools=`` argument. Only when it is absent does the template fall back to a
  ``tools`` *list* on the first (system) message. Upstream data stores that field as a JSON
  *string*; Jinja cannot parse JSON, so the template refuses a string there with a message naming
  :func:`normalize_conversation`, which turns an upstream row into ``(messages, tools)``.
* Every assistant turn is ``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` followed by its tool calls
  and ``<|im_end|>``. Reasoning is ``reasoning_content`` or a ``<think>...</think>`` block already in
  ``content``; empty reasoning gives ``<think>\\n\\n</think>\\n\\n``.
* A tool call renders as ``<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>``; calls may be
  OpenAI-style (``{"type": "function", "function": {...}}``) or bare ``{"name", "arguments"}``;
  ``arguments`` as a dict is JSON-encoded, as a string it is written verbatim. Calls are separated
  by a newline, and by one from non-empty content.
* Consecutive ``tool`` messages share one ``<|im_start|>user`` turn of ``\\n<tool_response>\\n...
  \\n</tool_response>`` blocks.
* Generation prompt: ``<|im_start|>assistant\\n`` then ``<think>\\n`` if ``open_thinking`` else
  ``<think>\\n\\n</think>\\n\\n``.
  ``enable_thinking`` (Qwen3's flag) is an alias; ``open_thinking`` wins when both are given.
* Message content is a string, or OpenAI-style parts ``[{"type": "text", "text": ...}, ...]``
  rendered as their concatenated text (any other part type is refused).
* ``{% generation %}`` marks what the model writes after the matching generation prompt (for
  ``return_assistant_tokens_mask``), ending with ``<|im_end|>``.

The template is prefix-preserving (an earlier turn renders identically whatever follows), which
TRL's multi-turn tool loop requires.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

CHAT_TEMPLATE: str = resources.files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")

#: transformers' declarative parsing schema (``tokenizer.response_template``), used by
#: ``tokenizer.parse_response`` and so by TRL's tool loop. It reads the text after the last
#: ``<|im_start|>assistant\n`` of prompt + completion: ``<think>...</think>`` becomes
#: ``reasoning_content``, each ``<tool_call>`` JSON body one OpenAI-style entry of ``tool_calls``,
#: the rest (up to ``<|im_end|>``) ``content``.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "version": 1,
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        # A think block the model never closes ends at <|im_end|> (kept out of the reasoning text).
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>|(?=\s*<\|im_end\|>)", "content": "text"},
        "tool_calls": {
            # The leading \s* eats the newline before a call, so it never opens an empty content region.
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


def _loads(value: str, where: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at char {exc.pos})") from None


def _normalize_call(call: Any, where: str) -> dict:
    if not isinstance(call, dict):
        raise ValueError(f"{where}: a tool call must be an object, got {type(call).__name__}")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"{where}: a tool call needs a non-empty string 'name'")
    arguments = fn.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        raise ValueError(f"{where}.arguments: must be an object or a JSON string, got {type(arguments).__name__}")
    return {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def normalize_conversation(
    conversations: list[dict], where: str = "conversations"
) -> tuple[list[dict], list[dict] | None]:
    """Turn an upstream-format conversation into ``(messages, tools)`` for ``apply_chat_template``.

    Upstream rows keep the tool schemas as a JSON string in the system message's ``tools`` field
    and an assistant's ``tool_calls`` as a JSON string. This parses both, moves the tools out of
    the system message (returned separately, ``None`` when there are none) and puts tool calls in
    the OpenAI form. String ``arguments`` stay strings, so they render exactly as written.
    The input is not modified. Errors name ``where`` and the message index.
    """
    if not isinstance(conversations, list) or not conversations:
        raise ValueError(f"{where}: must be a non-empty list of messages")
    messages: list[dict] = []
    tools: list[dict] | None = None
    for index, raw in enumerate(conversations):
        here = f"{where}[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
            raise ValueError(f"{here}: a message must be an object with a string 'role'")
        message = copy.deepcopy(raw)
        raw_tools = message.pop("tools", None)
        if raw_tools not in (None, "", []):
            if index != 0 or message["role"] != "system":
                raise ValueError(f"{here}.tools: tools may only be given on the first (system) message")
            tools = _loads(raw_tools, f"{here}.tools") if isinstance(raw_tools, str) else raw_tools
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise ValueError(f"{here}.tools: must be a list of tool schema objects")
        raw_calls = message.pop("tool_calls", None)
        if raw_calls not in (None, "", []):
            calls = _loads(raw_calls, f"{here}.tool_calls") if isinstance(raw_calls, str) else raw_calls
            if not isinstance(calls, list):
                calls = [calls]
            message["tool_calls"] = [_normalize_call(c, f"{here}.tool_calls[{i}]") for i, c in enumerate(calls)]
        messages.append(message)
    return messages, tools
