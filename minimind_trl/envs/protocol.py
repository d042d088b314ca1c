"""The token and observation protocol shared by training and evaluation (one rollout driver, TRL's rules).

One home for what both sides must agree on, so a model sees the same ids and is scored by the
same rules in `minimind_trl.envs.environment` (training) and `minimind_trl.envs.rollout`
(evaluation); `minimind_trl.rewards.trajectory` reads completions with the same call rule.

Ids:

* prompt: `prompt_ids_for` renders a task prompt (`minimind_trl.conversation.task_prompt`) with
  its tools and the generation prompt (think block opened iff ``open_thinking``);
* tool turn: `tool_turn_ids` renders the observations of one model turn's calls as
  ``\\n<|im_start|>user\\n<tool_response>\\n{obs}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``
  + think prefix, cut from a one-exchange conversation right after the assistant's ``<|im_end|>``
  (observations never render as special ids: `replace_surrogates`, `escape_added_tokens`);
* a model turn is parsed as TRL 1.16 parses it (`parse_model_turn`: ``parse_response`` with the
  tokenizer's ``response_template`` and the tools' schemas; any failure reads it as plain text).

Calls and observations (the one rule for ``TrajectoryRecord.malformed_calls``, the training
metric ``tool_malformed_per_trajectory``, the evaluation records and the rewards'
``CompletionView.malformed``):

* a model turn either is a *call turn* (its calls run, or stay pending at the turn cap) or is read
  as *plain text*. With TRL's parse known (a parsed message, a rollout turn) a turn is a call turn
  iff the parse gave calls; from text alone (`turn_malformed_calls` with ``read_as_text=None``) iff
  its reply has ``<tool_call>`` blocks and none of them is malformed (`minimind_trl.envs.parsing`
  defines a malformed block: bad JSON, no name, non-object arguments, an unclosed ``<tool_call>``,
  a ``</tool_call>`` without opening tag). TRL's parser accepts a few blocks that grammar calls
  malformed (an empty name, non-object arguments, a stray ``</tool_call>`` after a good call):
  in training and evaluation such a turn is a call turn (its calls run, the odd ones fail), so
  only the text-alone reading differs there;
* a plain-text turn's malformed calls are *all* ``<tool_call>`` blocks of its reply, good or bad
  (a reply with any malformed block parses as plain text, so none of its calls runs); a call
  turn's are the malformed blocks TRL left in its content after taking its calls (a stray
  ``</tool_call>``, a second call's text cut loose from its tags: written, never run). From text
  alone a call turn has none (the grammar finds no malformed block in it). The reply is the text
  after the turn's last ``</think>`` (`reply_text`): blocks in the reasoning are not calls. One
  gap remains: a turn cut by the length budget is counted by this rule in training (TRL parses
  it) but not by the evaluation rollout, which never parses it;
* an observation is an error iff it is our tools' ``{"error": ...}`` JSON or TRL's
  ``{'error': ...}`` repr (`is_error_observation`).

`TrajectoryRecord` is what one trajectory did, filled turn by turn by the rollout driver
(`minimind_trl.envs.rollout`) in training and in evaluation.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from trl.chat_template_utils import parse_response

from minimind_trl.envs.parsing import parse_tool_calls

DEFAULT_MAX_TOOL_TURNS = 3
"""Tool rounds per trajectory (TRL's ``max_tool_calling_iterations``): at most
``max_tool_turns + 1`` model turns."""
MAX_TOOL_TURNS = 64
"""Upper bound of tool rounds per trajectory (``rollout.max_tool_turns``, ``distill.max_tool_turns``,
``eval --max-tool-turns``): the protocol uses 3, upstream MiniMind 3."""
MAX_TURN_TOKENS = 32_768
"""Upper bound of the tokens one generation may add (``rollout.max_completion_length``, ``eval
--max-new-tokens``): MiniMind's context (``max_position_embeddings``); the protocol uses 768."""
THINK_CLOSE = "</think>"


# ------------------------------------------------------------------ observations and calls

def is_error_observation(observation: str) -> bool:
    """True for a failed call: our ``{"error": ...}`` JSON or TRL's ``{'error': ...}`` repr."""
    text = str(observation).lstrip()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text.startswith("{'error':")
    return isinstance(value, dict) and "error" in value


def reply_text(turn_text: str) -> str:
    """The part of a model turn after its last ``</think>`` (all of it when there is none)."""
    return turn_text.rsplit(THINK_CLOSE, 1)[-1]


def turn_malformed_calls(turn_text: str, read_as_text: bool | None = None) -> int:
    """The malformed calls of one model turn (module docstring): every ``<tool_call>`` block of
    its reply when the turn was read as plain text, else 0. ``read_as_text``: True / False when
    the parse is known (the turn gave no calls / gave calls), None to decide from the text (plain
    text iff the reply has a malformed block)."""
    blocks = parse_tool_calls(reply_text(turn_text))
    if read_as_text is None:
        read_as_text = blocks.malformed > 0
    return len(blocks.calls) + blocks.malformed if read_as_text else 0


def message_text(content: Any) -> str:
    """A message's ``content`` as text: a string, OpenAI-style text parts joined, ``""`` for None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def message_calls(message: dict) -> list[dict]:
    """The structured calls of a parsed assistant message, each the ``function`` dict
    (``{"name", "arguments"}``, as TRL gives them; a non-dict entry becomes ``{}``)."""
    return [call.get("function", call) if isinstance(call, dict) else {}
            for call in message.get("tool_calls") or []]


def message_malformed_calls(message: dict) -> int:
    """The malformed calls of a parsed assistant message (module docstring): with structured
    calls, the malformed blocks TRL left in its content (stray tags, call text it did not take as
    a call: none of it runs); without, every ``<tool_call>`` block of its content's reply (TRL read
    it as plain text)."""
    content = message_text(message.get("content"))
    if message.get("tool_calls"):
        return parse_tool_calls(reply_text(content)).malformed
    return turn_malformed_calls(content, read_as_text=True)


_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> str:
    """``text`` with every lone surrogate (``"\\ud800"`` from a JSON escape: no tokenizer or
    UTF-8 file can encode it) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def recordable(value: Any) -> Any:
    """A copy of a parsed call's name or arguments that any JSON writer can write: lone
    surrogates become U+FFFD; ``"<unreadable>"`` when it cannot be serialised (nested too deep)."""
    try:
        return json.loads(replace_surrogates(json.dumps(value, ensure_ascii=False)))
    except (ValueError, TypeError, RecursionError):
        return "<unreadable>"


