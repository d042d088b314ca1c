"""Reading numbers out of free text, for the ground-truth verifier.

`find_numbers(text)` returns `NumberMention`s, `extract_numbers(text)` just their values.
The text is first normalised: superscript exponents become ``^`` (``10³`` → ``10^(3)``), a
full-width comma ``，`` becomes ``, `` (a list separator, never a decimal sign), then NFKC folds
full-width digits and punctuation (``１０００`` → ``1000``; other scripts' digits such as ``٤٢`` are
read as digits too), every dash-like sign (``− – ‒ ‐ ‑ — ― ﹣ －``) becomes ``-``, the Arabic
decimal and thousands signs ``٫`` / ``٬`` become ``.`` / ``,``, LaTeX is rewritten (below), and
times (``2:42``, ``14:05:09``) and dates (``2025-03-07``, ``07/03/2025``, ``2025年3月7日``,
``3月7日``) are blanked: they are not quantities.
Then, left to right:

* integers and decimals: ``2932``, ``-3.5``, ``.25``; a sign counts only when it is not glued
  to a preceding digit or letter (``3-2`` reads 3 and 2);
* thousands separators, one kind per number, in groups of exactly three: ``1,000``,
  ``1,000,000``, ``1 000 000`` (a space, thin space or no-break space), ``1'000`` /
  ``1’000``, LaTeX ``1{,}000`` / ``1\\,000``, dots with two or more groups (``1.234.567``);
  Indian grouping ``10,00,000``; a decimal comma: ``1.234,5`` = 1234.5, and a comma followed by
  other than three digits, not inside a comma list, is a decimal sign (``42,5`` = 42.5,
  ``1,0000`` = 1.0000; ``1,2,3`` is the list 1, 2, 3);
* scientific notation: ``1e3``, ``2.5E-4``, ``1.5×10^3``, ``1.5 x 10^3``, ``1.5*10**3``,
  ``1.5×10³``; a power ``a^b`` with an integer |b| ≤ 100 reads as its value (``10³`` =
  ``10^3`` = 1000, ``2^10`` = 1024, ``1.5^2`` = 2.25; beyond that, or for ``0^-1``, the base
  alone is read);
* fractions ``a/b`` with an integer ``b`` (no spaces; not part of a date-like ``a/b/c`` or a
  decimal denominator ``a/b.c``; a sentence-final period is fine: ``3/4.`` is 0.75), valued
  a ÷ b; ``a/0`` is not read at all;
* LaTeX: ``\\boxed{…}`` / ``\\fbox{…}`` read their content; ``\\frac{a}{b}``, ``\\dfrac``,
  ``\\tfrac`` read as the fraction a/b when a is a number and b an integer; ``\\sqrt{x}``,
  ``\\sqrt[n]{x}`` (n ≤ 10, x ≥ 0, optionally with a number before it as coefficient:
  ``2\\sqrt{2}``) read as the root (exact for perfect powers, else written to 20 significant
  digits, which the verifier's rounding rule meets with any shorter rounding); a ``\\frac`` /
  ``\\sqrt`` with any other content reads as no number at all (its digits are never read one
  by one). ``\\%`` is ``%``, ``\\times`` / ``\\cdot`` are ``×``,
  ``^{n}`` is ``^(n)``;
* scale words: ``1.5 million`` = 1.5e6, ``3 thousand``, ``2 billion``, ``1 trillion`` (plural
  too), and ``k`` / ``K`` glued to the number (``1.5k`` = 1500; ``5km`` is 5, a unit);
* percentages ``25%``, ``25 percent``, ``25 per cent``, ``百分之25``: the mention's value is 25 and
  it is flagged ``percent`` (it states the quantity 0.25; see `minimind_trl.rewards.verifier`);
* Chinese multipliers directly after a number: ``2.5万`` = 25000, ``3亿`` = 3e8,
  ``1万亿`` = 1e12. ``千`` is *not* a multiplier (it starts units: 千米, 千克).
  Chinese numerals (五, 三十) are not read.

A number glued to a preceding ASCII letter, digit, ``_``, ``.``, ``/`` or ``^`` is skipped
(``x2``, ``v1.5``, the 2 of ``m²``); units may follow directly (``5km``, ``20.5kg``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal, localcontext

from minimind_trl.envs.safe_math import superscripts_to_power

_CORE = r"""(?:
    \d{1,3}(?:\.\d{3})+,\d+(?!\d)                  # 1.234,5: dot thousands, decimal comma
  | \d{1,3}(?:,\d{3})+\.\d+                        # 1,234.5
  | \d{1,2}(?:,\d{2})+,\d{3}(?![\d])(?!,\d)        # Indian grouping 10,00,000
  | \d{1,3}(?:,\d{3})+(?!\d)(?!,\d)                # 1,000,000
  | \d{1,3}(?:\.\d{3}){2,}(?![\d.])                # 1.234.567
  | (?<!\d,)\d+,(?:\d{1,2}|\d{4,})(?![\d,])        # 42,5: a decimal comma (not inside 1,2,3)
  | \d+(?:\.\d+)?
  | \.\d+
)"""
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12, "k": 3}
_NUMBER = re.compile(
    rf"""(?<![A-Za-z0-9_./^])(?<!\^\()
    (?P<pctpre>百分之)?
    (?P<sign>[-+])?
    (?P<core>{_CORE})
    (?:
        /(?P<den>\d+)(?![\d/]|\.\d)
      | (?P<exp>[eE][-+]?\d+)
      | \s*[×xX*]\s*10\s*(?:\^|\*\*)\s*\(?(?P<pow>[-+]?\d+)\)?
      | \^\(?(?P<caret>[-+]?\d{{1,3}})\)?(?![\d.])
    )?
    (?:[ ]?(?P<scale>thousand|million|billion|trillion)s?(?![A-Za-z])|(?P<k>[kK])(?![A-Za-z0-9]))?
    (?P<cjk>万亿|亿|万)?
    (?P<pct>\s*%|[ ]?(?:percent|per[ ]cent|pct)(?![A-Za-z]))?""",
    re.VERBOSE,
)
_CJK = {"万": 4, "亿": 8, "万亿": 12}
MAX_POWER = 100


@dataclass(frozen=True)
class NumberMention:
    """A number found in text.

    ``value`` is exact (a `Decimal`) unless the mention is a fraction (then ``exact`` is False
    and the value is the quotient to 28 digits). ``decimals`` is the number of decimal places
    the mention was written with (``3.14`` → 2, ``1.5e-3`` → 4, ``1000`` → 0), None for a
    fraction (unlimited precision). ``span`` is where it stands in `normalize_number_text` of
    the text it was found in.
    """

    text: str
    value: Decimal
    decimals: int | None
    percent: bool = False
    exact: bool = True
    span: tuple[int, int] = field(default=(-1, -1), compare=False)


_LATEX_SIMPLE = ((re.compile(r"\\%"), "%"), (re.compile(r"\\(?:times|cdot)(?![A-Za-z])"), "×"),
                 (re.compile(r"\^\{\s*([-+]?\d+)\s*\}"), r"^(\1)"))
_LATEX_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ARG = r"\{((?:[^{}]|\{[^{}]*\})*)\}"  # one brace group, one level of nesting inside
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*" + _ARG + r"\s*" + _ARG)
_LATEX_SQRT = re.compile(r"(?<![\d.])(?P<coef>\d+(?:\.\d+)?)?\s*\\sqrt\s*(?:\[\s*(?P<n>\d+)\s*\])?\s*" + _ARG)
_PLAIN = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)")
MAX_ROOT = 10
MAX_BOXES = 64
"""At most this many ``\\boxed{}`` wrappers are opened (more stay as they are)."""


def _unbox(text: str) -> str:
    """``\\boxed{X}`` → `` X `` (the matching brace found by counting), for the first `MAX_BOXES`."""
    for _ in range(MAX_BOXES):
        if (match := _LATEX_BOX.search(text)) is None:
            break
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        inner = text[match.end():end - 1] if depth == 0 else text[match.end():]
        text = f"{text[:match.start()]} {inner} {text[end:]}"
    return text


def _frac(match: re.Match) -> str | None:
    a, b = match.group(1).strip(), match.group(2).strip()
    return f"{a}/{b}" if _PLAIN.fullmatch(a) and b.isdigit() else None


def _sqrt(match: re.Match) -> str | None:
    x, n = match.group(3).strip(), int(match.group("n") or 2)
    if not (_PLAIN.fullmatch(x) and not x.startswith("-") and 2 <= n <= MAX_ROOT):
        return None
    with localcontext() as ctx:
        ctx.prec = 40
        radicand = Decimal(x)
        root = radicand.sqrt() if n == 2 else (radicand.ln() / n).exp() if radicand else Decimal(0)
        nearest = root.to_integral_value()
        exact = nearest**n == radicand
        value = (nearest if exact else root) * Decimal(match.group("coef") or 1)
        if not exact and value:
            value = value.quantize(Decimal(1).scaleb(value.adjusted() - 19))
    return format(value.normalize() if exact else value, "f")


def _rewrite(pattern: re.Pattern, convert, text: str) -> str:
    """Replace each match by ``convert(match)`` (None: a blank), kept apart from its neighbours."""
    def replace(match: re.Match) -> str:
        value = convert(match)
        if value is None:
            return " "
        glued = match.start() and (text[match.start() - 1].isalnum() or text[match.start() - 1] in "./^_")
        return (" " if glued else "") + value + " "

    return pattern.sub(replace, text)


_DASHES = str.maketrans({**dict.fromkeys("−–‒‐‑—―﹣➖", "-"), "٫": ".", "٬": ","})  # + Arabic decimal/thousands
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\[,;: !])(?=\d{3}(?!\d))")
_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:(?P<sep>[ '’])\d{3})(?:(?P=sep)\d{3})*(?![\d])(?!,\d)")
_NOT_QUANTITY = re.compile(
    r"(?<![\d.])(?:\d{1,2}:\d{2}(?::\d{2})?(?![\d])"                   # 2:42, 14:05:09
    r"|\d{4}([-/.])\d{1,2}\1\d{1,2}(?![\d])|\d{1,2}([-/.])\d{1,2}\2\d{2,4}(?![\d])"  # dates
    r"|\d{1,4}年\d{1,2}月(?:\d{1,2}[日号])?|\d{1,2}月\d{1,2}[日号])"
)


def _blank(match: re.Match) -> str:
    return " " * len(match.group())


def normalize_number_text(text: str) -> str:
    """Superscripts → ``^``, ``，`` → ``, ``, NFKC, dashes → ``-``, LaTeX boxes, fractions, roots
    and thousands separators rewritten, grouped thousands joined by commas, times and dates
    blanked (see the module docstring)."""
    text = superscripts_to_power(text, power="^").replace("，", ", ")
    text = unicodedata.normalize("NFKC", text).translate(_DASHES)
    if "\\" in text or "{," in text:
        text = _LATEX_THOUSANDS.sub(",", text)
        for pattern, replacement in _LATEX_SIMPLE:
            text = pattern.sub(replacement, text)
        text = _rewrite(_LATEX_FRAC, _frac, _rewrite(_LATEX_SQRT, _sqrt, _unbox(text)))
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
        core = core.replace(",", "") if re.fullmatch(r"\d{1,3}(?:,\d{3})+|\d{1,2}(?:,\d{2})+,\d{3}", core) \
            else core.replace(",", ".")
    elif core.count(".") > 1:
        core = core.replace(".", "")
    return Decimal(core)


def _mention(match: re.Match) -> NumberMention | None:
    sign = -1 if match.group("sign") == "-" else 1
    percent = bool(match.group("pct") or match.group("pctpre"))
    try:
        core = _core_decimal(match.group("core"))
        if match.group("den") is not None:
            denominator = Decimal(match.group("den"))
            if denominator == 0:
                return None
            return NumberMention(match.group(), sign * core / denominator, None, percent, exact=False,
                                 span=match.span())
        if match.group("exp"):
            core = core.scaleb(int(match.group("exp")[1:]))
        elif match.group("pow") is not None:
            core = core.scaleb(int(match.group("pow")))
        elif match.group("caret") is not None:
            power = int(match.group("caret"))
            if abs(power) <= MAX_POWER and not (core == 0 and power < 0):
                core = core**power  # otherwise the base alone is read
        scale = match.group("scale") or match.group("k")
        if scale:
            core = core.scaleb(_SCALES[scale.lower()])
        if match.group("cjk"):
            core = core.scaleb(_CJK[match.group("cjk")])
        value = sign * core
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation / Overflow included
        return None
    if not value.is_finite():
        return None
    return NumberMention(match.group(), value, _decimals(value), percent, span=match.span())


def find_numbers(text: str, limit: int = 10_000, normalized: bool = False) -> list[NumberMention]:
    """All number mentions in ``text`` (at most ``limit``), in order; ``normalized``: ``text``
    already is `normalize_number_text`'s output (spans refer to that text either way)."""
    mentions = []
    for match in _NUMBER.finditer(text or "" if normalized else normalize_number_text(text or "")):
        mention = _mention(match)
        if mention is not None:
            mentions.append(mention)
            if len(mentions) >= limit:
                break
    return mentions


def extract_numbers(text: str) -> list[float]:
    """The values of `find_numbers` as floats (a percentage as written: ``25%`` → 25.0)."""
    return [float(m.value) for m in find_numbers(text)]


def parse_number(text: str) -> NumberMention | None:
    """The single number that makes up the whole of ``text`` (after stripping), else None."""
    text = normalize_number_text(str(text)).strip()
    match = _NUMBER.fullmatch(text)
    return _mention(match) if match else None
