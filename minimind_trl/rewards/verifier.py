"""Ground-truth verifier: does the final answer state every GT value?

`final_answer_text(text)` is the assistant's last turn after its think block and any tool
response, with ``<tool_call>`` blocks and special tokens (``<|im_end|>`` ...) removed; it reads
evaluation's decoded text and training's parsed content alike.

`verify(final_answer, gt, tool_results=(), question="")` compares the numbers in the answer
(`minimind_trl.rewards.numbers.find_numbers`: thousands separators, decimals, signs,
scientific notation, fractions, percentages, 万/亿, full-width digits) with each GT value.
GT values may be ints, floats or strings (``"20.5"``, ``"20758280"``, ``"1,000"``, ``"25%"``);
a string that is not a single number (e.g. ``"Hello World"``) is a *text* GT. ``question`` is
the task's question: `asks_for_percentage` reads from it how a percent sign is read.

Matching rule for a number mention x (written with dx decimals) and a GT number g (dg
decimals; a Python float GT counts as written by its shortest repr):

1. equality: x == g exactly when both are exact decimals; when either side is inexact (a float
   GT or a fraction mention) |x − g| ≤ 1e-9 · max(1, |g|);
2. rounding: with p = min(dx, dg) (a fraction has unlimited precision), if p ≥ 2 then x matches
   when |x − g| ≤ ½·10^−p and |x − g| ≤ 1% of max(|x|, |g|) — i.e. the two agree when rounded to
   the coarser written precision, as long as that keeps at least two decimals (``3.14`` matches
   3.14159, ``0.666667`` matches ``"0.6667"``; ``3`` does not match 3.14159, ``20.54`` does not
   match 20.5, ``0.00`` does not match 0.004). The rule is symmetric: ``0.33`` meets GT 1/3 and
   ``1/3`` meets GT 0.33;
3. percentages: when the task asks for a percentage, a mention written ``p%`` (or "p percent",
   百分之p) states p, the number its GT is written in (``68.75%`` meets 68.75); otherwise it
   states the quantity p/100 (with dx + 2 decimals), which meets only a GT of magnitude at most 1:
   ``25%`` meets GT 0.25, not GT 25; ``4200%`` never meets 42, and ``0.25%`` does not meet GT
   0.25. A GT written ``"p%"`` asks for a percentage and is met by p, p% or p/100;
4. zero: a GT of 0 is met only by a mention equal to 0 (the inexact tolerance is relative to
   |g|, so ``1e-30`` never meets GT 0.0; rounding cannot meet it either, its 1% of 0 is 0).

There is never substring matching on numbers: "9" does not match 2932. A text GT matches when
its NFKC, case-folded form (whitespace runs as one space) occurs in the answer's as whole words:
not inside a longer word ("Hello World" does not match "hello worldwide"); an end of the GT that
is a CJK character needs no word boundary (Chinese has no spaces).

What each number in the answer is — a label, an operand of an equation chain or of an unevaluated
power, root or quotient, a number of a bare expression, a barred number (negated, struck through,
a bound, a range, one of two values offered as alternatives) or a candidate — is
`minimind_trl.rewards.roles` (its module docstring; the full table of forms is docs/verifier.md).

A GT is hit when the candidates fill the GT slots one to one (a maximum matching: one mention
fills at most one slot, so equal GTs need as many mentions), one of them matching this GT, and no
barred number or bare-expression number matches it. When the answer boxes a candidate
(``\\boxed{}``), only boxed candidates fill slots. Hedging: when the candidates and barred
numbers hold more than ``MAX_EXTRA_CANDIDATES`` (1) distinct values that match no GT, or the boxes
hold more distinct values than there are GT slots, *no* number GT is hit, whatever separates them
(spaces, commas, periods, newlines, bullets, numbered lines, boxes): an answer offers at most one
value per GT slot plus one other (so "59 and 21" for [59, 20.5] keeps 59's credit, "59, 21 and
22" gets none). JSON objects in the answer (an echoed tool call) are blanked before reading.

If the answer holds more than ``max_numbers`` numbers (default 24) nothing matches: listing
many candidates is not an answer. ``success`` (= ``all_gt_covered``) needs every GT value
matched and at least one GT value; ``tool_backed`` is True when some successful tool
observation (``{"result": ...}``) matches a GT value by the same rules. The caller passes the
real observations (`minimind_trl.rewards.trajectory` reads them from tool turns only). Every
step does work linear in the text's length (issue 40.3).
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
from minimind_trl.rewards.roles import (
    BARRED,
    CANDIDATE,
    TAKES_CREDIT,
    VALUE_ROLES,
    alternatives,
    boxed,
    negated,
    number_roles,
)

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


def _remove_think_blocks(text: str) -> str:
    """Every closed ``<think>…</think>`` block (an opening tag up to the next closing tag) replaced by
    a space, found left to right with `str.find` (linear: a regex ``<think>.*?</think>`` scans to the
    end from every unclosed opening tag)."""
    parts, position = [], 0
    while (start := text.find("<think>", position)) >= 0:
        end = text.find("</think>", start + len("<think>"))
        if end < 0:
            break
        parts.append(text[position:start] + " ")
        position = end + len("</think>")
    return "".join(parts) + text[position:]


def strip_think(text: str) -> str:
    """The one think-stripping rule (evaluation's text and training's messages both use it):
    every closed ``<think>…</think>`` block is removed (so a block after the answer does not
    erase it), then the text after the last remaining ``</think>`` is kept (it closed a block
    opened in the prompt), cut at a ``<think>`` that never closes (a think block still open is
    not an answer)."""
    return _remove_think_blocks(text).rsplit("</think>", 1)[-1].split("<think>", 1)[0]


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


_PERCENT_QUESTION = re.compile(
    r"\b(?:what|which|how many)\s++(?:percent(?:age)?s?\b|%)|\bpercentages?\b|\bas an? (?:percent\b|%)"
    r"|\bin percent\b|百分之几|百分之多少|百分比|百分率|多少\s*+%|几\s*+%", re.IGNORECASE)


def asks_for_percentage(question: str) -> bool:
    """Does the task ask for a percentage ("What percentage of 80 is 20?", "20 is what percent of
    80?", 占…的百分之几)? Then an answer's ``p%`` states p, the number the GT is written in.
    ("What is 20% of 50?" asks for a quantity.)"""
    return bool(question) and _PERCENT_QUESTION.search(question) is not None


def _as_quantity(m: NumberMention) -> tuple[Decimal, int | None]:
    """The quantity ``p%`` states outside a percentage question: p/100 (two more decimals)."""
    return m.value / 100, None if m.decimals is None else m.decimals + 2


def _readings(x: NumberMention, g: NumberMention, percent_question: bool) -> list[tuple[tuple, tuple]]:
    """The (answer reading, GT reading) pairs compared, each (value, decimals): a percentage meets
    a GT written with ``%`` or a percentage question's GT by its number of percent; otherwise it
    states p/100, which meets only a GT of magnitude at most 1 (a proportion: ``4200%`` never
    meets 42). A GT written ``"25%"`` is met by 25, 25% or 0.25."""
    written = (x.value, x.decimals), (g.value, g.decimals)
    if x.percent and (g.percent or percent_question):
        return [written]
    if x.percent:
        return [(_as_quantity(x), written[1])] if abs(g.value) <= 1 else []
    return [written, (written[0], _as_quantity(g))] if g.percent else [written]


def numbers_match(x: NumberMention, g: NumberMention, percent_question: bool = False) -> bool:
    """The matching rule of the module docstring (equality, rounding, percentages, zero)."""
    exact = x.exact and g.exact
    for (xv, dx), (gv, dg) in _readings(x, g, percent_question):
        diff = abs(xv - gv)
        if diff == 0 or (not exact and diff <= _INEXACT_TOL * abs(gv)):
            return True
        precisions = [d for d in (dx, dg) if d is not None]
        p = min(precisions) if precisions else None
        if p is not None and p >= 2 and diff <= Decimal(5).scaleb(-p - 1) \
                and diff <= _ROUND_REL * max(abs(gv), abs(xv)):
            return True
    return False


def _fold(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _fold_in_place(text: str) -> str:
    """``text`` case-folded character by character, its length kept (so spans still apply: ``ß`` →
    ``ss`` would shift every later context window)."""
    folded = text.casefold()
    if len(folded) == len(text):
        return folded
    return "".join(c.casefold() if len(c.casefold()) == 1 else c for c in text)


MAX_JSON_OBJECTS = 64
"""At most this many ``{`` are tried as the start of a JSON object echoed in the answer."""


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
    return bool(starts) and not any(negated(haystack, i) for i in starts)


def _blank_json(text: str) -> str:
    """Blank every JSON object in ``text`` (a tool call echoed in prose is not an answer)."""
    decoder, tried, position = json.JSONDecoder(), 0, text.find("{")
    while position >= 0 and tried < MAX_JSON_OBJECTS:
        tried += 1
        try:
            obj, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            position = text.find("{", position + 1)
            continue
        if isinstance(obj, dict):
            text = text[:position] + " " * (end - position) + text[end:]
        position = text.find("{", end)
    return text


def _assign_slots(eligible: list[list[int]]) -> list[bool]:
    """Per GT slot: does it get a mention of its own? A maximum one-to-one matching of slots to
    the mentions that may fill them (augmenting paths; a mention fills at most one slot)."""
    owner: dict[int, int] = {}
    for slot in range(len(eligible)):
        _augment(slot, eligible, owner, set())
    filled = [False] * len(eligible)
    for slot in owner.values():
        filled[slot] = True
    return filled


def _augment(slot: int, eligible: list[list[int]], owner: dict[int, int], seen: set[int]) -> bool:
    for mention in eligible[slot]:
        if mention in seen:
            continue
        seen.add(mention)
        if mention not in owner or _augment(owner[mention], eligible, owner, seen):
            owner[mention] = slot
            return True
    return False


def _hedging(mentions: list[NumberMention], roles: list[str], matches: list[list[bool]], inside_box: list[bool],
             slots: int) -> bool:
    """More than `MAX_EXTRA_CANDIDATES` distinct offered values matching no GT, or more distinct
    boxed values than GT slots: no number GT is hit."""
    offered = [i for i, role in enumerate(roles) if role in VALUE_ROLES]
    extras = {mentions[i].value for i in offered if not any(matches[i])}
    boxes = {mentions[i].value for i in offered if inside_box[i]}
    return len(extras) > MAX_EXTRA_CANDIDATES or len(boxes) > max(1, slots)


def _credited(roles: list[str], inside_box: list[bool]) -> list[bool]:
    """Per mention: may it fill a GT slot? Candidates; when the answer boxes a candidate, the boxes
    are the answer and only boxed candidates."""
    candidates = [role == CANDIDATE for role in roles]
    if any(c and b for c, b in zip(candidates, inside_box)):
        return [c and b for c, b in zip(candidates, inside_box)]
    return candidates


def gt_hits(text: str, gts: list[GroundTruth], max_numbers: int = DEFAULT_MAX_NUMBERS,
            percent_question: bool = False) -> tuple[list[bool], list[NumberMention], bool]:
    """(hit per GT, the mentions read, too many numbers) for ``text`` by every rule above."""
    normalized = _blank_json(normalize_number_text(text or ""))
    mentions = find_numbers(normalized, limit=max_numbers + 1, normalized=True)
    if len(mentions) > max_numbers:
        return [False] * len(gts), mentions, True
    folded = _fold_in_place(normalized)
    roles = number_roles(folded, mentions)
    matches = [[g.number is not None and numbers_match(m, g.number, percent_question) for g in gts]
               for m in mentions]
    offered_as_alternatives = alternatives(folded, mentions, roles, [any(row) for row in matches])
    roles = [BARRED if alternative else role for role, alternative in zip(roles, offered_as_alternatives)]
    number_slots = [j for j, g in enumerate(gts) if g.number is not None]
    inside_box = boxed(normalized, mentions)
    hedging = _hedging(mentions, roles, matches, inside_box, len(number_slots))
    credited = _credited(roles, inside_box)
    eligible = [[i for i, row in enumerate(matches) if row[j] and credited[i]] for j in number_slots]
    filled = dict(zip(number_slots, _assign_slots(eligible)))
    hits = []
    for j, g in enumerate(gts):
        if g.number is None:
            hits.append(bool(g.text) and _text_hit(g.text, text or ""))
            continue
        barred = any(row[j] and roles[i] in TAKES_CREDIT for i, row in enumerate(matches))
        hits.append(filled[j] and not barred and not hedging)
    return hits, mentions, False


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
           max_numbers: int = DEFAULT_MAX_NUMBERS, question: str = "") -> Verification:
    """Check the final answer against every GT value (rules in the module docstring); ``question``
    is the task's question (`asks_for_percentage` reads it)."""
    gts = [parse_gt(g) for g in (gt or [])]
    percent_question = asks_for_percentage(question)
    hits, mentions, too_many = gt_hits(final_answer or "", gts, max_numbers, percent_question)
    backed = False
    for observation in tool_results or ():
        result = observation_result(observation)
        if result is not None and not backed:
            backed = any(gt_hits(result, gts, max_numbers, percent_question)[0])
    covered = bool(gts) and all(hits)
    return Verification(
        success=covered, gt_hits=hits, all_gt_covered=covered,
        gt_coverage=sum(hits) / len(gts) if gts else 0.0, tool_backed=backed,
        numbers=[float(m.value) for m in mentions[:max_numbers]], too_many_numbers=too_many,
    )
