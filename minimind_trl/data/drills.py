"""Number-copy drills: short plain texts that teach a small model from scratch to copy numbers.

A tool-using agent copies numbers all the time: the operands from the question into the tool
call, the tool's result into the answer. A small transformer learns to copy with *induction
heads*, which appear in a sudden phase change after some hundred optimizer steps -- but only when
copying is a large, easy part of the loss. Measured on the CPU demo (``demo`` preset, packed
128-token blocks, batch 8, lr 1e-3): on solution texts alone the teacher-forced accuracy of
copied digits stays near 0.3 for 1,000 steps; with these drills mixed into easy-tier solution
texts it jumps to 0.96 by step 700; on drills alone it reaches 0.99 by step 500
(docs/demo_results.md, "How the demo got here").

A drill is three lines: a question stating an expression of two random operands, the expression
alone, and an answer restating it::

    计算 8364 - 7219 的值。
    8364 - 7219
    答案:8364 - 7219。

Operands have 1 to 5 digits, operators are ``+ - * /``; each line repeats the numbers exactly, so
every digit after the first line is predictable by copying and by nothing else. No results are
stated: drills teach copying, not arithmetic (the tool does the arithmetic).
"""

from __future__ import annotations

import random

OPERATORS = ("+", "-", "*", "/")
TEMPLATES = {
    "zh": ("计算 {e} 的值。", "答案:{e}。"),
    "en": ("What is {e}?", "The answer: {e}."),
}


def _operand(rng: random.Random) -> str:
    digits = rng.randint(1, 5)
    return str(rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1))


def copy_drill(rng: random.Random, lang: str = "zh") -> str:
    """One drill text (module docstring) in ``lang`` (``zh`` or ``en``), drawn from ``rng``."""
    if lang not in TEMPLATES:
        raise ValueError(f"copy_drill: lang must be one of {sorted(TEMPLATES)}, got {lang!r}")
    expression = f"{_operand(rng)} {rng.choice(OPERATORS)} {_operand(rng)}"
    question, answer = TEMPLATES[lang]
    return "\n".join((question.format(e=expression), expression, answer.format(e=expression)))


def copy_drills(num_rows: int, seed: int, langs: tuple[str, ...] = ("zh", "en")) -> list[dict]:
    """``num_rows`` pretraining rows ``{"text": drill}``, languages alternating over ``langs``,
    deterministic in ``seed``."""
    if num_rows < 0 or not langs:
        raise ValueError(f"copy_drills: need num_rows >= 0 and at least one language, got {num_rows}, {langs}")
    rng = random.Random(seed)
    return [{"text": copy_drill(rng, langs[i % len(langs)])} for i in range(num_rows)]
