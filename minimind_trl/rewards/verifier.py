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
   when |x − g| ≤ ½·10^−p and |x − g| ≤ 1% of max(|x|, |g|) — i.e. the two agree when rounded to
   the coarser written precision, as long as that keeps at least two decimals (``3.14`` matches
   3.14159, ``0.666667`` matches ``"0.6667"``; ``3`` does not match 3.14159, ``20.54`` does not
   match 20.5, ``0.00`` does not match 0.004). The rule is symmetric: ``0.33`` meets GT 1/3 and
   ``1/3`` meets GT 0.33;
3. percentages: a mention written ``p%`` (or "p percent", 百分之p) states the quantity p/100
   (with dx + 2 decimals): ``25%`` meets GT 0.25, not GT 25, and ``0.25%`` does not meet GT
   0.25. A GT written ``"p%"`` asks for a percentage and is met by p, p% or p/100.
4. zero: a GT of 0 is met only by a mention equal to 0 (the inexact tolerance is relative to
   |g|, so ``1e-30`` never meets GT 0.0; rounding cannot meet it either, its 1% of 0 is 0).

There is never substring matching on numbers: "9" does not match 2932. A text GT matches when
its NFKC, case-folded form (whitespace runs as one space) occurs in the answer's as whole words:
not inside a longer word ("Hello World" does not match "hello worldwide"); an end of the GT that
is a CJK character needs no word boundary (Chinese has no spaces).

What each number in the answer is (`_roles`; the full table of forms is docs/verifier.md):

* an **enumerator** — ``(1) …``, a numbered line ``1. …``, ``Step 2: …``, ``第1题`` — is a label
  and is ignored;
* in an **equation chain** (numbers joined by operators and ``=`` / ``≈`` / "is" / 等于, a unit
  word allowed before ``=``) only the last one-number segment is stated: ``12 + 30 = 42`` states
  42, ``42 = 40 + 2`` states 42, ``5 km = 5000 m`` states 5000; the rest are **operands**, ignored.
  A bare expression with no ``=`` (``40 + 2``, ``42-45``) states nothing and its numbers are barred;
* the argument of a function (``sqrt(1764)``, ``√1764``, ``log(100)``, ``5!``, ``10 squared``)
  is an operand, not its value;
* **barred**: a number after a negation ("not", "n't", "never", "cannot", "rather than",
  "instead of", ``≠``, ``!=``, 不是, 不等于, 并非, 而非, 不为, with at most three filler words
  between) or before one ("42 is wrong", "42 is not the answer", 42不对); a bound ("at least",
  "more than", "up to", ``>``, ``≥``, 至少, 超过, "42 or more", 42以上); a range ("42 to 45",
  "between 42 and 45", ``42~45``); a disjunction of candidates with a value matching no GT
  ("42 or 43", "maybe 40, maybe 42", 42还是43). A barred number matching a GT takes that GT's
  credit away;
* every other number is a **candidate**.

