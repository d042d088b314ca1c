"""What each number in an answer is: the reading rules of the ground-truth verifier.

`number_roles(folded, mentions)` gives every mention (`minimind_trl.rewards.numbers.find_numbers`
of the normalised, case-folded answer) one role:

* `ENUMERATOR`, a label, ignored: ``(1) …`` and ``1) …`` anywhere, a numbered line ``1. …``, a
  table row's first cell ``| 1 | …`` (each in sequence: its number is 1 or one more than the last
  label of its kind, so ``42. Or 41.`` starts no list), ``Step 2: …``, ``第1题``; enumerator
  glyphs (``①``) read as ``(1)``;
* `OPERAND`, ignored: in an **equation chain** (numbers joined by operators — symbols, "plus",
  "times", "by", "divided by", 加/减/乘以/除以/的 — and by ``=`` / ``≈`` / "is" / "equals" /
  "becomes" / "gives" / 等于 / 得 / 是 / 为 / 变成, with up to three unit words before it: "km",
  "km2", "m^(2)", "°C", "公里") only the last one-number segment that states a value is stated,
  every other number is an operand
  (``12乘以3是36`` states 36, ``5 km2 = 500 ha`` states 500); a percentage "of" a base (``20% of
  50 is 10``, ``50的20%是10``) is one expression when ``=`` follows it, else the base alone is an
  operand (``55 is 68.75% of 80`` states 68.75%); the argument of a function
  (``sqrt(1764)``, ``log(100)``, ``5!``, "10 squared"); an **unevaluated** power, root or quotient
  (``12^4``, ``12²``, ``√1764``, ``84/2``: `NumberMention.stated` is False) outside a chain;
* `EXPRESSION`: the numbers of a bare expression without ``=`` (``40 + 2``, ``6 × 7``, ``42-45``):
  they state nothing and offer no value, and one matching a GT takes its credit away (joined by
  a glued sign only, ``5423 -463``, they may be a list of two values: `BARRED`);
* `BARRED`: a number after a negation ("not", "never", "rather than", "wrong:", ``≠``, 不是,
  错误, with at most three filler words between) or before one ("42 is wrong", ``42 (wrong)``,
  ``42 ✗``, 42不对); a number struck through (``~~42~~``, ``<s>42</s>``, ``<del>``, ``\\sout{}``,
  ``\\cancel{}``); a bound ("at least", "up to", ``>``, ``≥``, ``±``, 至少, "42 or more", ``42 ≤ x``, ``42±1``); a range
  ("42 to 45", "between 42 and 45", ``42~45``, ``42...45``);
* `CANDIDATE`: every other number.

Then `alternatives` bars the values offered as alternatives when one of them matches no GT:
two consecutive values joined by a disjunction or correction word in any of the languages the
pattern knows ("or", "alternatively", "or else", "vs", "maybe", "actually", "I mean", 或, 还是,
"oder", "ou", "или" ...) or by a bar ``|`` (outside a table row), whatever punctuation surrounds
it (``42 (or 41)``, ``42. Or 41.``, ``42(或41)``), and the two ends of an interval ``[42, 45]``
(brackets or parentheses, lower end first). `boxed` tells which mentions stand inside a
``\\boxed{}``. Every pattern here does work linear in its input (possessive quantifiers, bounded
windows, gap checks in two steps).
"""

from __future__ import annotations

import re
from bisect import bisect_right

from minimind_trl.rewards.numbers import BOX_CLOSE, BOX_OPEN, NumberMention

CANDIDATE, OPERAND, ENUMERATOR, BARRED, EXPRESSION = "candidate", "operand", "enumerator", "barred", "expression"
"""What a number in the answer is (module docstring): only candidates earn credit; a barred number
or a number of a bare expression matching a GT takes that GT's credit away; operands and
enumerators are ignored."""
VALUE_ROLES = (CANDIDATE, BARRED)
"""The roles of numbers an answer offers as values (what hedging and alternatives count)."""
TAKES_CREDIT = (BARRED, EXPRESSION)
"""The roles of numbers that take a GT's credit away when they match it."""

_WINDOW = 48
"""Characters read before a number for a negation, bound or function (after it: 40)."""

_NEGATION = re.compile(
    r"(?:\bnot|n't|\bnever|\bcannot|\brather than|\binstead of|\bwrong(?: answer)?|\bincorrect(?: answer)?"
    r"|≠|!=|不是|不等于|并非|而非|不为|错误答案|错误|(?<!不)错)"
    r"[\s:,]*+(?:(?:be|been|is|equal|equals|exactly|quite|just|to|even|really|actually|at all)[\s:,]++){0,3}+\Z")
