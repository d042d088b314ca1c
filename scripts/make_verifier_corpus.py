"""Write the labelled verifier corpus (issue 40.2): tests/rewards/verifier_corpus.jsonl.

Each row is ``{"class", "form", "answer", "gt", "question", "credit"}``: ``credit`` says, per GT
value, whether a careful human grader credits the answer with it. The classes:

* ``natural``: correct answers written as people and small models write them (every GT credited);
* ``hedge``: a second value offered as an alternative, whatever the punctuation or language;
* ``range``: ranges, intervals and bounds;
* ``negation``: a value negated, marked wrong or struck through;
* ``restatement``: the question's numbers restated, unevaluated (a power, root, quotient or a bare
  expression) — nothing stated;
* ``misread``: forms a number reader gets wrong (``4200%`` for 42, ``0,125`` for 125, equal GT slots).

Every form is a template filled with values drawn from one seeded `random.Random`, so the file is
reproducible: ``python scripts/make_verifier_corpus.py`` rewrites it. The labels follow from the
templates (a template of the natural class states its GT values; the others offer a wrong value,
a range, a negated or unevaluated one). tests/rewards/test_verifier_corpus.py re-runs the file.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "rewards" / "verifier_corpus.jsonl"
PERCENT_QUESTIONS = ("What percentage of {b} is {a}?", "{a} is what percent of {b}?", "{a} 占 {b} 的百分之几?")


def _num(x) -> str:
    """A value as the tools write it: integers without a point, decimals without trailing zeros."""
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10f}".rstrip("0").rstrip(".")


def _grouped(n: int) -> str:
    return f"{n:,}"


def _draw(rng: random.Random) -> dict:
    """Fresh operands and results for one row (every field a string the templates may use)."""
    a, b = rng.randint(12, 999), rng.randint(2, 99)
    base, exponent = rng.randint(2, 15), rng.randint(2, 5)
    denominator = rng.choice((4, 8, 16, 20, 25, 40))
    fraction = Fraction(rng.randint(1, denominator - 1), denominator)  # in lowest terms
    k = rng.randint(2, 5)
    big = rng.randint(1_000, 9_999_999)
    root = rng.randint(11, 99)
    w = a + b + rng.choice((-3, -1, 1, 2, 7))
    return {
        "a": str(a), "b": str(b), "sum": str(a + b), "prod": str(a * b), "diff": str(a - b),
        "w": str(w), "w2": str(a + b + 13), "w0": str(a + b - 11), "d": str(rng.randint(1, 5)),
        "base": str(base), "exp": str(exponent), "pow": str(base**exponent),
        "num": str(fraction.numerator), "den": str(fraction.denominator), "frac": _num(fraction),
        "rnum": str(fraction.numerator * k), "rden": str(fraction.denominator * k),
        "big": str(big), "bigc": _grouped(big), "bigdot": _grouped(big).replace(",", "."),
        "root": str(root), "sq": str(root * root),
        "neg": str(-(a - b) if a > b else a - b), "abs": str(abs(a - b) or 1),
        "kelvin": _num(Fraction(rng.randint(2000, 4000), 10) + Fraction(15, 100)),
        "celsius": "", "small": f"0.{rng.randint(100, 999)}", "cents": str(rng.randint(11, 99)),
        "km": str(rng.randint(2, 90)), "mill": str(rng.randint(2, 9)), "pct": str(rng.randint(2, 95)),
    }


def _percent_values(rng: random.Random) -> dict:
    """A "what percentage" question: a of b, p = a / b · 100 written exactly."""
    b = rng.choice((8, 16, 20, 25, 40, 50, 80, 125, 200, 400))
    a = rng.randint(1, b - 1)
    return {"a": str(a), "b": str(b), "p": _num(Fraction(a * 100, b)), "w": _num(Fraction(a * 100, b) + 1)}


# (form, answer template, GT fields): natural answers state every GT field; fields name _gt_fields' keys
NATURAL = [
    ("sentence", "The answer is {sum}.", ["sum"]),
    ("zh sentence", "答案是{sum}。", ["sum"]),
    ("noun after", "There are {sum} apples.", ["sum"]),
    ("zh noun after", "答:共有{sum}个苹果。", ["sum"]),
    ("bold", "So the result is **{sum}**.", ["sum"]),
    ("bold label", "**Answer:** {sum}", ["sum"]),
    ("bare", "{sum}", ["sum"]),
    ("bare period", "{sum}.", ["sum"]),
    ("boxed", r"The final answer is $\boxed{{{sum}}}$.", ["sum"]),
    ("chain", "{a} + {b} = {sum}", ["sum"]),
    ("chain times", "{a} × {b} = {prod}", ["prod"]),
    ("chain words", "{a} times {b} is {prod}.", ["prod"]),
    ("chain then result", "{a} × {b} = {prod}. So the answer is {prod}.", ["prod"]),
    ("tool restated", "Using the calculator with {a}*{b}, I got {prod}.", ["prod"]),
    ("expression in brackets", "The answer is {prod} ({a} × {b}).", ["prod"]),
    ("multiplied by", "Multiplying {a} by {b} gives {prod}.", ["prod"]),
    ("zh chain 乘以 等于", "{a}乘以{b}等于{prod}。", ["prod"]),
    ("zh chain 乘以 是", "{a}乘以{b}是{prod}。", ["prod"]),
    ("zh chain 加 为", "{a}加{b}为{sum}。", ["sum"]),
    ("zh result 为", "计算结果为{diff}。", ["diff"]),
    ("zh 减去 得", "{a}减去{b}得{diff}", ["diff"]),
    ("thousands", "The total is {bigc}.", ["big"]),
    ("plain big", "{big}", ["big"]),
    ("power chain", "{base}^{exp} = {pow}", ["pow"]),
    ("power words", "{base} to the power of {exp} is {pow}.", ["pow"]),
    ("zh power", "{base}的{exp}次方是{pow}。", ["pow"]),
    ("power stars", "{base} ** {exp} = {pow}", ["pow"]),
    ("root chain", "√{sq} = {root}", ["root"]),
    ("latex root chain", r"$\sqrt{{{sq}}} = {root}$", ["root"]),
    ("fraction", "The answer is {num}/{den}.", ["frac"]),
    ("latex frac", r"$\frac{{{num}}}{{{den}}}$", ["frac"]),
    ("decimal", "It comes to {frac}.", ["frac"]),
    ("approx", "{a} / {b} ≈ {ratio}", ["ratio"]),
    ("minus word", "Result: minus {abs}", ["negabs"]),
    ("negative word", "The change is negative {abs}.", ["negabs"]),
    ("unicode minus", "x = −{abs}", ["negabs"]),
    ("zh negative", "结果是-{abs}。", ["negabs"]),
    ("temperature", "It drops to −{abs} degrees.", ["negabs"]),
    ("decimal comma", "Das Ergebnis ist 0,{cents}5.", ["cents_decimal"]),
    ("decimal comma units", "{a},5 kg", ["a_half"]),
    ("dot thousands comma decimal", "{bigdot},5 €", ["big_half"]),
    ("scale word", "About {mill} million people.", ["million"]),
    ("scale caps", "{mill} MILLION", ["million"]),
    ("scale title", "{mill}.5 Million", ["sci"]),
    ("sci", "{mill}.5e6", ["sci"]),
    ("sci times", "{mill}.5 × 10^6", ["sci"]),
    ("kelvin", "The temperature is {kelvin}K.", ["kelvin"]),
    ("kelvin spaced", "{kelvin} K", ["kelvin"]),
    ("celsius to kelvin", "{cents} °C = {kelvin_of_cents}K", ["kelvin_of_cents"]),
    ("unit km", "{km} km = {km}000 m", ["km_m"]),
    ("unit is", "So, {km} km is {km}000 m.", ["km_m"]),
    ("unit km2", "{km} km2 = {km}00 ha", ["km_ha"]),
    ("unit m²", "{km} m² = {km}0000 cm²", ["m2_cm2"]),
    ("zh unit", "{km}公里等于{km}000米。", ["km_m"]),
    ("exchange", "1 USD = 7.{cents} CNY", ["rate"]),
    ("currency symbols", "${a} = ¥{a}0", ["a10"]),
    ("degrees", "{cents}°C = {kelvin_of_cents} K", ["kelvin_of_cents"]),
    ("becomes", "After a {pct}% increase, {big} becomes {big_up}.", ["big_up"]),
    ("zh becomes", "{big}增加{pct}%后变为{big_up}。", ["big_up"]),
    ("not wrong value", "The answer is {sum}, not {w}.", ["sum"]),
    ("think then answer", "<think>maybe {w}</think>The answer is {sum}.", ["sum"]),
]
NATURAL_MULTI = [
    ("enumerated", "(1) {sum} (2) {prod}", ["sum", "prod"]),
    ("glyph enumerated", "①{sum} ②{prod}", ["sum", "prod"]),
    ("closing paren list", "1) {sum} 2) {prod}", ["sum", "prod"]),
    ("and", "The answers are {sum} and {prod}.", ["sum", "prod"]),
    ("zh list", "第一题:{sum};第二题:{prod}。", ["sum", "prod"]),
    ("bullets", "- Part 1: {sum}\n- Part 2: {prod}", ["sum", "prod"]),
    ("numbered lines", "1. {sum}\n2. {prod}", ["sum", "prod"]),
    ("boxes", r"\boxed{{{sum}}} and \boxed{{{prod}}}", ["sum", "prod"]),
    ("table", "| part | value |\n|---|---|\n| 1 | {sum} |\n| 2 | {prod} |", ["sum", "prod"]),
    ("chains", "{a} + {b} = {sum}; {a} * {b} = {prod}.", ["sum", "prod"]),
    ("gold chain", "Step by step: {a} + {b} = {sum}; {sum} * 2 = {sum2}. The final answer is {sum2}.",
     ["sum", "sum2"]),
    ("then", "First {a} + {b} = {sum}, then multiply by 2 to get {sum2}.", ["sum", "sum2"]),
    ("zh chains", "各题答案如下:(1) {a} + {b} = {sum};(2) {a} * {b} = {prod}。", ["sum", "prod"]),
    ("unit chains", "(1) {km} km2 = {km}00 ha; (2) {km} m² = {km}0000 cm²", ["km_ha", "m2_cm2"]),
    ("three", "{sum}, {prod} and {diff}", ["sum", "prod", "diff"]),
    ("three enumerated", "(1) {sum} (2) {prod} (3) {diff}", ["sum", "prod", "diff"]),
    ("bracket list", "[{prod}, {sum}]", ["prod", "sum"]),
    ("equal values", "(1) {sum} (2) {sum}", ["sum", "sum"]),
]
PERCENT_NATURAL = [
    ("percent sign", "{p}%"), ("percent sentence", "The answer is {p}%."), ("percent word", "{p} percent"),
    ("plain number", "{p}"), ("zh percent", "百分之{p}"), ("restated", "{a} is {p}% of {b}."),
    ("zh restated", "{a}是{b}的{p}%。"), ("chain", "{a} / {b} * 100 = {p}"), ("chain percent", "{a}/{b} = {p}%"),
]
HEDGE = [
    "{v} (or {w})", "{w} (or {v})", "{v}, alternatively {w}", "{v} or else {w}", "{v} | {w}", "{v} vs {w}",
    "{v} vs. {w}", "{v}. Or {w}.", "{v}(或{w})", "{v} oder {w}", "{v} ou {w}", r"\boxed{{{w}}} \boxed{{{v}}}",
    r"\boxed{{{v}}}\boxed{{{w}}}", "{v}, maybe {w}", "Either {v} or {w}.", "{v}; otherwise {w}",
    "{v}。也可能是{w}。", "{v}还是{w}", "{v} 或者 {w}", "{v}... or perhaps {w}", "{v} — actually {w}",
    "{v}, I mean {w}", "{w} or {v}", "The answer is {v} (possibly {w}).", "要么{v},要么{w}",
]
RANGE = [  # {w0} < {v} < {w2}
    "[{v}, {w2}]", "({v}, {w2})", "[{w0}, {v}]", "[{v}, {w2})", "{v}...{w2}", "{v}..{w2}", "{v}…{w2}",
    "{v} ≤ x ≤ {w2}", "{w0} < x < {v}", "{v}±{d}", "{v} ± {d}", "{v} +/- {d}", "between {v} and {w2}",
    "from {v} to {w2}", "{v} to {w2}", "{v}-{w2}", "{v}~{w2}", "{v}至{w2}", "在{v}到{w2}之间", "at least {v}",
    "≥ {v}", "{v} or more", "up to {v}", "{v} plus or minus {d}",
]
NEGATION = [
    "{v} (wrong)", "{v} (incorrect)", "~~{v}~~ {w}", "~~{v}~~", "wrong: {v}", "Wrong answer: {v}", "not {v}",
    "It is not {v}.", "{v} is wrong", "{v} is incorrect; the answer is {w}.", "{v} ✗", "<del>{v}</del> {w}",
    "<s>{v}</s>", "答案不是{v}", "{v}不对", "错误:{v}", "{v}(错误)", "The answer isn't {v}.", "{w}, not {v}",
    "never {v}", "{w} rather than {v}", "instead of {v}, {w}", "{v} [wrong]", r"\sout{{{v}}} {w}",
]
RESTATEMENT = [  # (template, GT field)
    ("{base}^{exp}", "pow"), ("The answer is {base}^{exp}.", "pow"), ("{base}**{exp}", "pow"),
    (r"\boxed{{{base}^{{{exp}}}}}", "pow"), ("{base} to the power of {exp}", "pow"), ("{base}的{exp}次方", "pow"),
    ("{base}²", "sq_base"), ("{base}³", "cube_base"), ("{prod}/{b}", "a"), (r"\frac{{{prod}}}{{{b}}}", "a"),
    (r"\dfrac{{{prod}}}{{{b}}}", "a"), ("{rnum}/{rden}", "frac"), (r"\frac{{{rnum}}}{{{rden}}}", "frac"),
    (r"\sqrt{{{sq}}}", "root"), ("√{sq}", "root"), ("sqrt({sq})", "root"),
    ("{big}/(100/{pct})", "pct_of"), ("{big}*{pct}/100", "pct_of"), ("{a} + {b}", "sum"), ("{a} × {b}", "prod"),
    ("{a} times {b}", "prod"), ("{a}乘以{b}", "prod"), ("答案是{a}加{b}。", "sum"), ("x = {prod}/{b}", "a"),
    ("{a}*{b}", "prod"), ("({a}+{b})", "sum"),
]
MISREAD = [  # (form, answer, gt, question, credit)
    ("percent of a quantity", "{pct}00%", ["pct"], "", [False]),
    ("leading zero comma", "0,{cents}5", ["cents5"], "", [False]),
    ("caps scale word", "{mill} MILLION", ["mill"], "", [False]),
    ("minus word", "Result: minus {abs}", ["abs"], "", [False]),
    ("kelvin", "{kelvin}K", ["kelvin1000"], "", [False]),
    ("equal slots", "{prod}", ["prod", "prod"], "", [True, False]),
    ("equal slots and a wrong third", "{prod} and {w}", ["prod", "prod", "sum"], "", [True, False, False]),
    ("percent outside a percentage question", "{pct}%", ["pct"], "", [False]),
]


def _gt_fields(v: dict) -> dict:
    """Derived GT values a template may name."""
    a, b = int(v["a"]), int(v["b"])
    return {
        **v, "negabs": str(-int(v["abs"])), "cents_decimal": "0." + v["cents"] + "5", "cents5": v["cents"] + "5",
        "million": str(int(v["mill"]) * 1_000_000), "km_m": str(int(v["km"]) * 1000), "km_ha": str(int(v["km"]) * 100),
        "m2_cm2": str(int(v["km"]) * 10_000), "ratio": f"{a / b:.2f}", "sci": str(int(v["mill"]) * 1_000_000 + 500_000),
        "sum2": str((a + b) * 2), "sq_base": str(int(v["base"]) ** 2), "cube_base": str(int(v["base"]) ** 3),
        "a_half": v["a"] + ".5", "a10": v["a"] + "0",
        "big_up": _num(Fraction(int(v["big"]) * (100 + int(v["pct"])), 100)),
        "big_half": v["big"] + ".5", "rate": "7." + v["cents"],
        "kelvin_of_cents": _num(Fraction(int(v["cents"])) + Fraction(27315, 100)),
        "pct_of": _num(Fraction(int(v["big"]) * int(v["pct"]), 100)), "kelvin1000": _num(Fraction(v["kelvin"]) * 1000),
    }


def _row(cls: str, form: str, answer: str, gt: list, question: str, credit: list[bool]) -> dict:
    return {"class": cls, "form": form, "answer": answer, "gt": gt, "question": question, "credit": credit}


def _fill(rng: random.Random, template: str, fields: list[str]) -> tuple[str, list[str]]:
    v = _gt_fields(_draw(rng))
    return template.format(**v), [v[f] for f in fields]


def _natural(rng: random.Random) -> list[dict]:
    rows = []
    for form, template, fields in NATURAL + NATURAL_MULTI:
        for _ in range(4 if len(fields) == 1 else 5):
            answer, gt = _fill(rng, template, fields)
            rows.append(_row("natural", form, answer, gt, "", [True] * len(gt)))
    for form, template in PERCENT_NATURAL:
        for question in PERCENT_QUESTIONS:
            v = _percent_values(rng)
            rows.append(_row("natural", "percentage question: " + form, template.format(**v), [v["p"]],
                             question.format(**v), [True]))
    return rows


def _offered(rng: random.Random, cls: str, templates: list[str], repeats: int) -> list[dict]:
    """Rows offering the GT ``v`` with a wrong value, a range or a negation: no credit."""
    rows = []
    for template in templates:
        for _ in range(repeats):
            v = _gt_fields(_draw(rng))
            gt = v["sum"]
            rows.append(_row(cls, template, template.format(**{**v, "v": gt}), [gt], "", [False]))
    return rows


def _restatements(rng: random.Random) -> list[dict]:
    rows = []
    for template, field in RESTATEMENT:
        for _ in range(3):
            answer, gt = _fill(rng, template, [field])
            rows.append(_row("restatement", template, answer, gt, "", [False]))
    return rows


def _misreads(rng: random.Random) -> list[dict]:
    rows = []
    for form, template, fields, question, credit in MISREAD:
        for _ in range(3):
            answer, gt = _fill(rng, template, fields)
            rows.append(_row("misread", form, answer, gt, question, credit))
    return rows


def build_corpus(seed: int = 40) -> list[dict]:
    rng = random.Random(seed)
    return (_natural(rng) + _offered(rng, "hedge", HEDGE, 3) + _offered(rng, "range", RANGE, 3)
            + _offered(rng, "negation", NEGATION, 3) + _restatements(rng) + _misreads(rng))


def main() -> None:
    rows = build_corpus()
    OUT.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["class"]] = counts.get(row["class"], 0) + 1
    print(f"{OUT}: {len(rows)} rows {counts}")


if __name__ == "__main__":
    main()
