"""Ground-truth verifier: does the final answer state every GT value?

`final_answer_text(text)` is the assistant text after the last ``</tool_response>`` with the
think block, any ``<tool_call>`` blocks and special tokens (``<|im_end|>`` ...) removed.

`verify(final_answer, gt, tool_results=())` compares the numbers in the answer
(`minimind_trl.rewards.numbers.find_numbers`: thousands separators, decimals, signs,
scientific notation, fractions, percentages, 万/亿, full-width digits) with each GT value.
GT values may be ints, floats or strings (``"20.5"``, ``"20758280"``, ``"1,000"``, ``"25%"``);
a string that is not a single number (e.g. ``"Hello World"``) is a *text* GT.

Matching rule for a number mention x (written with dx decimals) and a GT number g (dg
decimals; a Python float GT counts as written by its shortest repr):

1. equality: x == g exactly when both are exact decimals; when either side is inexact (a float
   GT or a fraction mention) |x − g| ≤ 1e-9 · max(1, |g|);
2. rounding: with p = min(dx, dg) (a fraction has unlimited precision), if p ≥ 2 then x matches
   when |x − g| ≤ ½·10^−p and |x − g| ≤ 1% of |g| — i.e. the two agree when rounded to the
   coarser written precision, as long as that keeps at least two decimals (``3.14`` matches
   3.14159, ``0.666667`` matches ``"0.6667"``; ``3`` does not match 3.14159, ``20.54`` does not
   match 20.5, ``0.00`` does not match 0.004);
3. percentages: a mention written ``p%`` may stand for p or p/100 (with dx + 2 decimals), and
   a GT written ``"p%"`` may be met by p, p% or p/100. So ``25%`` matches GT 25, 0.25 or
   ``"25%"``.

There is never substring matching on numbers: "9" does not match 2932. A text GT matches when
its NFKC, case-folded form is a substring of the answer's. If the answer holds more than
``max_numbers`` numbers (default 24) nothing matches: listing many candidates is not an
answer. ``success`` (= ``all_gt_covered``) needs every GT value matched and at least one GT
value; ``tool_backed`` is True when some successful tool observation (``{"result": ...}``)
matches a GT value by the same rule.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from minimind_trl.rewards.numbers import NumberMention, find_numbers, parse_number

DEFAULT_MAX_NUMBERS = 24
_INEXACT_TOL = Decimal("1e-9")
_ROUND_REL = Decimal("0.01")

SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,32}\|>")
ROLE_HEADER = re.compile(r"<\|im_start\|>\s*(?:assistant|user|system|tool)?")
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)|</tool_call>", re.DOTALL)
_LEADING_ROLE_WORD = re.compile(r"\A\s*assistant[ \t]*\n")


def strip_think(text: str) -> str:
    """Text after the last ``</think>``; with only an unclosed ``<think>``, the text before it."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return text.split("<think>", 1)[0]
    return text


def final_answer_text(completion_text: str) -> str:
    """The assistant's final answer: the text after the last ``</tool_response>`` (or all of
    it when there is none), with role headers, special tokens, the think block and
    ``<tool_call>`` blocks (closed or not) removed, stripped."""
    text = completion_text or ""
    cut = text.rfind("</tool_response>")
    if cut >= 0:
        text = text[cut + len("</tool_response>"):]
    text = text.split("<tool_response>", 1)[0]  # an unclosed observation is not answer text
    text = SPECIAL_TOKEN.sub("", ROLE_HEADER.sub("", text))
    if cut >= 0:
        text = _LEADING_ROLE_WORD.sub("", text)  # "assistant" left by skip_special_tokens
    text = _TOOL_CALL_BLOCK.sub("", strip_think(text))
    return text.strip()


@dataclass(frozen=True)
class GroundTruth:
    """A parsed GT value: a number (``number`` set) or a text (``text`` set)."""

    raw: Any
    number: NumberMention | None = None
    text: str | None = None


def parse_gt(value: Any) -> GroundTruth:
    if isinstance(value, bool):
        return GroundTruth(value, text=str(value))
    if isinstance(value, int):
        return GroundTruth(value, NumberMention(str(value), Decimal(value), 0))
    if isinstance(value, float):
        number = Decimal(repr(value))
        return GroundTruth(value, NumberMention(repr(value), number,
                                                max(0, -number.as_tuple().exponent), exact=False))
    mention = parse_number(str(value))
    if mention is not None:
        return GroundTruth(value, mention)
    return GroundTruth(value, text=str(value).strip())


def _candidates(m: NumberMention) -> list[tuple[Decimal, int | None]]:
    values = [(m.value, m.decimals)]
    if m.percent:
        values.append((m.value / 100, None if m.decimals is None else m.decimals + 2))
    return values


def numbers_match(x: NumberMention, g: NumberMention) -> bool:
    """The matching rule of the module docstring (equality, rounding, percentages)."""
    exact = x.exact and g.exact
    for xv, dx in _candidates(x):
        for gv, dg in _candidates(g):
            diff = abs(xv - gv)
            if diff == 0 or (not exact and diff <= _INEXACT_TOL * max(1, abs(gv))):
                return True
            precisions = [d for d in (dx, dg) if d is not None]
            p = min(precisions) if precisions else None
            if p is not None and p >= 2 and diff <= Decimal(5).scaleb(-p - 1) \
                    and diff <= _ROUND_REL * abs(gv):
                return True
    return False


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def gt_matches_text(gt: GroundTruth, text: str, mentions: list[NumberMention]) -> bool:
    if gt.number is None:
        return bool(gt.text) and _fold(gt.text) in _fold(text)
    return any(numbers_match(m, gt.number) for m in mentions)


def observation_result(observation: str) -> str | None:
    """The ``result`` string of a successful tool observation, else None. Accepts JSON and
    (as TRL writes failed calls) a Python-literal dict."""
    if not isinstance(observation, str) or len(observation) > 100_000:
        return None
    try:
        obj = json.loads(observation)
    except (ValueError, RecursionError):
        try:
            obj = ast.literal_eval(observation.strip())
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
            return None
    if isinstance(obj, dict) and "result" in obj and "error" not in obj:
        return str(obj["result"])
    return None


@dataclass(frozen=True)
class Verification:
    """Outcome of `verify` (see the module docstring for the rules)."""

    success: bool
    gt_hits: list[bool]
    all_gt_covered: bool
    gt_coverage: float
    tool_backed: bool
    numbers: list[float] = field(default_factory=list)
    too_many_numbers: bool = False


def verify(final_answer: str, gt: list | tuple, tool_results=(),
           max_numbers: int = DEFAULT_MAX_NUMBERS) -> Verification:
    """Check the final answer against every GT value (rules in the module docstring)."""
    gts = [parse_gt(g) for g in (gt or [])]
    mentions = find_numbers(final_answer or "", limit=max_numbers + 1)
    too_many = len(mentions) > max_numbers
    hits = [False if too_many else gt_matches_text(g, final_answer or "", mentions) for g in gts]
    backed = False
    for observation in tool_results or ():
        result = observation_result(observation)
        if result is not None:
            found = find_numbers(result, limit=max_numbers)
            backed = backed or any(gt_matches_text(g, result, found) for g in gts)
    covered = bool(gts) and all(hits)
    return Verification(
        success=covered, gt_hits=hits, all_gt_covered=covered,
        gt_coverage=sum(hits) / len(gts) if gts else 0.0, tool_backed=backed,
        numbers=[float(m.value) for m in mentions[:max_numbers]], too_many_numbers=too_many,
    )