_NEGATED_AFTER = re.compile(
    r"\A[\s,()\[\]:—-]*+(?:is|was|would be|seems|looks)?[\s,]*+(?:wrong|incorrect|false|invalid|a mistake|an error"
    r"|not (?:right|correct|the answer|it|true|valid)|isn't (?:right|correct|the answer|it)"
    r"|是?(?:错的|错误|不对|不正确|错)|✗|✘|❌)")
_STRUCK = re.compile(r"~~[^~\n]{1,200}~~|<(s|del|strike)>[^<]{0,200}</\1>"
                     r"|\\(?:sout|st|cancel|bcancel|xcancel)\{[^{}]{0,200}\}")
_BOUND_BEFORE = re.compile(
    r"(?:\bat least|\bat most|\bno (?:more|less|fewer) than|\bnot (?:more|less|fewer) than|\bmore than"
    r"|\bless than|\bfewer than|\bgreater than|\blarger than|\bsmaller than|\bhigher than|\blower than"
    r"|\bover|\bunder|\babove|\bbelow|\bup to|\bexceeds?|\bexceeding|\bbetween|\bfrom|>=|<=|≥|≤|(?<![\w/\"'])>|<|±"
    r"|\bplus or minus|至少|至多|最多|最少|不少于|不超过|超过|大于|小于|不到|介于|正负)\s*+\Z")
_BOUND_AFTER = re.compile(
    r"\A\s*+(?:\+(?!\s*[\d(])|or (?:more|less|fewer|higher|lower|above|below|greater|so|over|under)\b"
    r"|and (?:up|above|over|more|higher)\b|以上|以下|以内|之间|多(?!少)|≤|≥|<=|>=|<(?![-/a-z])|>|±|plus or minus\b)")
_RANGE_GAP = re.compile(r"\s*+(?:to|through|until|~|至|到|and|\.{2,})\s*+")
_FUNCTION_BEFORE = re.compile(
    r"(?:\bsqrt|\bcbrt|\blog\d*|\bln|\blg|\bexp|\bsin|\bcos|\btan|\babs|\bfactorial|\bfact"
    r"|\broot of|\bsquare root of|\bcube root of|\blog of|根号|开方)\s*+\(?\s*+\Z")
_FUNCTION_AFTER = re.compile(r"\A\s*+(?:!(?!=)|squared\b|cubed\b|的平方根|的阶乘|的平方|的立方)")
_ENUM_SEQUENCED = {  # (before, after) patterns of labels that count only in sequence
    "wrapped": (re.compile(r"\(\s*+\Z"), re.compile(r"\A\s*+\)[ \t]*+\S")),
    "closed": (re.compile(r"(?:\A|\s)\Z"), re.compile(r"\A\)[ \t]++\S")),
    "line": (re.compile(r"(?:\A|\n)[ \t]*+(?:[-*•][ \t]*+)?\Z"), re.compile(r"\A[.)、:][ \t]++\S")),
    "cell": (re.compile(r"(?:\A|\n)[ \t]*+\|[ \t]*+\Z"), re.compile(r"\A[ \t]*+\|")),  # a table row's first cell
}
_ENUM_WORD = (re.compile(r"(?:\bstep|\bquestion|\bpart|\bproblem|\bcase|\bitem|\bno\.|#|第)[ \t]*+\Z"),
              re.compile(r"\A\s*+(?:[:.)、]|题|步|问)"))
_OPERATOR_GAP = re.compile(
    r"[\s()\[\]!]*+(?:\*\*|[-+*/×÷^]|x|mod|plus|times|multiplied by|divided by|to the power of"
    r"|raised to(?: the power(?: of)?)?|increased by|decreased by|reduced by|by"
    r"|加上|加|减去|减|乘以|乘|除以|除|的|增加|减少|提高|降低)[\s()\[\]]*+")
_PERCENT_OF_GAP = re.compile(r"\s*+(?:of|的)\s*+")
_EQUALS_SIGN = re.compile(
    r"(?:==|=|≈|\b(?:equals?|is|becomes|gives|yields|makes|results in|comes to)\b|等于|得到|得|是|为|变成|变为)"
    r"[\s()\[\]:$€£¥]*+\Z")
_UNIT_WORDS = re.compile(r"[\s()\[\]!%°$€£¥]*+(?:[^\W\d_]++(?:\^\(\d\)|\d)?+[\s/.°]*+){0,3}+")
_ALTERNATIVE = re.compile(
    r"\b(?:or|either|alternatively|alternative|else|otherwise|maybe|perhaps|possibly|probably|vs|versus"
    r"|oder|ou|или|actually|i mean|correction|sorry)\b|(?<=\s)o(?=\s)|或|还是|也许|可能|要么|または|또는")
