"""Exact decimal arithmetic for ground truth: every GT value is derived from a ``Fraction``.

A tool reports a number with ``format_number``: integral values without a decimal point, others
rounded to 4 decimal places with trailing zeros stripped. :func:`gt_text` writes an exact value
the same way. The generator refuses values lying within ``TIE_MARGIN`` of a rounding tie, where
the tool's floating-point result and the exact value could round apart.
"""

from __future__ import annotations

from fractions import Fraction

PLACES = 4
SCALE = 10**PLACES
TIE_MARGIN = Fraction(1, 10**6)  # in units of the last kept place


def is_terminating(value: Fraction, places: int = PLACES) -> bool:
    """True when ``value`` has at most ``places`` decimal places."""
    return (value * 10**places).denominator == 1


def near_tie(value: Fraction) -> bool:
    """True when ``value`` is (almost) exactly half-way between two 4-decimal numbers."""
    scaled = value * SCALE
    return abs(scaled - (scaled.numerator // scaled.denominator) - Fraction(1, 2)) < TIE_MARGIN


def round4(value: Fraction) -> Fraction:
    """``value`` rounded to 4 decimal places (half to even; callers avoid ties anyway)."""
    return Fraction(round(value * SCALE), SCALE)


def decimal_text(value: Fraction) -> str:
    """Exact decimal text of a value with at most 4 decimal places (``"-12.5"``, ``"3"``)."""
    if not is_terminating(value):
        raise ValueError(f"{value} is not a decimal with at most {PLACES} places")
    sign = "-" if value < 0 else ""
    scaled = abs(value.numerator * (SCALE // value.denominator))
    whole, frac = divmod(scaled, SCALE)
    frac_text = f"{frac:0{PLACES}d}".rstrip("0")
    return f"{sign}{whole}.{frac_text}" if frac_text else f"{sign}{whole}"


def gt_text(value: Fraction) -> str:
    """How a tool reports ``value``: rounded to 4 places, written by :func:`decimal_text`."""
    text = decimal_text(round4(value))
    return "0" if text == "-0" else text


def argument_number(value: Fraction) -> int | float:
    """A JSON number for a tool argument: an int when integral, else a float."""
    return value.numerator if value.denominator == 1 else float(decimal_text(value))


def exact_factor(factor: float) -> Fraction:
    """The exact value a float factor stands for: a fraction with a small denominator when one is
    within 1e-12 (``1/3.6`` -> ``5/18``), else the float's shortest decimal text."""
    simple = Fraction(factor).limit_denominator(1000)
    if factor and abs(float(simple) - factor) <= 1e-12 * abs(factor):
        return simple
    return Fraction(repr(factor))
