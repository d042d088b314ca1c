"""Question builders for the agent-math generator: wording plus reference calls with exact values.

Operation types: ``arithmetic``, ``percentage``, ``power``, ``unit_conversion``,
``exchange_rate`` -- 1 to 3 independent sub-questions of that kind, one call each -- and ``chain``
(2 or 3 steps, step k acting on step k-1's reported result; one call per step).

Difficulty tiers: ``easy`` -- small integers, one operation, exact results; ``medium`` -- up to
3-digit integers, two operations, divisions; ``hard`` -- up to 5 digits, one or two decimal
places, three operations with parentheses. Pure-math values (arithmetic, percentage, power) are
always exact decimals with at most 4 places; unit and exchange values (and chain steps built on
them) may be rounded by the tool to 4 places, but never within 1e-6 of a rounding tie and never by
more than 0.1 % of the value. Every value stays below 1e9 in magnitude.

A builder draws a candidate and raises ``_Retry`` when a constraint fails;
:func:`build_question` redraws up to ``MAX_ATTEMPTS`` times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction

from minimind_trl.data import templates as T
from minimind_trl.data.exact import (
    argument_number,
    decimal_text,
    exact_factor,
    gt_text,
    is_terminating,
    near_tie,
    round4,
)
from minimind_trl.data.validation import GenerationError
from minimind_trl.envs.tools import EXCHANGE_RATES, TEMPERATURE_UNITS, UNIT_FACTORS

MAX_MAGNITUDE = 10**9
MAX_ATTEMPTS = 200
# curated units per dimension (all present in UNIT_FACTORS); temperature is affine
UNITS = {
    "length": ("m", "km", "cm", "mm", "mile", "ft", "in"), "mass": ("kg", "g", "t", "lb", "jin"),
    "time": ("s", "min", "h", "day", "week"), "volume": ("l", "ml"), "area": ("m2", "ha", "km2"),
    "speed": ("m/s", "km/h"), "temperature": TEMPERATURE_UNITS,
}
EASY_DIVISORS = tuple(range(2, 13))
DIVISORS = (2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 80, 125)
_CELSIUS_OFFSET = Fraction("273.15")


class _Retry(Exception):
    """A candidate broke a constraint; draw another."""


@dataclass
class Call:
    """One tool call of the reference solution and its exact value."""

    name: str
    arguments: dict
    exact: Fraction

    @property
    def gt(self) -> str:
        return gt_text(self.exact)


@dataclass
class Part:
    """A (sub-)question and the calls answering it."""

    question: str
    calls: list[Call] = field(default_factory=list)


def _num(value: Fraction) -> str:
    return decimal_text(value)


def _check(value: Fraction, exact_only: bool) -> Fraction:
    """Reject values that are too large, ambiguous to round, or (if asked) not exact."""
    if abs(value) >= MAX_MAGNITUDE or near_tie(value):
        raise _Retry
    if exact_only and not is_terminating(value):
        raise _Retry
    if value != 0 and abs(round4(value) - value) > abs(value) / 1000:
        raise _Retry
    return value


def _operand(rng: random.Random, difficulty: str) -> Fraction:
    if difficulty == "easy":
        return Fraction(rng.randint(2, 99))
    if difficulty == "medium":
        return Fraction(rng.randint(2, 999))
    if rng.random() < 0.5:
        return Fraction(rng.randint(10, 99999))
    return Fraction(rng.randint(11, 99999), rng.choice((10, 100)))


_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}
_SHOW = {"+": "+", "-": "-", "*": "×", "/": "÷"}


def _expression(rng: random.Random, difficulty: str, n_operands: int, pretty: bool) -> tuple[str, str, Fraction]:
    """(tool expression, displayed expression, exact value) of a random left-to-right expression,
    parenthesised where precedence requires it."""
    value = _operand(rng, difficulty)
    text = shown = _num(value)
    top = None
    for _ in range(n_operands - 1):
        op = rng.choice("+-*/")
        operand = Fraction(rng.choice(DIVISORS)) if op == "/" else _operand(rng, difficulty)
        if op in "*/" and top in ("+", "-"):
            text, shown = f"({text})", f"({shown})"
        symbol = _SHOW[op] if pretty else op
        text, shown = f"{text} {op} {_num(operand)}", f"{shown} {symbol} {_num(operand)}"
        value, top = _APPLY[op](value, operand), op
    return text, shown, _check(value, exact_only=True)


def _calc(expression: str, value: Fraction) -> Call:
    return Call("calculate_math", {"expression": expression}, value)


def _arithmetic(rng: random.Random, lang: str, difficulty: str) -> Part:
    if difficulty == "easy":
        op = rng.choice("+-*/")
        b = Fraction(rng.choice(EASY_DIVISORS)) if op == "/" else _operand(rng, difficulty)
        a = b * rng.randint(2, 12) if op == "/" else _operand(rng, difficulty)
        expression, value = f"{_num(a)} {op} {_num(b)}", _check(_APPLY[op](a, b), True)
        if rng.random() < 0.5:
            return Part(T.ARITHMETIC_WORDS[lang][op].format(a=_num(a), b=_num(b)), [_calc(expression, value)])
        shown = f"{_num(a)} {_SHOW[op] if rng.random() < 0.5 else op} {_num(b)}"
    else:
        n_operands = 3 if difficulty == "medium" else 4
        expression, shown, value = _expression(rng, difficulty, n_operands, rng.random() < 0.5)
    return Part(rng.choice(T.ARITHMETIC[lang]).format(expr=shown), [_calc(expression, value)])


def _percentage(rng: random.Random, lang: str, difficulty: str) -> Part:
    kinds = {"easy": ("of",), "medium": ("of", "up", "down"), "hard": ("of", "up", "down", "ratio")}[difficulty]
    kind = rng.choice(kinds)
    if difficulty == "easy":
        p, x = Fraction(rng.choice((10, 20, 25, 50, 75))), Fraction(10 * rng.randint(1, 100))
    elif difficulty == "medium":
        p, x = Fraction(rng.randint(1, 99)), Fraction(rng.randint(10, 9999))
    else:
        p, x = Fraction(rng.randint(1, 999), 10), _operand(rng, "hard")
    if kind == "ratio":
        b = Fraction(rng.choice(DIVISORS) * rng.randint(1, 40))
        a = Fraction(rng.randint(1, int(b)))
        value = _check(a / b * 100, True)
        question = rng.choice(T.PERCENTAGE["ratio"][lang]).format(a=_num(a), b=_num(b))
        return Part(question, [_calc(f"{_num(a)} / {_num(b)} * 100", value)])
    expression = {"of": "{x} * {p} / 100", "up": "{x} * (1 + {p} / 100)", "down": "{x} * (1 - {p} / 100)"}[kind]
    factor = {"of": p / 100, "up": 1 + p / 100, "down": 1 - p / 100}[kind]
    value = _check(x * factor, True)
    question = rng.choice(T.PERCENTAGE[kind][lang]).format(x=_num(x), p=_num(p))
    return Part(question, [_calc(expression.format(x=_num(x), p=_num(p)), value)])


def _power(rng: random.Random, lang: str, difficulty: str) -> Part:
    if difficulty == "hard":
        base = Fraction(rng.randint(11, 39), 10) if rng.random() < 0.5 else Fraction(rng.randint(2, 20))
        exponent = rng.randint(2, 4)
        c = Fraction(rng.randint(1, 999))
        op = rng.choice("+-")
        value = _check(_APPLY[op](base**exponent, c), True)
        expression = f"{_num(base)} ** {exponent} {op} {_num(c)}"
        shown = f"{_num(base)}^{exponent} {op} {_num(c)}"
        return Part(rng.choice(T.POWER["expr"][lang]).format(expr=shown), [_calc(expression, value)])
    if difficulty == "easy":
        base, exponent = rng.randint(2, 30), rng.choice((2, 3))
        templates = T.POWER[exponent][lang] + T.POWER["n"][lang]
    else:
        base, exponent = rng.randint(2, 15), rng.randint(4, 9)
        templates = T.POWER["n"][lang]
    value = _check(Fraction(base) ** exponent, True)
    question = rng.choice(templates).format(a=base, b=exponent)
    return Part(question, [_calc(f"{base} ** {exponent}", value)])


def convert_exact(value: Fraction, source: str, target: str) -> Fraction:
    """Exact unit conversion using the tool's tables (temperatures via kelvin)."""
    if source in TEMPERATURE_UNITS:
        kelvin = {"celsius": value + _CELSIUS_OFFSET, "kelvin": value,
                  "fahrenheit": (value - 32) * Fraction(5, 9) + _CELSIUS_OFFSET}[source]
        return {"celsius": kelvin - _CELSIUS_OFFSET, "kelvin": kelvin,
                "fahrenheit": (kelvin - _CELSIUS_OFFSET) * Fraction(9, 5) + 32}[target]
    return value * exact_factor(UNIT_FACTORS[source][1]) / exact_factor(UNIT_FACTORS[target][1])


