"""Reading numbers out of free text, for the ground-truth verifier.

`find_numbers(text)` returns `NumberMention`s, `extract_numbers(text)` just their values.
The text is first normalised: enumerator glyphs (``①``, ``⒈``, ``❶`` ...) become `` (1) ``, superscript
exponents become ``^`` (``10³`` → ``10^(3)``), a full-width comma ``，`` becomes ``, `` (a list
separator, never a decimal sign), then NFKC folds full-width digits and punctuation (``１０００`` →
``1000``; other scripts' digits such as ``٤٢`` are read as digits too), every dash-like sign
(``− – ‒ ‐ ‑ — ― ﹣ －``) becomes ``-``, the Arabic decimal and thousands signs ``٫`` / ``٬`` become
``.`` / ``,``, ``∛`` / ``∜`` become ``√[3]`` / ``√[4]``, an ellipsis between two numbers is spaced
out (``42...45`` → ``42 ... 45``, a range), LaTeX is rewritten (below), and times (``2:42``,
``14:05:09``) and dates (``2025-03-07``, ``07/03/2025``, ``2025年3月7日``, ``3月7日``) are blanked:
they are not quantities.
Then, left to right:

* integers and decimals: ``2932``, ``-3.5``, ``.25``; a sign counts only when it is not glued
  to a preceding digit or letter (``3-2`` reads 3 and 2); the words "minus" and "negative" (any
  case) and 负 before a number are its sign (``minus 7`` = -7);
* thousands separators, one kind per number, in groups of exactly three after a first group that
  does not start with 0: ``1,000``, ``1,000,000``, ``1 000 000`` (a space, thin space or no-break
  space), ``1'000`` / ``1’000``, LaTeX ``1{,}000`` / ``1\\,000``, dots with two or more groups
  (``1.234.567``); Indian grouping ``10,00,000``; a decimal comma: ``1.234,5`` = 1234.5, ``0,186``
  = 0.186 (no locale groups thousands after a lone 0), and a comma followed by other than three
  digits, not inside a comma list, is a decimal sign (``42,5`` = 42.5, ``1,0000`` = 1.0000;
  ``1,2,3`` is the list 1, 2, 3);
* scientific notation: ``1e3``, ``2.5E-4``, ``1.5×10^3``, ``1.5 x 10^3``, ``1.5*10**3``,
  ``1.5×10³``; a power ``a^b`` with an integer |b| ≤ 100 reads as its value (``10³`` =
  ``10^3`` = 1000, ``2^10`` = 1024, ``1.5^2`` = 2.25; beyond that, or for ``0^-1``, the base
  alone is read);
* fractions ``a/b`` with an integer ``b`` (no spaces; not part of a date-like ``a/b/c`` or a
  decimal denominator ``a/b.c``; a sentence-final period is fine: ``3/4.`` is 0.75), valued
  a ÷ b; ``a/0`` is not read at all;
* roots: ``√x``, ``√[n]x``, ``√(x)`` (2 ≤ n ≤ 10, x ≥ 0, optionally with a number before it as
  coefficient: ``2√2``), valued exactly for perfect powers, else to 20 significant digits;
* LaTeX: ``\\boxed{…}`` / ``\\fbox{…}`` read their content (the box edges are kept as the markers
  `BOX_OPEN` / `BOX_CLOSE`, whitespace to every pattern); ``\\frac{a}{b}``, ``\\dfrac``,
  ``\\tfrac`` read as the fraction a/b when a is a number and b an integer; ``\\sqrt{x}``,
  ``\\sqrt[n]{x}`` read as the root ``√[n](x)`` when x is a number; a ``\\frac`` / ``\\sqrt`` with
  any other content reads as no number at all (its digits are never read one by one). ``\\%`` is
  ``%``, ``\\times`` / ``\\cdot`` are ``×``, ``^{n}`` is ``^(n)``;
* scale words, any case: ``1.5 million`` = 1.5e6, ``3 thousand``, ``2 billion``, ``1 trillion``,
  ``5 MILLION`` (plural too), and a lowercase ``k`` glued to the number (``1.5k`` = 1500; ``5km``
  is 5, a unit). An uppercase ``K`` is kelvin, a unit: ``369.15K`` is 369.15;
* percentages ``25%``, ``25 percent``, ``25 per cent``, ``百分之25``: the mention's value is 25 and
  it is flagged ``percent`` (what it states depends on the task; see `minimind_trl.rewards.verifier`);
* Chinese multipliers directly after a number: ``2.5万`` = 25000, ``3亿`` = 3e8,
  ``1万亿`` = 1e12. ``千`` is *not* a multiplier (it starts units: 千米, 千克).
  Chinese numerals (五, 三十) are not read.

Each mention has a ``form`` (`NumberMention.stated`): a plain or scaled number, scientific notation
and a fraction in lowest terms that is not an integer (``3/4``) state a value; a power (``12^4``,
``12²``), a root and any other quotient (``84/2``, ``6/8``, ``1.5/2``, ``0/5``) are unevaluated
expressions, read for their value but stating none (the verifier credits no such mention).

A number glued to a preceding ASCII letter, digit, ``_``, ``.``, ``/`` or ``^`` is skipped
(``x2``, ``v1.5``, the 2 of ``m²``); units may follow directly (``5km``, ``20.5kg``).
Every pattern does work linear in the text's length (possessive quantifiers, one-pass brace
matching for boxes).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal, localcontext

from minimind_trl.envs.safe_math import superscripts_to_power

VALUE, FRACTION, POWER, ROOT, QUOTIENT = "value", "fraction", "power", "root", "quotient"
STATED_FORMS = (VALUE, FRACTION)
"""The forms that state a value (module docstring)."""
BOX_OPEN, BOX_CLOSE = "\u2028", "\u2029"
"""Where a ``\\boxed{`` opened and closed, in normalised text (both are whitespace to every pattern;
the same characters in the input are read as line breaks, so only a box makes them)."""

_CORE = r"""(?:
    [1-9]\d{0,2}(?:\.\d{3})+,\d+(?!\d)              # 1.234,5: dot thousands, decimal comma
  | [1-9]\d{0,2}(?:,\d{3})+\.\d+                    # 1,234.5
  | [1-9]\d?(?:,\d{2})+,\d{3}(?![\d])(?!,\d)        # Indian grouping 10,00,000
  | [1-9]\d{0,2}(?:,\d{3})+(?!\d)(?!,\d)            # 1,000,000
  | [1-9]\d{0,2}(?:\.\d{3}){2,}(?![\d.])            # 1.234.567
  | (?<!\d,)(?:0,\d+|\d+,(?:\d{1,2}|\d{4,}))(?![\d,])  # 42,5 and 0,186: a decimal comma (not in 1,2,3)
  | \d+(?:\.\d+)?
  | \.\d+
)"""
_THOUSANDS_CORE = re.compile(r"[1-9]\d{0,2}(?:,\d{3})+|[1-9]\d?(?:,\d{2})+,\d{3}")
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12, "k": 3}
_NUMBER = re.compile(
    rf"""(?<![A-Za-z0-9_./^])(?<!\^\()
    (?P<pctpre>百分之)?
    (?P<sign>[-+]|(?i:minus|negative)[ ]++|(?<!正)负)?
    (?:
        (?P<coef>\d+(?:\.\d+)?)?√(?:\[(?P<index>\d{{1,2}})\])?[ ]?\(?(?P<radicand>\d+(?:\.\d+)?)\)?
      | (?P<core>{_CORE})
        (?:
            /(?P<den>\d+)(?![\d/]|\.\d)
          | (?P<exp>[eE][-+]?\d+)
          | \s*+[×xX*]\s*+10\s*+(?:\^|\*\*)\s*+\(?(?P<pow>[-+]?\d+)\)?
          | \^\(?(?P<caret>[-+]?\d{{1,3}})\)?(?![\d.])
        )?
        (?:[ ]?(?P<scale>(?i:thousand|million|billion|trillion))(?i:s)?(?![A-Za-z])|(?P<k>k)(?![A-Za-z0-9]))?
        (?P<cjk>万亿|亿|万)?
    )
    (?P<pct>\s*+%|[ ]?(?i:percent|per[ ]cent|pct)(?![A-Za-z]))?""",
    re.VERBOSE,
)
_CJK = {"万": 4, "亿": 8, "万亿": 12}
MAX_POWER = 100
MAX_MENTIONS = 1_000
"""`find_numbers` reads at most this many numbers by default (the verifier reads 25)."""


@dataclass(frozen=True)
class NumberMention:
    """A number found in text.

    ``value`` is exact (a `Decimal`) unless the mention is a fraction or an irrational root (then
    ``exact`` is False and the value is the quotient to 28 digits, the root to 20). ``decimals`` is
    the number of decimal places the mention was written with (``3.14`` → 2, ``1.5e-3`` → 4,
    ``1000`` → 0), None for a fraction or an irrational root (unlimited precision). ``span`` is
    where it stands in `normalize_number_text` of the text it was found in. ``form`` is one of
    `VALUE`, `FRACTION`, `POWER`, `ROOT`, `QUOTIENT` (module docstring).
    """

    text: str
    value: Decimal
    decimals: int | None
    percent: bool = False
    exact: bool = True
    span: tuple[int, int] = field(default=(-1, -1), compare=False)
    form: str = VALUE

    @property
    def stated(self) -> bool:
        """Does the mention state a value (not an unevaluated power, root or quotient)?"""
        return self.form in STATED_FORMS


_GLYPHS = {0x2028: "\n", 0x2029: "\n"}
for _first, _count, _label in ((0x2460, 20, 1), (0x2474, 20, 1), (0x2488, 20, 1), (0x24F5, 10, 1), (0x24EB, 10, 11),
                               (0x2776, 10, 1), (0x2780, 10, 1), (0x278A, 10, 1)):
    _GLYPHS.update({_first + k: f" ({_label + k}) " for k in range(_count)})
_LATEX_SIMPLE = ((re.compile(r"\\%"), "%"), (re.compile(r"\\(?:times|cdot)(?![A-Za-z])"), "×"),
                 (re.compile(r"\^\{\s*([-+]?\d+)\s*\}"), r"^(\1)"))
_BOX_TOKEN = re.compile(r"\\(?:boxed|fbox)\s*+\{|[{}]")
_ARG = r"\{((?:[^{}]|\{[^{}]*\})*)\}"  # one brace group, one level of nesting inside
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*+" + _ARG + r"\s*+" + _ARG)
_LATEX_SQRT = re.compile(r"\\sqrt\s*+(?:\[\s*(?P<n>\d+)\s*\])?\s*+" + _ARG)
_PLAIN = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)")
_ELLIPSIS = re.compile(r"(?<=\d)\.{2,}+(?=\s*+[-+]?\d)")
MAX_ROOT = 10


def _unbox(text: str) -> str:
    """``\\boxed{X}`` / ``\\fbox{X}`` → ``BOX_OPEN X BOX_CLOSE`` (an unclosed box: its opener alone),
    in one pass over the braces: each closing brace closes the innermost brace still open."""
    if "box" not in text:
        return text
    parts, open_boxes, position = [], [], 0
    for token in _BOX_TOKEN.finditer(text):
        if token.group() == "{":
            open_boxes.append(False)
        elif token.group() == "}":
            if open_boxes and open_boxes.pop():
                parts.append(text[position:token.start()] + BOX_CLOSE)
                position = token.end()
        else:
            parts.append(text[position:token.start()] + BOX_OPEN)
            position = token.end()
            open_boxes.append(True)
    return "".join(parts) + text[position:]


def _frac(match: re.Match) -> str | None:
    a, b = match.group(1).strip(), match.group(2).strip()
    return f"{a}/{b}" if _PLAIN.fullmatch(a) and b.isdigit() else None


def _sqrt(match: re.Match) -> str:
    """``\\sqrt[n]{x}`` → ``√[n](x)`` for a number x (a number written before it stays its
    coefficient), else a blank."""
    x = match.group(2).strip()
    if not (_PLAIN.fullmatch(x) and not x.startswith("-")):
        return " "
    return f"√[{match.group('n')}]({x}) " if match.group("n") else f"√({x}) "


def _root_value(radicand: Decimal, n: int, coefficient: Decimal) -> tuple[Decimal, bool]:
    """(coefficient · radicand^(1/n), exact?): exact for perfect powers, else to 20 significant digits."""
    with localcontext() as ctx:
        ctx.prec = 40
        root = radicand.sqrt() if n == 2 else (radicand.ln() / n).exp() if radicand else Decimal(0)
        nearest = root.to_integral_value()
        exact = nearest**n == radicand
        value = (nearest if exact else root) * coefficient
        if not exact and value:
            value = value.quantize(Decimal(1).scaleb(value.adjusted() - 19))
    return (value.normalize() if exact else value), exact


def _rewrite(pattern: re.Pattern, convert, text: str) -> str:
    """Replace each match by ``convert(match)`` (None: a blank), kept apart from its neighbours."""
    def replace(match: re.Match) -> str:
        value = convert(match)
        if value is None:
            return " "
        glued = match.start() and (text[match.start() - 1].isalnum() or text[match.start() - 1] in "./^_")
        return (" " if glued else "") + value + " "

    return pattern.sub(replace, text)


_SIGNS = str.maketrans({**dict.fromkeys("−–‒‐‑—―﹣➖", "-"), "٫": ".", "٬": ",",  # + Arabic decimal/thousands
                        "∛": "√[3]", "∜": "√[4]"})
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\[,;: !])(?=\d{3}(?!\d))")
_GROUPED = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:(?P<sep>[ '’])\d{3})(?:(?P=sep)\d{3})*+(?![\d])(?!,\d)")
_NOT_QUANTITY = re.compile(
    r"(?<![\d.])(?:\d{1,2}:\d{2}(?::\d{2})?(?![\d])"                   # 2:42, 14:05:09
    r"|\d{4}([-/.])\d{1,2}\1\d{1,2}(?![\d])|\d{1,2}([-/.])\d{1,2}\2\d{2,4}(?![\d])"  # dates
    r"|\d{1,4}年\d{1,2}月(?:\d{1,2}[日号])?|\d{1,2}月\d{1,2}[日号])"
)


def _blank(match: re.Match) -> str:
    return " " * len(match.group())


def normalize_number_text(text: str) -> str:
    """Enumerator glyphs → `` (k) ``, superscripts → ``^``, ``，`` → ``, ``, NFKC, dashes → ``-``, root
    signs, ellipses between numbers spaced, LaTeX boxes, fractions, roots and thousands separators
    rewritten, grouped thousands joined by commas, times and dates blanked (module docstring)."""
    text = superscripts_to_power(text.translate(_GLYPHS), power="^").replace("，", ", ")
    text = _ELLIPSIS.sub(" ... ", unicodedata.normalize("NFKC", text).translate(_SIGNS))
    if "\\" in text or "{," in text:
        text = _LATEX_THOUSANDS.sub(",", text)
        for pattern, replacement in _LATEX_SIMPLE:
            text = pattern.sub(replacement, text)
        text = _rewrite(_LATEX_FRAC, _frac, _LATEX_SQRT.sub(_sqrt, _unbox(text)))
    text = _GROUPED.sub(lambda m: m.group().replace(m.group("sep"), ","), text)
    return _NOT_QUANTITY.sub(_blank, text)


def _decimals(value: Decimal) -> int:
    return max(0, -value.as_tuple().exponent)


def _core_decimal(core: str) -> Decimal:
    """The value of a matched core: the last of ``.``/``,`` is the decimal sign when both occur;
    commas in groups of three (or Indian groups) are thousands, another comma is a decimal sign;
    two or more dots are thousands."""
    if "," in core and "." in core:
        thousands = "." if core.rfind(",") > core.rfind(".") else ","
        core = core.replace(thousands, "").replace(",", ".")
    elif "," in core:
        core = core.replace(",", "") if _THOUSANDS_CORE.fullmatch(core) else core.replace(",", ".")
    elif core.count(".") > 1:
        core = core.replace(".", "")
    return Decimal(core)


def _quotient_form(numerator: Decimal, denominator: Decimal) -> str:
    """`FRACTION` for an integer over an integer > 1 with no common factor (``3/4``), else `QUOTIENT`."""
    if _decimals(numerator) or denominator <= 1 or numerator != numerator.to_integral_value():
        return QUOTIENT
    return FRACTION if math.gcd(int(numerator), int(denominator)) == 1 else QUOTIENT


def _root_mention(match: re.Match, groups: dict, sign: int, percent: bool) -> NumberMention | None:
    n = int(groups["index"] or 2)
    if not 2 <= n <= MAX_ROOT:
        return None
    value, exact = _root_value(Decimal(groups["radicand"]), n, Decimal(groups["coef"] or 1))
    return NumberMention(match.group(), sign * value, _decimals(value) if exact else None, percent, exact=exact,
                         span=match.span(), form=ROOT)


def _scaled(groups: dict, core: Decimal) -> tuple[Decimal, str]:
    """(value, form) of a core with its exponent, power, scale word and Chinese multiplier."""
    form = VALUE
    if groups["exp"]:
        core = core.scaleb(int(groups["exp"][1:]))
    elif groups["pow"] is not None:
        core = core.scaleb(int(groups["pow"]))
    elif groups["caret"] is not None:
        form, power = POWER, int(groups["caret"])
        if abs(power) <= MAX_POWER and not (core == 0 and power < 0):
            core = core**power  # otherwise the base alone is read
    scale = groups["scale"] or groups["k"]
    if scale:
        core = core.scaleb(_SCALES[scale.lower()])
    if groups["cjk"]:
        core = core.scaleb(_CJK[groups["cjk"]])
    return core, form


def _mention(match: re.Match) -> NumberMention | None:
    groups = match.groupdict()
    sign = 1 if groups["sign"] in (None, "+") else -1
    percent = bool(groups["pct"] or groups["pctpre"])
    try:
        if groups["radicand"] is not None:
            return _root_mention(match, groups, sign, percent)
        core = _core_decimal(groups["core"])
        if groups["den"] is not None:
            denominator = Decimal(groups["den"])
            if denominator == 0:
                return None
            return NumberMention(match.group(), sign * core / denominator, None, percent, exact=False,
                                 span=match.span(), form=_quotient_form(core, denominator))
        core, form = _scaled(groups, core)
        value = sign * core
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation / Overflow included
        return None
    if not value.is_finite():
        return None
    return NumberMention(match.group(), value, _decimals(value), percent, span=match.span(), form=form)


def find_numbers(text: str, limit: int = MAX_MENTIONS, normalized: bool = False) -> list[NumberMention]:
    """The number mentions in ``text``, in order, the first ``limit`` of them (reading stops there:
    bounded work); ``normalized``: ``text`` already is `normalize_number_text`'s output (spans
    refer to that text either way)."""
    mentions = []
    for match in _NUMBER.finditer(text or "" if normalized else normalize_number_text(text or "")):
        mention = _mention(match)
        if mention is not None:
            mentions.append(mention)
            if len(mentions) >= limit:
                break
    return mentions


def extract_numbers(text: str) -> list[float]:
    """The values of `find_numbers` as floats (a percentage as written: ``25%`` → 25.0), at most
    `MAX_MENTIONS`."""
    return [float(m.value) for m in find_numbers(text)]


def parse_number(text: str) -> NumberMention | None:
    """The single number that makes up the whole of ``text`` (after stripping), else None."""
    text = normalize_number_text(str(text)).strip()
    match = _NUMBER.fullmatch(text)
    return _mention(match) if match else None
