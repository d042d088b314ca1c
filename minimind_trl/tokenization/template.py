"""The MiniMind chat template and the matching response-parsing template.

Turning an upstream row into ``(messages, tools)`` is the conversation schema's job
(:func:`minimind_trl.conversation.normalize_conversation`).

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