def _unit_call(rng: random.Random, difficulty: str) -> tuple[Call, Fraction, str, str]:
    dimension = rng.choice(sorted(UNITS))
    source, target = rng.sample(UNITS[dimension], 2)
    if dimension == "temperature":
        value = Fraction(rng.randint(-400, 1200), 10) if difficulty == "hard" else Fraction(rng.randint(-40, 120))
        if source == "kelvin":
            value += 300
    else:
        scale = {"easy": 1, "medium": 10, "hard": 100}[difficulty]
        value = Fraction(rng.randint(1, 100 * scale), scale)
    result = _check(convert_exact(value, source, target), exact_only=difficulty == "easy")
    if result == 0:
        raise _Retry
    call = Call("unit_converter", {"value": argument_number(value), "from_unit": source, "to_unit": target}, result)
    return call, value, source, target


def _unit(rng: random.Random, lang: str, difficulty: str) -> Part:
    call, value, source, target = _unit_call(rng, difficulty)
    names = T.UNIT_NAMES[lang]
    question = rng.choice(T.UNIT[lang]).format(v=_num(value), src=names[source], dst=names[target])
    return Part(question, [call])


def _currency_pair(rng: random.Random, difficulty: str) -> tuple[str, str]:
    codes = sorted(EXCHANGE_RATES)
    if difficulty == "easy":
        return rng.choice([c for c in codes if c != "CNY"]), "CNY"
    if difficulty == "medium":
        other = rng.choice([c for c in codes if c not in ("CNY", "USD")])
        return (other, "USD") if rng.random() < 0.5 else ("USD", other)
    source, target = rng.sample(codes, 2)
    return source, target