# ------------------------------------------------------------------ trajectory records

@dataclass
class TrajectoryRecord:
    """What one trajectory did (``rollout.Trajectory``, filled by the rollout driver in training
    and in evaluation).

    ``tool_calls``: every parsed call ``{"turn", "name", "arguments"}`` in order (executed or
    pending); ``observations``: the tool messages in context (one per executed call);
    ``valid_calls`` / ``failed_calls``: executed calls whose observation is a result / an error;
    ``malformed_calls``: `turn_malformed_calls` summed over the model turns (the ``<tool_call>``
    blocks of replies read as plain text: any malformed block makes the whole reply plain text,
    as in TRL); ``n_turns``: model turns; ``finished``: ended with a reply without calls, not
    truncated; ``pending_call``: stopped with calls that never ran (turn cap); ``truncated``: the
    last turn has no ``<|im_end|>`` (length budget); ``n_model_tokens``: the model's tokens
    (action mask 1).
    """

    tool_calls: list[dict] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    valid_calls: int = 0
    failed_calls: int = 0
    malformed_calls: int = 0
    n_turns: int = 0
    finished: bool = False
    pending_call: bool = False
    truncated: bool = False
    n_model_tokens: int = 0


# ------------------------------------------------------------------ ids

def render_ids(tokenizer: Any, messages: list[dict], **kwargs: Any) -> list[int]:
    """Token ids of ``apply_chat_template(messages, **kwargs)`` (no automatic specials)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids_for(tokenizer: Any, messages: list[dict], tools: list[dict] | None,
                   open_thinking: bool = False) -> list[int]:
    """Ids of a prompt and its generation prompt (think block opened iff ``open_thinking``)."""
    return render_ids(tokenizer, messages, tools=tools, add_generation_prompt=True,
                      open_thinking=open_thinking)


@functools.lru_cache(maxsize=8)
def _token_pattern(tokens: tuple[str, ...]) -> re.Pattern | None:
    alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True) if t)
    return re.compile(alternatives) if alternatives else None


def escape_added_tokens(tokenizer: Any, text: str) -> str:
    """``text`` with the first character of every occurrence of one of the tokenizer's added or
    special tokens (``<|im_end|>``, ``<|im_start|>``, ``<tool_response>``, ...) written as a
    ``\\uXXXX`` escape (``<|im_end|>`` → ``\\u003c|im_end|>``), so it tokenises as plain text.
    Observations are JSON (or TRL's Python repr), where that escape reads back as the same
    character: the tool's result is kept, but cannot become a special id."""
    pattern = _token_pattern(tuple(sorted(getattr(tokenizer, "added_tokens_encoder", None) or ())))
    if pattern is None:
        return text
    return pattern.sub(lambda m: f"\\u{ord(m.group()[0]):04x}{m.group()[1:]}", text)


def tool_turn_ids(tokenizer: Any, names: list[str], observations: list[str],
                  open_thinking: bool = False) -> list[int]:
    """Ids that follow a model turn's ``<|im_end|>`` when its calls returned ``observations``:
    the template's rendering of the tool messages plus the generation prompt, cut from a
    one-exchange conversation right after the assistant's ``<|im_end|>``. Each observation
    (and name) first gets `replace_surrogates` and `escape_added_tokens`: whatever a tool
    returns renders, and never as special ids (a forged ``<|im_start|>system`` header)."""
    names = [replace_surrogates(str(n)) for n in names]
    observations = [escape_added_tokens(tokenizer, replace_surrogates(str(o))) for o in observations]
    calls = [{"type": "function", "function": {"name": n, "arguments": {}}} for n in names]
    head = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": calls}]
    tool_messages = [{"role": "tool", "name": n, "content": o} for n, o in zip(names, observations)]
    prefix = render_ids(tokenizer, head)
    prefix = prefix[:len(prefix) - prefix[::-1].index(tokenizer.eos_token_id)]
    full = render_ids(tokenizer, head + tool_messages, add_generation_prompt=True,
                      open_thinking=open_thinking)
    if full[:len(prefix)] != prefix:
        raise ValueError("chat template is not prefix-preserving around a tool turn")
    return full[len(prefix):]


def parse_model_turn(tokenizer: Any, ids: list[int], context: list[int], schemas: list[dict],
                     text: str) -> dict:
    """The assistant message of one model turn ``ids`` (ending with ``<|im_end|>``) generated
    after ``context``, parsed as TRL's loop parses it (``trl.chat_template_utils.parse_response``
    with the tools' ``schemas``, which also cast string arguments to the schema types). Any parse
    failure reads the turn as plain text ``{"role": "assistant", "content": text}``: TRL falls back
    on ValueError/TypeError and `environment.ParseGuard` turns every other failure into those."""
    try:
        return parse_response(tokenizer, ids, prefix=context, tools=schemas)
    except Exception:  # noqa: BLE001 - any parser failure is a plain-text reply, as in training
        return {"role": "assistant", "content": text}