A GT is hit when some candidate matches it and no barred number does. Hedging: when the
candidates and barred numbers hold more than ``MAX_EXTRA_CANDIDATES`` (1) distinct values that
match no GT, *no* number GT is hit, whatever separates them (spaces, commas, periods, newlines,
bullets, numbered lines, boxes): an answer offers at most one value per GT slot plus one other
(so "59 and 21" for [59, 20.5] keeps 59's credit, "59, 21 and 22" gets none). JSON objects in
the answer (an echoed tool call) are blanked before reading.

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


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_think(text: str) -> str:
    """The one think-stripping rule (evaluation's text and training's messages both use it):
    every closed ``<think>…</think>`` block is removed (so a block after the answer does not
    erase it), then the text after the last remaining ``</think>`` is kept (it closed a block
    opened in the prompt), cut at a ``<think>`` that never closes (a think block still open is
    not an answer)."""
    return _THINK_BLOCK.sub(" ", text).rsplit("</think>", 1)[-1].split("<think>", 1)[0]


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


def _quantity(m: NumberMention) -> tuple[Decimal, int | None]:
    """The quantity a mention states: ``25%`` states 0.25 (two more decimals)."""
    if m.percent:
        return m.value / 100, None if m.decimals is None else m.decimals + 2
    return m.value, m.decimals


def _gt_readings(g: NumberMention) -> list[tuple[Decimal, int | None]]:
    """A GT written ``"25%"`` asks for a percentage: 25 (the number of percent) or 0.25."""
    return [(g.value, g.decimals), _quantity(g)] if g.percent else [_quantity(g)]


def numbers_match(x: NumberMention, g: NumberMention) -> bool:
    """The matching rule of the module docstring (equality, rounding, percentages, zero)."""
    exact = x.exact and g.exact
    xv, dx = _quantity(x)
    for gv, dg in _gt_readings(g):
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


_NEGATION = re.compile(
    r"(?:\bnot|n't|\bnever|\bcannot|\brather than|\binstead of|≠|!=|不是|不等于|并非|而非|不为)"
    r"[\s:,]*(?:(?:be|been|is|equal|equals|exactly|quite|just|to|even|really|actually|at all)[\s:,]+){0,3}\Z")
_NEGATED_AFTER = re.compile(
    r"\A[\s,)]*(?:is|was|would be|seems|looks)?[\s,]*(?:wrong|incorrect|false|invalid|a mistake|an error"
    r"|not (?:right|correct|the answer|it|true|valid)|isn't (?:right|correct|the answer|it)"
    r"|是?(?:错的|错误|不对|不正确))")
_BOUND_BEFORE = re.compile(
    r"(?:\bat least|\bat most|\bno (?:more|less|fewer) than|\bnot (?:more|less|fewer) than|\bmore than"
    r"|\bless than|\bfewer than|\bgreater than|\blarger than|\bsmaller than|\bhigher than|\blower than"
    r"|\bover|\bunder|\babove|\bbelow|\bup to|\bexceeds?|\bexceeding|\bbetween|\bfrom|>=|<=|≥|≤|>|<"
    r"|至少|至多|最多|最少|不少于|不超过|超过|大于|小于|不到|介于)\s*\Z")
_BOUND_AFTER = re.compile(
    r"\A\s*(?:\+(?!\s*[\d(])|or (?:more|less|fewer|higher|lower|above|below|greater|so|over|under)\b"
    r"|and (?:up|above|over|more|higher)\b|以上|以下|以内|之间|多(?!少))")
_RANGE_GAP = re.compile(r"\s*(?:to|through|until|~|至|到|and)\s*")
_FUNCTION_BEFORE = re.compile(
    r"(?:\bsqrt|√|∛|\bcbrt|\blog\d*|\bln|\blg|\bexp|\bsin|\bcos|\btan|\babs|\bfactorial|\bfact"
    r"|\broot of|\bsquare root of|\bcube root of|\blog of|根号|开方)\s*\(?\s*\Z")
_FUNCTION_AFTER = re.compile(r"\A\s*(?:!(?!=)|squared\b|cubed\b|的平方根|的阶乘|的平方|的立方)")
_ENUM_WRAPPED = (re.compile(r"(?:\A|[\n;:,.。!?])\s*\(\s*\Z"), re.compile(r"\A\s*\)[ \t]*\S"))
_ENUM_LINE = (re.compile(r"(?:\A|\n)[ \t]*(?:[-*•][ \t]*)?\Z"), re.compile(r"\A(?:[.)、:])[ \t]+\S"))
_ENUM_WORD = (re.compile(r"(?:\bstep|\bquestion|\bpart|\bproblem|\bcase|\bitem|\bno\.|#|第)[ \t]*\Z"),
              re.compile(r"\A\s*(?:[:.)、]|题|步|问)"))
_OPERATOR_GAP = re.compile(r"[\s()\[\]!]*(?:\*\*|[-+*/×÷^]|x|mod)[\s()\[\]]*")
_EQUALS_GAP = re.compile(r"[\s()\[\]!]*(?:[^\W\d_]+[\s/]*){0,3}(?:==|=|≈|\bequals?\b|\bis\b|等于|得)[\s()\[\]]*")
_LIST_WORD = r"and|or|either|maybe|perhaps|possibly|probably"
_LIST_GAP = re.compile(rf"[\s,;、]*(?:(?:\b(?:{_LIST_WORD})\b|以及|或者|还是|也许|可能|和|与|及|或)[\s,;、]*)*")
_DISJUNCTION = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|probably)\b|或|还是|也许|可能")
MAX_JSON_OBJECTS = 64
"""At most this many ``{`` are tried as the start of a JSON object echoed in the answer."""

CANDIDATE, OPERAND, ENUMERATOR, BARRED = "candidate", "operand", "enumerator", "barred"
"""What a number in the answer is (module docstring): only candidates earn credit; a barred
number matching a GT takes that GT's credit away; operands and enumerators are ignored."""


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


def _is_enumerator(folded: str, m: NumberMention) -> bool:
    """``(1) …``, a numbered line ``1. …``, ``Step 1: …``, ``第1题``: a label, not a value."""
    if not (m.exact and m.decimals == 0 and not m.percent and 0 < m.value < 100 and m.text.isdigit()):
        return False
    before, after = folded[max(0, m.span[0] - 24):m.span[0]], folded[m.span[1]:m.span[1] + 8]
    return any(b.search(before) and a.search(after) for b, a in (_ENUM_WRAPPED, _ENUM_LINE, _ENUM_WORD))