def _rate_call(rng: random.Random, difficulty: str) -> Call:
    source, target = _currency_pair(rng, difficulty)
    rate = _check(exact_factor(EXCHANGE_RATES[source]) / exact_factor(EXCHANGE_RATES[target]), exact_only=False)
    return Call("get_exchange_rate", {"from_currency": source, "to_currency": target}, rate)


def _currency_name(code: str, lang: str, rng: random.Random) -> str:
    return T.CURRENCY_NAMES_ZH[code] if lang == "zh" and rng.random() < 0.5 else code


def _exchange(rng: random.Random, lang: str, difficulty: str) -> Part:
    call = _rate_call(rng, difficulty)
    src, dst = (_currency_name(call.arguments[k], lang, rng) for k in ("from_currency", "to_currency"))
    return Part(rng.choice(T.EXCHANGE[lang]).format(src=src, dst=dst), [call])


def _chain_step(rng: random.Random, difficulty: str, previous: str, ops: str) -> tuple[Call, str, str]:
    """A calculate_math call acting on the previous result: (call, step key, shown operand)."""
    prev = Fraction(previous)
    op = rng.choice(ops)
    limit = {"easy": 20, "medium": 200, "hard": 2000}[difficulty]
    if op == "pct":
        c = Fraction(rng.choice((5, 10, 15, 20, 25, 30, 50)))
        return _calc(f"{previous} * {_num(c)} / 100", _check(prev * c / 100, False)), "pct", _num(c)
    if op == "/":
        c = Fraction(rng.choice(DIVISORS[:6]))
    elif op == "-":
        if prev <= 2:
            raise _Retry
        c = Fraction(rng.randint(1, int(min(prev - 1, limit))))
    else:
        c = Fraction(rng.randint(2, limit if op == "+" else 12))
    value = _check(_APPLY[op](prev, c), False)
    return _calc(f"{previous} {op} {_num(c)}", value), op, _num(c)


