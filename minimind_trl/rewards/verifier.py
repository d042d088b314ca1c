"""Ground-truth verifier: does the final answer state every GT value?

`final_answer_text(text)` is the assistant's last turn after its think block and any tool
response, with ``<tool_call>`` blocks and special tokens (``<|im_end|>`` ...) removed; it reads
evaluation's decoded text and training's parsed content alike.

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

4. zero: a GT of 0 is met only by a mention equal to 0 (the inexact tolerance is relative to
   |g|, so ``1e-30`` never meets GT 0.0; rounding cannot meet it either, its 1% of 0 is 0).

There is never substring matching on numbers: "9" does not match 2932. A text GT matches when
its NFKC, case-folded form (whitespace runs as one space) occurs in the answer's as whole words:
not inside a longer word ("Hello World" does not match "hello worldwide"); an end of the GT that
is a CJK character needs no word boundary (Chinese has no spaces).

An answer that hedges or negates gets no credit for that GT; a GT is hit when some mention
matches it and *no* mention matching it is negated or in a hedging list:

* negated: the mention follows "not", "n't", "never", "cannot", "rather than", "instead of",
  "≠", "!=", 不是, 不等于, 并非, 而非 or 不为, with at most three filler words between ("is not
  equal to 42"): "not 42" and "It is not 42; it is 43." get nothing for GT 42, while "42, not
  43" keeps its credit;
* hedging list: consecutive mentions joined only by spaces, commas, semicolons, ``、``,
  "and"/"or"/"either"/"maybe"/"perhaps"/"possibly"/"probably" or 和/与/及/以及/或/或者/还是/
  也许/可能 form a list; a list hedges when it holds more than ``MAX_EXTRA_CANDIDATES`` (1)
  distinct values that match no GT ("40 41 42 43"), or when it is a disjunction ("or", 或, 还是,
  "maybe", ...) with at least one such value ("42 or 43"). So one wrong value beside a right
  one in a plain list ("59 and 21" for GT [59, 20.5]) keeps the right one's credit.

If the answer holds more than ``max_numbers`` numbers (default 24) nothing matches: listing
many candidates is not an answer. ``success`` (= ``all_gt_covered``) needs every GT value
matched and at least one GT value; ``tool_backed`` is True when some successful tool
observation (``{"result": ...}``) matches a GT value by the same rules. The caller passes the
real observations (`minimind_trl.rewards.trajectory` reads them from tool turns only).
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from minimind_trl.rewards.numbers import NumberMention, find_numbers, normalize_number_text, parse_number

DEFAULT_MAX_NUMBERS = 24
MAX_EXTRA_CANDIDATES = 1
"""A list of numbers may hold this many distinct values matching no GT before it hedges."""
_INEXACT_TOL = Decimal("1e-9")
_ROUND_REL = Decimal("0.01")

SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,32}\|>")
ROLE_HEADER = re.compile(r"<\|im_start\|>\s*(?:assistant|user|system|tool)?")
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)|</tool_call>", re.DOTALL)
_LEADING_ROLE_WORD = re.compile(r"\A\s*assistant[ \t]*\n")
_LAST_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,32}\|>\Z")


def strip_think(text: str) -> str:
    """The one think-stripping rule (evaluation's text and training's messages both use it):
    the text after the last ``</think>`` (all of it when there is none), cut at a ``<think>``
    that opens after it and never closes (a think block still open is not an answer)."""
    return text.rsplit("</think>", 1)[-1].split("<think>", 1)[0]


def final_answer_text(completion_text: str) -> str:
    """The assistant's final answer, read the same way from evaluation's decoded text and from
    training's parsed message content:

    1. the last model turn: with special tokens kept, the text after the last ``<|im_end|>``
       before the end (a model cannot write ``<|im_end|>`` inside its turn, so the turn
       boundaries are real); role headers and special tokens removed;
    2. `strip_think` (the one think-stripping rule);
    3. the text after the last ``</tool_response>`` left (all of it when there is none), up to
       an unclosed ``<tool_response>``; a bare ``assistant`` line after it (what
       ``skip_special_tokens`` decoding leaves) dropped;
    4. ``<tool_call>`` blocks (closed or not) removed; stripped."""
    text = completion_text or ""
    body = text.rstrip()
    while (last := _LAST_SPECIAL.search(body, max(0, len(body) - 40))) is not None:
        body = body[:last.start()].rstrip()  # the closing <|im_end|> (and any padding after it)
    end = body.rfind("<|im_end|>")
    if end >= 0:
        text = body[end + len("<|im_end|>"):]
    text = strip_think(SPECIAL_TOKEN.sub("", ROLE_HEADER.sub("", text)))
    cut = text.rfind("</tool_response>")
    if cut >= 0:
        text = _LEADING_ROLE_WORD.sub("", text[cut + len("</tool_response>"):])
    text = text.split("<tool_response>", 1)[0]  # an unclosed observation is not answer text
    return _TOOL_CALL_BLOCK.sub("", text).strip()


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
    """The matching rule of the module docstring (equality, rounding, percentages, zero)."""
    exact = x.exact and g.exact
    for xv, dx in _candidates(x):
        for gv, dg in _candidates(g):
            diff = abs(xv - gv)
            if diff == 0 or (not exact and diff <= _INEXACT_TOL * abs(gv)):
                return True
            precisions = [d for d in (dx, dg) if d is not None]
            p = min(precisions) if precisions else None
            if p is not None and p >= 2 and diff <= Decimal(5).scaleb(-p - 1) \
                    and diff <= _ROUND_REL * abs(gv):
                return True
    return False


def _fold(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


_NEGATION = re.compile(
    r"(?:\bnot|n't|\bnever|\bcannot|\brather than|\binstead of|≠|!=|不是|不等于|并非|而非|不为)"
    r"[\s:,]*(?:(?:be|been|is|equal|equals|exactly|quite|just|to|even|really|actually|at all)[\s:,]+){0,3}\Z")
_LIST_WORD = r"and|or|either|maybe|perhaps|possibly|probably"
_LIST_GAP = re.compile(rf"[\s,;、]*(?:(?:\b(?:{_LIST_WORD})\b|以及|或者|还是|也许|可能|和|与|及|或)[\s,;、]*)*")
_DISJUNCTION = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|probably)\b|或|还是|也许|可能")


def _negated(folded: str, start: int) -> bool:
    return _NEGATION.search(folded[max(0, start - 48):start]) is not None


def _is_cjk(char: str) -> bool:
    return unicodedata.name(char, "").startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL"))


def _text_hit(gt_text: str, answer: str) -> bool:
    """Whole-word occurrence of a text GT, none of them negated (module docstring)."""
    needle, haystack = _fold(gt_text), _fold(answer)
    if not needle:
        return False
    left = r"(?<!\w)" if not _is_cjk(needle[0]) else ""
    right = r"(?!\w)" if not _is_cjk(needle[-1]) else ""
    starts = [m.start() for m in re.finditer(left + re.escape(needle) + right, haystack)]
    return bool(starts) and not any(_negated(haystack, i) for i in starts)


def _hedged(text: str, mentions: list[NumberMention], matched: list[bool]) -> list[bool]:
    """Per mention: does it stand in a hedging list (module docstring)?"""
    hedged = [False] * len(mentions)
    start = 0
    for end in range(1, len(mentions) + 1):
        if end < len(mentions):
            gap = text[mentions[end - 1].span[1]:mentions[end].span[0]]
            if _LIST_GAP.fullmatch(gap):
                continue
        run = range(start, end)
        if len(run) > 1:
            extras = {mentions[i].value for i in run if not matched[i]}
            gaps = text[mentions[start].span[1]:mentions[end - 1].span[0]]
            if len(extras) > MAX_EXTRA_CANDIDATES or (extras and _DISJUNCTION.search(gaps.casefold())):
                for i in run:
                    hedged[i] = True
        start = end
    return hedged


def gt_hits(text: str, gts: list[GroundTruth], max_numbers: int = DEFAULT_MAX_NUMBERS
            ) -> tuple[list[bool], list[NumberMention], bool]:
    """(hit per GT, the mentions read, too many numbers) for ``text`` by every rule above."""
    normalized = normalize_number_text(text or "")
    mentions = find_numbers(normalized, limit=max_numbers + 1, normalized=True)
    if len(mentions) > max_numbers:
        return [False] * len(gts), mentions, True
    folded = normalized.casefold()
    matches = [[g.number is not None and numbers_match(m, g.number) for g in gts] for m in mentions]
    hedged = _hedged(folded, mentions, [any(row) for row in matches])
    barred = [h or _negated(folded, m.span[0]) for m, h in zip(mentions, hedged)]
    hits = []
    for j, g in enumerate(gts):
        if g.number is None:
            hits.append(bool(g.text) and _text_hit(g.text, text or ""))
            continue
        matching = [i for i, row in enumerate(matches) if row[j]]
        hits.append(bool(matching) and not any(barred[i] for i in matching))
    return hits, mentions, False


def gt_matches_text(gt: GroundTruth, text: str, mentions: list[NumberMention] | None = None) -> bool:
    """Does ``text`` state ``gt`` by the rules above? (``mentions`` is ignored; kept for callers.)"""
    return gt_hits(text, [gt])[0][0]


def observation_result(observation: str) -> str | None:
    """The ``result`` string of a successful tool observation, else None. Accepts JSON and
    (as TRL writes failed calls) a Python-literal dict."""
    if not isinstance(observation, str) or len(observation) > 100_000:
        return None
    try:
        obj = json.loads(observation)
    except (ValueError, RecursionError):
        if not observation.lstrip().startswith("{"):
            return None
        try:
            with warnings.catch_warnings():  # no SyntaxWarning noise from a model's text
                warnings.simplefilter("ignore")
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
    hits, mentions, too_many = gt_hits(final_answer or "", gts, max_numbers)
    backed = False
    for observation in tool_results or ():
        result = observation_result(observation)
        if result is not None and not backed:
            backed = any(gt_hits(result, gts, max_numbers)[0])
    covered = bool(gts) and all(hits)
    return Verification(
        success=covered, gt_hits=hits, all_gt_covered=covered,
        gt_coverage=sum(hits) / len(gts) if gts else 0.0, tool_backed=backed,
        numbers=[float(m.value) for m in mentions[:max_numbers]], too_many_numbers=too_many,
    )
