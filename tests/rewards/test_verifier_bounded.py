"""Issue 40.3: every verifier and number-parsing call does work linear in its input.

Property: 10,000-character degenerate inputs of every kind (runs of one character class, repeated
tags and LaTeX openers, numbers joined by long gaps) are read in under 50 ms each, by every entry
point a reward or evaluation calls. Each input is timed best-of-three, so a busy machine's
scheduling noise does not fail the test; a super-linear path (the cubic gap match this test was
written against took seconds) fails by orders of magnitude."""

import time

import pytest

from minimind_trl.rewards import extract_numbers, final_answer_text, verify, view_completion
from minimind_trl.rewards.numbers import find_numbers, normalize_number_text, parse_number
from minimind_trl.rewards.verifier import observation_result

SIZE = 10_000
LIMIT_S = 0.050


def _fill(unit: str, size: int = SIZE) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _between(gap_unit: str) -> str:
    """Two numbers (and an `=` after them) around a long gap: the equation-chain and list gaps."""
    return "12 " + _fill(gap_unit, SIZE - 10) + " 34 = 5"


RUNS = {  # one character class repeated
    "letters": "a", "upper": "K", "cjk": "中", "digits": "7", "spaces": " ", "newlines": "\n", "tabs": "\t",
    "dots": ".", "commas": ",", "parens": "(", "closers": ")", "brackets": "[", "braces": "{", "equals": "=",
    "dashes": "-", "minus_signs": "−", "percent": "%", "slashes": "/", "carets": "^", "stars": "*", "tildes": "~",
    "pipes": "|", "backslashes": "\\", "superscripts": "²", "circled": "①", "fullwidth": "１", "dollars": "$",
}
REPEATS = {  # a short unit repeated
    "think_open": "<think>", "think_close": "</think>", "boxed_open": "\\boxed{", "fbox_open": "\\fbox{",
    "frac_open": "\\frac{", "sqrt_open": "\\sqrt{", "sqrt_index": "\\sqrt[", "tool_call": "<tool_call>",
    "tool_response": "<tool_response>", "im_end": "<|im_end|>", "json_open": '{"a": ', "digit_comma": "1,",
    "digit_dot": "1.", "digit_space": "1 ", "digit_slash": "1/", "digit_caret": "1^", "digit_letter": "1a",
    "digit_cjk": "1中", "percent_numbers": "5% ", "or_words": "or ", "not_words": "not ", "strike": "~~",
    "ellipsis": "...", "ranges": "1-", "equals_chain": "1=", "scale_words": "1 million ", "grouped": "1 000 ",
    "latex_thousands": "1{,}", "latex_percent": "\\%", "times": "\\times", "minus_words": "minus ",
    "plus_minus": "±", "boxed_numbers": "\\boxed{1} ",
}
BETWEEN = {  # two numbers separated by a long gap of one kind
    "letter_gap": "a", "cjk_gap": "中", "space_gap": " ", "word_gap": "ab ", "cjk_word_gap": "公里",
    "slash_gap": "a/", "unit_digit_gap": "km2 ", "is_gap": "is ", "or_gap": "or, ", "paren_gap": "( ",
}


def _inputs() -> dict[str, str]:
    cases = {f"run:{name}": _fill(unit) for name, unit in RUNS.items()}
    cases.update({f"repeat:{name}": _fill(unit) for name, unit in REPEATS.items()})
    cases.update({f"between:{name}": _between(unit) for name, unit in BETWEEN.items()})
    cases["boxes_then_text"] = "\\boxed{" * 64 + _fill("a", SIZE - 64 * 7)
    cases["think_then_text"] = "<think>" * 100 + _fill("a", SIZE - 700)
    return cases


INPUTS = _inputs()
CALLS = {
    "verify": lambda text: verify(text, [42, "20.5"], question=text),
    "verify_final_answer": lambda text: verify(final_answer_text(text), [42]),
    "tool_result": lambda text: verify("42", [42], tool_results=[text, '{"result": "%s"}' % text[:5000]]),
    "view_completion": view_completion,
    "find_numbers": find_numbers,
    "extract_numbers": extract_numbers,
    "parse_number": parse_number,
    "normalize_number_text": normalize_number_text,
    "observation_result": observation_result,
}


def _best_of_three(call, text: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        call(text)
        best = min(best, time.perf_counter() - start)
        if best < LIMIT_S:
            break
    return best


def test_the_inputs_are_degenerate_and_full_size():
    assert len(INPUTS) >= 60 and all(len(text) == SIZE for text in INPUTS.values())


@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_every_degenerate_input_is_read_in_bounded_time(call_name):
    call = CALLS[call_name]
    slow = {name: round(seconds * 1000, 1) for name, text in INPUTS.items()
            if (seconds := _best_of_three(call, text)) >= LIMIT_S}
    assert not slow, f"{call_name}: over {LIMIT_S * 1000:.0f} ms (ms per input): {slow}"
