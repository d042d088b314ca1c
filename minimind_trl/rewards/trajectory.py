"""One view of a completion, whatever form the trainer hands it in.

TRL's GRPOTrainer gives reward functions either

* a string (plain generation, or a whole multi-turn completion decoded to text, where tool
  results sit in ``<tool_response>…</tool_response>`` blocks), or
* in tool mode (``tools=`` / ``environment_factory=``, and the project's tool rollout, which
  builds the same form) a list of messages: assistant messages
  ``{"role": "assistant", "content": str, "tool_calls": [{"type": "function", "function":
  {"name", "arguments"}}], ...}`` and tool messages ``{"role": "tool", "name", "content"}``.
  When TRL cannot parse a turn's tool call it keeps the raw text (tags included) as
  ``content`` and runs no tool; the raw ``<tool_call>`` text is parsed here.

`view_completion` turns either into a `CompletionView`. Malformed calls are counted by the
protocol's one rule (`minimind_trl.envs.protocol.turn_malformed_calls`), as the training metric
``tool_malformed_per_trajectory`` and the evaluation records count them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from minimind_trl.envs.parsing import parse_tool_calls
from minimind_trl.envs.protocol import message_calls, message_malformed_calls, message_text, turn_malformed_calls
from minimind_trl.rewards.verifier import (
    ROLE_HEADER as _ROLE_HEADER,
    SPECIAL_TOKEN as _SPECIAL_TOKEN,
    final_answer_text,
)

# A block cannot hold another opening tag: the last <tool_response> before a close opens it. (With
# ``.*?`` alone every unclosed opening tag scanned to the end: quadratic in repeated tags.)
_RESPONSE_BLOCK = re.compile(r"<tool_response>((?:(?!<tool_response>).)*?)</tool_response>", re.DOTALL)
# A tool turn opens after a model turn's end: "<|im_end|>\n<|im_start|>user\n" in text decoded
# with special tokens kept (a model cannot write <|im_end|> inside its turn); in text without
# them, after a bare "user" line or right after a </tool_call>.
_TOOL_TURN_OPEN = re.compile(r"<\|im_end\|>\s*<\|im_start\|>user[ \t]*\n?\s*\Z")
_TOOL_TURN_OPEN_PLAIN = re.compile(r"(?:(?<![\w|>])user|</tool_call>)[ \t]*\n?\s*\Z")
_TURN_NOISE = re.compile(r"<\|[A-Za-z0-9_]{1,32}\|>|\b(?:user|assistant)\b|\s")
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


@dataclass
class CompletionView:
    """What the rewards and metrics need from one completion.

    ``turn_texts`` holds each assistant turn's text as the model wrote it, without special
    tokens and role headers (from the message form: reasoning, when carried separately, closed
    by ``</think>``; structured tool calls written back as ``<tool_call>`` blocks). ``calls``
    are the well-formed calls in order (structured ones and well-formed blocks in the text),
    ``malformed`` the malformed calls by the protocol's rule (every ``<tool_call>`` block of a
    reply read as plain text: a message without structured calls, or, in the text form, a turn
    whose reply has a malformed block), ``observations`` the tool results in order.
    ``unfinished`` is True when the last assistant turn still makes a well-formed tool call or
    the completion ends on a tool result: no final answer was given, and ``final_answer`` is "".
    (A last turn whose only call attempts are malformed is finished: its text outside the blocks
    is the answer; the malformed blocks are counted in ``malformed``.)
    """

    final_answer: str
    turn_texts: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    malformed: int = 0
    observations: list[str] = field(default_factory=list)
    unfinished: bool = False

    @property
    def turns(self) -> int:
        return len(self.turn_texts)


def _structured_calls(message: dict) -> list[dict]:
    calls = []
    for function in message_calls(message):
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                arguments = {"__raw__": arguments}
        calls.append({"name": function.get("name", ""), "arguments": arguments})
    return calls


def _render_call(call: dict) -> str:
    try:
        body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):  # arguments nested too deep to write back
        body = json.dumps({"name": str(call["name"]), "arguments": "<unreadable>"}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _view_messages(messages: list[dict]) -> CompletionView:
    view = CompletionView(final_answer="")
    last_assistant_calls, answer_source = False, ""
    for message in messages:
        role = message.get("role")
        if role == "tool":
            view.observations.append(message_text(message.get("content")))
            continue
        if role != "assistant":
            continue
        content = message_text(message.get("content"))
        parsed, structured = parse_tool_calls(content), _structured_calls(message)
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k)), "")
        text = (f"{reasoning}</think>" if reasoning else "") + content
        text += "".join("\n" + _render_call(c) for c in structured)
        view.turn_texts.append(text)
        view.calls.extend([*structured, *parsed.calls])
        view.malformed += message_malformed_calls(message)
        last_assistant_calls = bool(structured or parsed.calls)
        answer_source = content
    view.unfinished = bool(messages) and (messages[-1].get("role") == "tool"
                                          or last_assistant_calls)
    view.final_answer = "" if view.unfinished else final_answer_text(answer_source)
    return view


def tool_turn_observations(text: str) -> list[str]:
    """The ``<tool_response>`` blocks of real tool turns: a block that opens a tool turn
    (`_TOOL_TURN_OPEN` right before it; `_TOOL_TURN_OPEN_PLAIN` when the text has no
    ``<|im_end|>``) or follows such a block after only whitespace. With special tokens kept
    (evaluation's text), blocks the model wrote inside its own turn (a forged
    ``{"result": "42"}``) are not observations, so they can never make an answer ``tool_backed``."""
    opener = _TOOL_TURN_OPEN if "<|im_end|>" in text else _TOOL_TURN_OPEN_PLAIN
    found, last_end = [], None
    for match in _RESPONSE_BLOCK.finditer(text):
        follows_real = last_end is not None and not text[last_end:match.start()].strip()
        if follows_real or opener.search(text[max(0, match.start() - 64):match.start()]):
            found.append(match.group(1).strip())
            last_end = match.end()
    return found


def _view_text(text: str) -> CompletionView:
    view = CompletionView(final_answer=final_answer_text(text))
    view.observations = tool_turn_observations(text)
    segments = _RESPONSE_BLOCK.split(text)[0::2]  # the text between observation blocks
    for index, segment in enumerate(segments):
        turn = _SPECIAL_TOKEN.sub("", _ROLE_HEADER.sub("", segment))
        if index > 0:  # "assistant" header words left by skip_special_tokens decoding
            turn = re.sub(r"\A\s*assistant[ \t]*\n", "", turn)
        if index < len(segments) - 1:
            turn = re.sub(r"\n\s*user\s*\Z", "", turn)
        if turn.strip():
            view.turn_texts.append(turn.strip())
    for turn in view.turn_texts:
        view.calls.extend(parse_tool_calls(turn).calls)
        view.malformed += turn_malformed_calls(turn)
    ends_on_observation = bool(view.observations) and not _TURN_NOISE.sub("", segments[-1])
    last_turn_calls = bool(view.turn_texts) and bool(parse_tool_calls(view.turn_texts[-1]).calls)
    view.unfinished = ends_on_observation or last_turn_calls
    if view.unfinished:
        view.final_answer = ""
    return view


def view_completion(completion: str | list[dict]) -> CompletionView:
    """A `CompletionView` of a string or message-list completion."""
    if isinstance(completion, str):
        return _view_text(completion)
    if isinstance(completion, list):
        return _view_messages([m for m in completion if isinstance(m, dict)])
    raise TypeError(f"a completion is a str or a list of messages, got {type(completion).__name__}")