_BAR_GAP = re.compile(r"\s*+\|\s*+")
_INTERVAL = (re.compile(r"[\[(]\s*+\Z"), re.compile(r"\s*+[,;]\s*+"), re.compile(r"\s*+[\])]"))  # used with pos
_SIGNED = re.compile(r"[-+]|minus|negative|负", re.IGNORECASE)
_BOX_EDGE = re.compile(f"[{BOX_OPEN}{BOX_CLOSE}]")


def negated(folded: str, start: int) -> bool:
    """Does a negation stand right before ``start`` (module docstring)?"""
    return _NEGATION.search(folded, max(0, start - _WINDOW), start) is not None


def _gap(folded: str, mentions: list[NumberMention], i: int, j: int) -> str:
    return folded[mentions[i].span[1]:mentions[j].span[0]]


def _label_kind(folded: str, m: NumberMention) -> str | None:
    """The kind of label ``m`` would be (`_ENUM_SEQUENCED` key, "word"), or None."""
    if not (m.exact and m.decimals == 0 and not m.percent and 0 < m.value < 100 and m.text.isdigit()):
        return None
    start, end = m.span
    before, after = folded[max(0, start - 24):start], folded[end:end + 8]
    if _ENUM_WORD[0].search(before) and _ENUM_WORD[1].match(after):
        return "word"
    return next((kind for kind, (b, a) in _ENUM_SEQUENCED.items() if b.search(before) and a.match(after)), None)


def _enumerators(folded: str, mentions: list[NumberMention]) -> list[bool]:
    """Per mention: a label? Word labels always; the others only in sequence (module docstring)."""
    last: dict[str, int] = {}
    labels = []
    for m in mentions:
        kind = _label_kind(folded, m)
        number = int(m.value) if kind else 0
        is_label = kind == "word" or (kind is not None and (number == 1 or last.get(kind) == number - 1))
        if is_label:
            last[kind] = number
        labels.append(is_label)
    return labels


def _joined_by_operator(gap: str, right: NumberMention) -> str | None:
    """How two numbers are one expression: "operator" (an operator between them) or "sign" (a sign
    glued to the second on the same line: ``5 -3``, ``10 minus 3``, which may also be a list of
    two values); None when they are not."""
    if _OPERATOR_GAP.fullmatch(gap):
        return "operator"
    if not gap.strip() and "\n" not in gap and _SIGNED.match(right.text) is not None:
        return "sign"
    return None


def _percent_base(gap: str, left: NumberMention, right: NumberMention) -> int | None:
    """For a percentage of a base, ``20% of 50`` / ``50的20%``: which of the two (0: left, 1:
    right) is the base; None for any other pair."""
    if left.percent and not right.percent and _PERCENT_OF_GAP.fullmatch(gap):
        return 1
    if right.percent and not left.percent and _PERCENT_OF_GAP.fullmatch(gap) and "的" in gap:
        return 0
    return None


def _equals_gap(gap: str) -> bool:
    """A chain's ``=`` between two numbers: up to three unit words ("km", "km2", "m^(2)", "°C",
    "公里") then ``=``, ``==``, ``≈``, "is", "equals", "becomes", "gives", 等于, 得, 是, 为 ... (two
    steps: linear)."""
    sign = _EQUALS_SIGN.search(gap)
    return sign is not None and _UNIT_WORDS.fullmatch(gap, 0, sign.start()) is not None


def _settle_chain(chain: list[list[int]], signed: bool, mentions: list[NumberMention], roles: list[str]) -> None:
    """An equation states only its last one-number segment that states a value; a bare expression
    (``40 + 2``, ``6 × 7``) states nothing (its numbers: `EXPRESSION`), unless a sign glued to a
    number joined it (``5423 -463`` may be a list of two values: `BARRED`)."""
    if len(chain) > 1:
        singles = [segment[0] for segment in chain if len(segment) == 1 and mentions[segment[0]].stated]
        for segment in chain:
            for j in segment:
                roles[j] = CANDIDATE if singles and j == singles[-1] else OPERAND
    elif len(chain[0]) > 1:
        for j in chain[0]:
            roles[j] = BARRED if signed else EXPRESSION


def _chain_roles(folded: str, mentions: list[NumberMention], values: list[int], roles: list[str]) -> None:
    """Equation chains (module docstring). A percentage of a base is one expression when ``=``
    follows it (``20% of 50 is 10``); otherwise the percentage is a value and its base an operand
    (``55 is 68.75% of 80``, ``55是80的68.75%``)."""
    chain: list[list[int]] = [[]]  # the segments of the current chain
    signed, bases = False, []
    for k, i in enumerate(values):
        chain[-1].append(i)
        if k + 1 < len(values):
            j = values[k + 1]
            gap = _gap(folded, mentions, i, j)
            base = _percent_base(gap, mentions[i], mentions[j])
            if base is not None:
                then = _gap(folded, mentions, j, values[k + 2]) if k + 2 < len(values) else ""
                if _equals_gap(then):
                    continue
                bases.append((i, j)[base])
            elif joined := _joined_by_operator(gap, mentions[j]):
                signed = signed or joined == "sign"
                continue
            elif _equals_gap(gap):
                chain.append([])
                continue
        _settle_chain(chain, signed, mentions, roles)
        chain, signed = [[]], False
    for i in bases:
        roles[i] = OPERAND


