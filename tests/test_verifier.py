"""GT verifier: number reading, matching rules, final-answer extraction (hand-worked cases)."""

import pytest

from minimind_trl.rewards import extract_numbers, final_answer_text, verify
from minimind_trl.rewards.numbers import parse_number


@pytest.mark.parametrize("text, numbers", [
    ("2932", [2932]), ("1,000", [1000]), ("1,000,000", [1_000_000]), ("1000.0", [1000]),
    ("1e3", [1000]), ("2.5E-4", [0.00025]), ("１０００", [1000]), ("1.5×10^3", [1500]),
    ("1.5 x 10^3", [1500]), ("1.5×10³", [1500]), ("10³", [1000]), ("2^10", [1024]),
    ("25%", [25]), ("3/4", [0.75]), ("2.5万", [25000]), ("3亿", [300_000_000]),
    ("1万亿", [10**12]), ("5千米", [5]), ("1,2", [1, 2]), ("1,0000", [1, 0]), ("3-2", [3, 2]),
    ("x = -5", [-5]), ("温度−5度", [-5]), ("(+3)", [3]), (".5", [0.5]), ("v2 x3", []),
    ("2025/03/07", [2025]), ("5km and 20.5kg", [5, 20.5]), ("答案是12.", [12]),
    ("共计20,758,280元。", [20758280]), ("5 m²", [5]), ("1/0", []), ("1.5/2", [0.75]),
])
def test_extract_numbers(text, numbers):
    assert extract_numbers(text) == pytest.approx(numbers)


def hit(answer, gt_value) -> bool:
    return verify(answer, [gt_value]).success


@pytest.mark.parametrize("answer, gt_value", [
    ("The answer is 2932", 9), ("9", 2932), ("29320", 2932), ("-5", 5), ("3/4", 3),
    ("3/4", 4), ("2.5%", 0.25), ("3.1", 3.14159), ("3", 3.14159), ("20.54", "20.5"),
    ("0.00", 0.004), ("20758281", "20758280"), ("1千", 1000), ("", 0), ("no number", 1),
])
def test_misses(answer, gt_value):
    assert not hit(answer, gt_value)


@pytest.mark.parametrize("answer, gt_value", [
    ("1,000", 1000), ("1000.0", 1000), ("1e3", 1000), ("１０００", 1000), ("1.0×10^3", 1000),
    ("答案是1000。", "1000"), ("1000", 1000.0), ("1000", "1,000"),
    ("20758280", "20758280"), ("共 20,758,280 人", 20758280), ("20.50", "20.5"),
    ("25%", 0.25), ("25%", 25), ("25%", "25%"), ("0.25", "25%"), ("25", "25%"),
    ("33.33%", 1 / 3), ("3/4", 0.75), ("2/3", "0.6667"), ("2/3", 2 / 3),
    ("3.14", 3.14159), ("0.67", "0.6667"), ("0.666667", "0.6667"), ("0.3", 0.1 + 0.2),
    ("−5", -5), ("2.5万", 25000), ("0", 0), ("the translation is Hello World.", "hello world"),
])
def test_hits(answer, gt_value):
    assert hit(answer, gt_value)


def test_three_gt_values_need_all_three():
    gt = [59, "20.5", 7]
    full = verify("Results: 59, 20.5 and 7.", gt)
    assert full.success and full.all_gt_covered and full.gt_hits == [True, True, True]
    assert full.gt_coverage == 1.0
    partial = verify("Results: 59 and 20.5.", gt)
    assert not partial.success and not partial.all_gt_covered
    assert partial.gt_hits == [True, True, False]
    assert partial.gt_coverage == pytest.approx(2 / 3)
    none = verify("I do not know.", gt)
    assert none.gt_coverage == 0.0 and none.numbers == []


def test_number_spam_matches_nothing():
    spam = " ".join(str(i) for i in range(1, 40))
    result = verify(spam, [7])
    assert result.too_many_numbers and result.gt_hits == [False] and not result.success
    assert verify(spam, [7], max_numbers=100).success


def test_empty_gt_is_never_success():
    result = verify("42", [])
    assert not result.success and result.gt_coverage == 0.0 and result.gt_hits == []


def test_tool_backed():
    assert verify("It is 2932.", [2932], ['{"result": "2932"}']).tool_backed
    assert verify("It is 2932.", [2932], ['{"result": "2,932.0"}']).tool_backed
    assert not verify("It is 2932.", [2932], ['{"result": "29320"}']).tool_backed
    assert not verify("It is 2932.", [2932], ['{"error": "2932 failed"}']).tool_backed
    assert not verify("It is 2932.", [2932], ["{'error': 'Tool x not found.'}"]).tool_backed
    assert not verify("It is 2932.", [2932], ["2932"]).tool_backed  # not an observation
    backed_but_wrong = verify("It is 5.", [2932], ['{"result": "2932"}'])
    assert backed_but_wrong.tool_backed and not backed_but_wrong.success


def test_parse_number_whole_string_only():
    assert parse_number(" 20.5 ").value == parse_number("20.50").value
    assert parse_number("20.5 kg") is None
    assert parse_number("25%").percent


RENDERED = (
    "<think>\n\n</think>\n\n"
    '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "12*3"}}\n</tool_call>'
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"result\": \"36\"}\n</tool_response>"
    "<|im_end|>\n<|im_start|>assistant\n<think>\nreason 9\n</think>\n\n答案是36。<|im_end|>"
)


@pytest.mark.parametrize("text, answer", [
    (RENDERED, "答案是36。"),
    ('x</tool_call>\nuser\n<tool_response>\n{"result": "36"}\n</tool_response>\nassistant\n'
     "The answer is 36.", "The answer is 36."),
    ("reasoning 99</think>\n\nAnswer 5", "Answer 5"),
    ("Answer 5 <think> truncated 99", "Answer 5"),
    ('Answer 5\n<tool_call>\n{"name": "calculate_math"', "Answer 5"),
    ('<tool_call>\n{"name": "a"}\n</tool_call>', ""),
    ("Plain answer 7<|im_end|>", "Plain answer 7"),
    ('<tool_response>\n{"result": "1"}\n</tool_response>\nfinal 2\n<tool_response>\n{"res',
     "final 2"),
])
def test_final_answer_text(text, answer):
    assert final_answer_text(text) == answer


def test_final_answer_ignores_numbers_in_reasoning_and_observations():
    answer = final_answer_text(RENDERED)
    assert verify(answer, [36]).success
    assert not verify(answer, [9]).success and not verify(answer, [12]).success
