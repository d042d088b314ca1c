"""Reading numbers out of free text, for the ground-truth verifier.

`find_numbers(text)` returns `NumberMention`s, `extract_numbers(text)` just their values.
The text is first normalised: superscript exponents become ``^`` (``10³`` → ``10^(3)``), then
NFKC folds full-width digits and punctuation (``１０００`` → ``1000``, ``，`` → ``,``), and
``−`` / ``–`` become ``-``. Then, left to right:

* integers and decimals: ``2932``, ``-3.5``, ``.25``; a sign counts only when it is not glued
  to a preceding digit or letter (``3-2`` reads 3 and 2);
* thousands separators in groups of exactly three: ``1,000`` and ``1,000,000`` are single
  numbers; ``1,2`` is the list 1 and 2, ``1,0000`` reads 1 and 0;
* scientific notation: ``1e3``, ``2.5E-4``, ``1.5×10^3``, ``1.5 x 10^3``, ``1.5*10**3``,
  ``1.5×10³``; a power ``a^b`` with an integer |b| ≤ 100 reads as its value (``10³`` =
  ``10^3`` = 1000, ``2^10`` = 1024, ``1.5^2`` = 2.25; beyond that, or for ``0^-1``, the base
  alone is read);
* fractions ``a/b`` with an integer ``b`` (no spaces; not part of a date-like ``a/b/c``),
  valued a ÷ b; ``a/0`` is not read at all;
* percentages ``25%``: the mention's value is 25 and it is flagged ``percent``; the verifier
  also lets it stand for 0.25 (see `minimind_trl.rewards.verifier`);
* Chinese multipliers directly after a number: ``2.5万`` = 25000, ``3亿`` = 3e8,
  ``1万亿`` = 1e12. ``千`` is *not* a multiplier (it starts units: 千米, 千克).
  Chinese numerals (五, 三十) are not read.

A number glued to a preceding ASCII letter, digit, ``_``, ``.``, ``/`` or ``^`` is skipped
(``x2``, ``v1.5``, the 2 of ``m²``); units may follow directly (``5km``, ``20.5kg``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal

from minimind_trl.envs.safe_math import superscripts_to_power

_CORE = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
_NUMBER = re.compile(
    rf"""(?<![A-Za-z0-9_./^])(?<!\^\()
    (?P<sign>[-+])?
    (?P<core>{_CORE})
    (?:
        /(?P<den>\d+)(?![\d/.])
      | (?P<exp>[eE][-+]?\d+)
      | \s*[×xX*]\s*10\s*(?:\^|\*\*)\s*\(?(?P<pow>[-+]?\d+)\)?
      | \^\(?(?P<caret>[-+]?\d{{1,3}})\)?(?![\d.])
    )?
    (?P<cjk>万亿|亿|万)?
    (?P<pct>\s*%)?""",
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
    fraction (unlimited precision).
    """

    text: str
    value: Decimal
    decimals: int | None
    percent: bool = False
    exact: bool = True


def normalize_number_text(text: str) -> str:
    """Superscripts → ``^``, NFKC, Unicode minus / en dash → ``-``."""
    text = unicodedata.normalize("NFKC", superscripts_to_power(text, power="^"))
    return text.replace("−", "-").replace("–", "-")


def _decimals(value: Decimal) -> int:
    return max(0, -value.as_tuple().exponent)


def _mention(match: re.Match) -> NumberMention | None:
    sign = -1 if match.group("sign") == "-" else 1
    try:
        core = Decimal(match.group("core").replace(",", ""))
        if match.group("den") is not None:
            denominator = Decimal(match.group("den"))
            if denominator == 0:
                return None
            return NumberMention(match.group(), sign * core / denominator, None,
                                 bool(match.group("pct")), exact=False)
        if match.group("exp"):
            core = Decimal(match.group("core").replace(",", "") + match.group("exp"))
        elif match.group("pow") is not None:
            core = core.scaleb(int(match.group("pow")))
        elif match.group("caret") is not None:
            power = int(match.group("caret"))
            if abs(power) <= MAX_POWER and not (core == 0 and power < 0):
                core = core**power  # otherwise the base alone is read
        if match.group("cjk"):
            core = core.scaleb(_CJK[match.group("cjk")])
        value = sign * core
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation / Overflow included
        return None
    if not value.is_finite():
        return None
    return NumberMention(match.group(), value, _decimals(value), bool(match.group("pct")))


def find_numbers(text: str, limit: int = 10_000) -> list[NumberMention]:
    """All number mentions in ``text`` (at most ``limit``), in order."""
    mentions = []
    for match in _NUMBER.finditer(normalize_number_text(text or "")):
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