def _roles(folded: str, mentions: list[NumberMention]) -> list[str]:
    """Per mention: `CANDIDATE`, `OPERAND`, `ENUMERATOR` or `BARRED` (module docstring)."""
    roles = [ENUMERATOR if _is_enumerator(folded, m) else CANDIDATE for m in mentions]
    values = [i for i, role in enumerate(roles) if role != ENUMERATOR]
    # equation chains: mentions joined by operators or "="; per chain only the value of its last
    # one-number segment is stated, every other number in it is an operand
    chain: list[list[int]] = [[]]  # segments of the current chain
    for k, i in enumerate(values):
        chain[-1].append(i)
        nxt = values[k + 1] if k + 1 < len(values) else None
        gap = folded[mentions[i].span[1]:mentions[nxt].span[0]] if nxt is not None else None
        binary_sign = gap is not None and not gap.strip() and "\n" not in gap and mentions[nxt].text[0] in "+-"
        if gap is not None and (_OPERATOR_GAP.fullmatch(gap) or binary_sign):
            continue
        if gap is not None and _EQUALS_GAP.fullmatch(gap):
            chain.append([])
            continue
        if len(chain) > 1:  # an equation
            singles = [segment[0] for segment in chain if len(segment) == 1]
            for segment in chain:
                for j in segment:
                    roles[j] = CANDIDATE if singles and j == singles[-1] else OPERAND
        elif len(chain[0]) > 1:  # a bare expression ("40 + 2", "42-45") states no value
            for j in chain[0]:
                roles[j] = BARRED
        chain = [[]]
    for i, m in enumerate(mentions):
        start, end = m.span
        before, after = folded[max(0, start - 48):start], folded[end:end + 40]
        if roles[i] == ENUMERATOR:
            continue
        if _FUNCTION_BEFORE.search(before) or _FUNCTION_AFTER.match(after):
            roles[i] = OPERAND
        elif (_NEGATION.search(before) or _NEGATED_AFTER.match(after) or _BOUND_BEFORE.search(before)
              or _BOUND_AFTER.match(after)):
            roles[i] = BARRED
    for i, j in zip(values, values[1:]):  # ranges: "42 to 45", "between 42 and 45"
        gap = folded[mentions[i].span[1]:mentions[j].span[0]]
        if _RANGE_GAP.fullmatch(gap) and ("and" not in gap or roles[i] == BARRED):
            roles[i] = roles[j] = BARRED
    return roles


def _disjunctions(folded: str, mentions: list[NumberMention], roles: list[str], matched: list[bool]) -> list[bool]:
    """Per mention: is it in a list of candidates that offers a choice ("42 or 43", "42 或 43")
    with at least one value matching no GT?"""
    barred = [False] * len(mentions)
    listed = [i for i, role in enumerate(roles) if role == CANDIDATE]
    run: list[int] = []
    for i in [*listed, None]:
        if i is not None and run and _LIST_GAP.fullmatch(folded[mentions[run[-1]].span[1]:mentions[i].span[0]]):
            run.append(i)
            continue
        if len(run) > 1 and any(not matched[j] for j in run) \
                and _DISJUNCTION.search(folded[mentions[run[0]].span[1]:mentions[run[-1]].span[0]]):
            for j in run:
                barred[j] = True
        run = [i] if i is not None else []
    return barred


def gt_hits(text: str, gts: list[GroundTruth], max_numbers: int = DEFAULT_MAX_NUMBERS
            ) -> tuple[list[bool], list[NumberMention], bool]:
    """(hit per GT, the mentions read, too many numbers) for ``text`` by every rule above."""
    normalized = _blank_json(normalize_number_text(text or ""))
    mentions = find_numbers(normalized, limit=max_numbers + 1, normalized=True)
    if len(mentions) > max_numbers:
        return [False] * len(gts), mentions, True
    folded = normalized.casefold()
    roles = _roles(folded, mentions)
    matches = [[g.number is not None and numbers_match(m, g.number) for g in gts] for m in mentions]
    extras = {m.value for m, role, row in zip(mentions, roles, matches) if role in (CANDIDATE, BARRED) and not any(row)}
    hedging = len(extras) > MAX_EXTRA_CANDIDATES
    disjunction = _disjunctions(folded, mentions, roles, [any(row) for row in matches])
    hits = []
    for j, g in enumerate(gts):
        if g.number is None:
            hits.append(bool(g.text) and _text_hit(g.text, text or ""))
            continue
        matching = [i for i, row in enumerate(matches) if row[j] and roles[i] in (CANDIDATE, BARRED)]
        credited = any(roles[i] == CANDIDATE for i in matching)
        barred = any(roles[i] == BARRED or disjunction[i] for i in matching)
        hits.append(credited and not barred and not hedging)
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