def _struck(folded: str, mentions: list[NumberMention]) -> list[bool]:
    """Per mention: inside a strikethrough (``~~…~~``, ``<s>``, ``<del>``, ``\\sout{}`` ...)?"""
    spans = [match.span() for match in _STRUCK.finditer(folded)]
    return [any(a <= m.span[0] and m.span[1] <= b for a, b in spans) for m in mentions]


def _context_role(folded: str, m: NumberMention, role: str) -> str:
    """Functions' arguments and unevaluated expressions are operands; negated and bounded numbers barred."""
    start, end = m.span
    before, after = folded[max(0, start - _WINDOW):start], folded[end:end + 40]
    if _FUNCTION_BEFORE.search(before) or _FUNCTION_AFTER.match(after):
        return OPERAND
    if role == CANDIDATE and not m.stated:
        return OPERAND
    if (_NEGATION.search(before) or _NEGATED_AFTER.match(after) or _BOUND_BEFORE.search(before)
            or _BOUND_AFTER.match(after)):
        return BARRED
    return role


def number_roles(folded: str, mentions: list[NumberMention]) -> list[str]:
    """Per mention: `CANDIDATE`, `OPERAND`, `ENUMERATOR`, `EXPRESSION` or `BARRED` (module docstring)."""
    roles = [ENUMERATOR if label else CANDIDATE for label in _enumerators(folded, mentions)]
    values = [i for i, role in enumerate(roles) if role != ENUMERATOR]
    _chain_roles(folded, mentions, values, roles)
    struck = _struck(folded, mentions) if "~~" in folded or "<" in folded or "\\" in folded else [False] * len(mentions)
    for i in values:
        roles[i] = BARRED if struck[i] else _context_role(folded, mentions[i], roles[i])
    for i, j in zip(values, values[1:]):  # ranges: "42 to 45", "between 42 and 45", "42...45"
        gap = _gap(folded, mentions, i, j)
        if _RANGE_GAP.fullmatch(gap) and ("and" not in gap or roles[i] == BARRED):
            roles[i] = roles[j] = BARRED
    return roles


def _in_table_row(folded: str, position: int) -> bool:
    return folded[folded.rfind("\n", 0, position) + 1:position].lstrip().startswith("|")


def _offered_together(folded: str, mentions: list[NumberMention], i: int, j: int) -> bool:
    """Are mentions ``i`` < ``j`` (consecutive values) offered as alternatives (module docstring)?"""
    gap = _gap(folded, mentions, i, j)
    if _ALTERNATIVE.search(gap):
        return True
    if _BAR_GAP.fullmatch(gap):
        return not _in_table_row(folded, mentions[i].span[0])
    before, sep, after = _INTERVAL
    return (sep.fullmatch(gap) is not None and before.search(folded, max(0, mentions[i].span[0] - 8),
                                                                mentions[i].span[0]) is not None
            and after.match(folded, mentions[j].span[1]) is not None and mentions[i].value < mentions[j].value)


def alternatives(folded: str, mentions: list[NumberMention], roles: list[str], matched: list[bool]) -> list[bool]:
    """Per mention: is it in a run of values offered as alternatives (`_offered_together`) with at
    least one value matching no GT? (Then every value of the run is barred.)"""
    barred = [False] * len(mentions)
    values = [i for i, role in enumerate(roles) if role in VALUE_ROLES]
    run: list[int] = []
    for i in [*values, None]:
        if i is not None and run and _offered_together(folded, mentions, run[-1], i):
            run.append(i)
            continue
        if len(run) > 1 and not all(matched[j] for j in run):
            for j in run:
                barred[j] = True
        run = [i] if i is not None else []
    return barred


def boxed(normalized: str, mentions: list[NumberMention]) -> list[bool]:
    """Per mention: does it stand inside a ``\\boxed{}`` (between `BOX_OPEN` and `BOX_CLOSE`)?"""
    if BOX_OPEN not in normalized:
        return [False] * len(mentions)
    edges = [edge.start() for edge in _BOX_EDGE.finditer(normalized)]
    depth_after, depth = [], 0
    for k in edges:
        depth = depth + 1 if normalized[k] == BOX_OPEN else max(0, depth - 1)
        depth_after.append(depth)
    return [bool(depth_after[n - 1]) if (n := bisect_right(edges, m.span[0])) else False for m in mentions]