def _chain(rng: random.Random, lang: str, difficulty: str, n_steps: int) -> Part:
    start = rng.choice(("calc", "power", "unit", "exchange"))
    names = T.UNIT_NAMES[lang]
    if start == "calc":
        expression, shown, value = _expression(rng, "easy" if difficulty == "easy" else "medium", 2, rng.random() < 0.5)
        first, phrase = _calc(expression, value), T.CHAIN_START["calc"][lang].format(expr=shown)
    elif start == "power":
        top_base, top_exponent = {"easy": (9, 3), "medium": (12, 5), "hard": (20, 6)}[difficulty]
        base, exponent = rng.randint(2, top_base), rng.randint(2, top_exponent)
        first = _calc(f"{base} ** {exponent}", _check(Fraction(base) ** exponent, True))
        phrase = T.CHAIN_START["power"][lang].format(a=base, b=exponent)
    elif start == "unit":
        first, value, source, target = _unit_call(rng, difficulty)
        phrase = T.CHAIN_START["unit"][lang].format(v=_num(value), src=names[source], dst=names[target])
    else:
        first = _rate_call(rng, difficulty)
        src, dst = (_currency_name(first.arguments[k], lang, rng) for k in ("from_currency", "to_currency"))
        phrase = T.CHAIN_START["exchange"][lang].format(src=src, dst=dst)
    calls, phrases = [first], [phrase]
    for index in range(1, n_steps):
        if start == "exchange" and index == 1:
            amount = Fraction(rng.randint(1, 100) * {"easy": 10, "medium": 7, "hard": 13}[difficulty])
            call = _calc(f"{_num(amount)} * {first.gt}", _check(amount * Fraction(first.gt), False))
            phrase = T.CHAIN_STEP["amount"][lang].format(c=_num(amount), src=src, dst=dst)
        else:
            call, key, operand = _chain_step(rng, difficulty, calls[-1].gt, ("+", "-", "*", "/", "pct"))
            phrase = T.CHAIN_STEP[key][lang].format(c=operand)
        calls.append(call)
        phrases.append(phrase)
    head, tail, end = rng.choice(T.CHAIN_JOIN[lang])
    question = head.format(s1=phrases[0], s2=phrases[1]) + (tail.format(s3=phrases[2]) if n_steps == 3 else "") + end
    return Part(question, calls)


BUILDERS = {"arithmetic": _arithmetic, "percentage": _percentage, "power": _power,
            "unit_conversion": _unit, "exchange_rate": _exchange}


def build_question(rng: random.Random, op_type: str, n_gt: int, lang: str, difficulty: str) -> Part:
    """One question of the stratum (``n_gt`` calls), redrawn until every constraint holds."""
    for _ in range(MAX_ATTEMPTS):
        try:
            if op_type == "chain":
                return _chain(rng, lang, difficulty, n_gt)
            parts: list[Part] = []
            while len(parts) < n_gt:
                part = BUILDERS[op_type](rng, lang, difficulty)
                if all(part.calls[0].arguments != p.calls[0].arguments for p in parts):
                    parts.append(part)
        except _Retry:
            continue
        if n_gt == 1:
            return parts[0]
        intro, *markers = rng.choice(T.MULTI[lang])
        text = intro.format(n=T.NUMBER_WORDS[lang][n_gt]) + "".join(
            marker.format(q=part.question) for marker, part in zip(markers, parts))
        return Part(text, [part.calls[0] for part in parts])
    raise GenerationError(f"no valid {difficulty} {op_type} question with {n_gt} values after {MAX_ATTEMPTS} draws")
