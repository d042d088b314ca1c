"""GT verifier: number reading, matching rules, final-answer extraction (hand-worked cases)."""

import numpy as np
import pytest

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.rewards import extract_numbers, final_answer_text, verify
from minimind_trl.rewards.numbers import parse_number


@pytest.mark.parametrize("text, numbers", [
    ("2932", [2932]), ("1,000", [1000]), ("1,000,000", [1_000_000]), ("1000.0", [1000]),
    ("1e3", [1000]), ("2.5E-4", [0.00025]), ("１０００", [1000]), ("1.5×10^3", [1500]),
    ("1.5 x 10^3", [1500]), ("1.5×10³", [1500]), ("10³", [1000]), ("2^10", [1024]),
    ("25%", [25]), ("3/4", [0.75]), ("2.5万", [25000]), ("3亿", [300_000_000]),
    ("1万亿", [10**12]), ("5千米", [5]), ("1,2", [1.2]), ("1,2,3", [1, 2, 3]), ("1,0000", [1]), ("3-2", [3, 2]),
    ("x = -5", [-5]), ("温度−5度", [-5]), ("(+3)", [3]), (".5", [0.5]), ("v2 x3", []),
    ("2025/03/07", []), ("5km and 20.5kg", [5, 20.5]), ("答案是12.", [12]),
    ("共计20,758,280元。", [20758280]), ("5 m²", [5]), ("1/0", []), ("1.5/2", [0.75]),
])
def test_extract_numbers(text, numbers):
    assert extract_numbers(text) == pytest.approx(numbers)


def hit(answer, gt_value) -> bool:
    return verify(answer, [gt_value]).success


@pytest.mark.parametrize("answer, gt_value", [
    ("The answer is 2932", 9), ("9", 2932), ("29320", 2932), ("-5", 5), ("3/4", 3),
    ("3/4", 4), ("2.5%", 0.25), ("25%", 25), ("0.25%", 0.25), ("3.1", 3.14159), ("3", 3.14159), ("20.54", "20.5"),
    ("0.00", 0.004), ("20758281", "20758280"), ("1千", 1000), ("", 0), ("no number", 1),
])
def test_misses(answer, gt_value):
    assert not hit(answer, gt_value)


@pytest.mark.parametrize("answer, gt_value", [
    ("1,000", 1000), ("1000.0", 1000), ("1e3", 1000), ("１０００", 1000), ("1.0×10^3", 1000),
    ("答案是1000。", "1000"), ("1000", 1000.0), ("1000", "1,000"),
    ("20758280", "20758280"), ("共 20,758,280 人", 20758280), ("20.50", "20.5"),
    ("25%", 0.25), ("25%", "25%"), ("0.25", "25%"), ("25", "25%"),
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
    assert not verify(spam, [7], max_numbers=100).success  # under the bound, still a hedging list
    prose = " ".join(f"Box {i} holds {i} apples." for i in range(1, 20))  # 38 numbers, 18 extras
    assert not verify(prose, [7]).success and not verify(prose, [7], max_numbers=100).success


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


# --------------------------------------------------------------------------------------------
# Hedges, negations, whole-word text GTs, zero, LaTeX (issues 17.6 and 16.7)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    "40 41 42 43", "42 or 43", "It is 42 or 43.", "42, or maybe 43", "Either 42 or 43.", "42 或 43",
    "答案是42还是43", "Maybe 40, maybe 42", " ".join(str(i) for i in range(31, 55)),  # 24 numbers
    "40, 41, 42 and 43", "40 41 42 43. The answer is 42.",
])
def test_hedges_get_no_credit(answer):
    assert not hit(answer, 42)


@pytest.mark.parametrize("answer", ["not 42", "It is not 42; it is 43.", "The answer isn't 42.",
                                    "It is not equal to 42.", "It cannot be 42.", "x ≠ 42", "答案不是42。",
                                    "The result is 42? No: 43 rather than 42."])
def test_negated_values_get_no_credit(answer):
    assert not hit(answer, 42)


@pytest.mark.parametrize("answer, gt", [
    ("The answer is 42, not 43.", [42]), ("42 (not 43)", [42]), ("42 or 42.0", [42]),
    ("25% or 0.25", [0.25]), ("Results: 59 and 20.5.", [59, "20.5"]), ("42 42 42", [42]),
    ("12 + 30 = 42; 42 * 2 = 84. The final answer is 84.", [42, 84]),
    ("Not sure, but it is 42.", [42]),
])
def test_ordinary_answers_keep_their_credit(answer, gt):
    assert verify(answer, gt).success


def test_one_wrong_value_in_a_plain_list_keeps_the_other_credit():
    # the bound: one value matching no GT in a plain (not "or") list is not a hedge
    assert verify("59 and 21", [59, "20.5"]).gt_hits == [True, False]
    assert verify("59 or 21", [59, "20.5"]).gt_hits == [False, False]
    assert verify("59, 21 and 22", [59, "20.5"]).gt_hits == [False, False]


@pytest.mark.parametrize("answer, gt, expected", [
    ("hello worldwide", "Hello World", False), ("Hello World!", "Hello World", True),
    ("(hello   world)", "Hello World", True), ("sayhello world", "Hello World", False),
    ("Catalog", "cat", False), ("a cat.", "cat", True), ("答案是北京。", "北京", True),
    ("It is not Paris.", "Paris", False),
])
def test_text_gt_matches_whole_words(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("answer, gt, expected", [
    ("1e-30", 0.0, False), ("1e-30", 0, False), ("2e-12", 1e-12, False), ("0", 0.0, True),
    ("0.0", 0, True), ("-0", 0.0, True), ("0/5", 0, False), ("1e-12", 1e-12, True),
])
def test_zero_and_tiny_values_are_not_met_by_accident(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("text, numbers", [
    ("The answer is 3/4.", [0.75]), ("3/4, then 1/2.", [0.75, 0.5]), (r"\frac{3}{4}", [0.75]),
    (r"\dfrac{1.5}{2}", [0.75]), (r"$-\tfrac{3}{4}$", [-0.75]), (r"x\frac{3}{4}", [0.75]),
    (r"\frac{x+1}{2}", []), (r"\frac{3}{4.5}", []), (r"\sqrt{16}", [4]), (r"\sqrt[3]{27}", [3]),
    (r"\sqrt{2}", [2 ** 0.5]), (r"2\sqrt{2}", [2 * 2 ** 0.5]), (r"\sqrt{-4}", []),
    (r"\frac{\sqrt{2}}{2}", []), (r"\boxed{42}", [42]), (r"is \boxed{\frac{3}{4}}.", [0.75]),
    (r"\boxed{1,000}", [1000]), (r"25\%", [25]), (r"1.5 \times 10^{3}", [1500]),
])
def test_extract_numbers_fractions_and_latex(text, numbers):
    assert extract_numbers(text) == pytest.approx(numbers)


@pytest.mark.parametrize("answer, gt, expected", [
    ("The answer is 3/4.", 0.75, True), ("The answer is 3/4.", 3, False), (r"\frac{3}{4}", 0.75, True),
    (r"\frac{3}{4}", 3, False), (r"\frac{3}{4}", 4, False), (r"\dfrac{2}{3}", "0.6667", True),
    (r"\sqrt{16}", 4, False), (r"\sqrt{16}", 16, False), (r"\sqrt{2}", "1.414", False),
    (r"\sqrt{2}", 2, False), (r"The answer is $\boxed{42}$.", 42, True), (r"\boxed{\frac{1}{4}}", "25%", True),
    (r"\frac{x+1}{2}", 2, False), (r"\frac{x+1}{2}", 1, False), (r"\boxed{420}", 42, False),
])
def test_latex_answers(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("text, answer", [
    # after a tool turn the generation prompt closes an empty think block; the model then opens
    # one it never closes: no answer (training's parsed content reads the same, see test_rewards)
    ('<tool_response>\n{"result": "42"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
     "<think>\n\n</think>\n\n<think>\nso 42", ""),
    ("<think>\n\n</think>\n\nThe answer is 42.", "The answer is 42."),
    ("<think>\nsteps 7\n</think>\n\n42 <think> again 9", "42"),
])
def test_one_think_stripping_rule(text, answer):
    assert final_answer_text(text) == answer


# --------------------------------------------------------------------------------------------
# Issue 28.1: one answer per GT slot whatever separates the candidates; chains, negation,
# bounds, operands, dashes, percent, locale forms, times and dates, JSON echoes, symmetry
# --------------------------------------------------------------------------------------------

GUESSES = list(range(30, 54))  # 24 candidates around GT 42


@pytest.mark.parametrize("separator", [
    ". ", "\n", "\n- ", "\n* ", "\n• ", " | ", "; ", ", ", " / ", " then ", "\n\n", ", also ", "。", "、",
])
def test_many_candidates_get_no_credit_whatever_separates_them(separator):
    assert not hit("Answer: " + separator.join(map(str, GUESSES)), 42)
    assert not hit("Answer: " + separator.join(map(str, (41, 42, 43))), 42)


@pytest.mark.parametrize("answer", [
    "1. 40\n2. 41\n3. 42", "Step 1: 40\nStep 2: 41\nStep 3: 42", r"\boxed{40} \boxed{41} \boxed{42}",
    "- 40\n- 41\n- 42", "(1) 40 (2) 41 (3) 42", "The answer is 42. Or 41. Or 40.", "第1题:40;第2题:41;第3题:42",
])
def test_labelled_lists_are_hedges(answer):
    assert not hit(answer, 42)


def test_hedge_property_random_lists_and_separators():
    """Seeded generator: a GT hidden among >= 2 other distinct values, any separator, gets no
    credit; the same answer with only the GT value keeps it (so the check can fail)."""
    rng = np.random.default_rng(0)
    separators = [" ", ", ", ". ", "; ", "\n", "\n- ", "\n* ", " | ", " and ", " or ", "、", "。", " / ",
                  "\n\n", " -> ", ", then ", "\t", " & ", " vs ", "? "]
    openers = ["Answer: ", "The answer is ", "答案:", "", "Results:\n"]
    for _ in range(400):
        gt = int(rng.integers(-500, 5000))
        others = [v for v in rng.choice(np.arange(-600, 6000), size=30, replace=False).tolist() if v != gt]
        values = [gt, *others[: int(rng.integers(2, 12))]]
        rng.shuffle(values)
        answer = str(rng.choice(openers)) + str(rng.choice(separators)).join(map(str, values))
        assert not hit(answer, gt), answer
        assert hit(str(rng.choice(openers)) + str(gt) + ".", gt)


@pytest.mark.parametrize("answer, gt, expected", [
    ("30+1=31, 32+1=33", 30, False), ("30+1=31, 32+1=33", 32, False), ("30+1=31, 32+1=33", 31, True),
    ("30+1=31, 32+1=33", 33, True), ("43 + 35 = 78.", 43, False), ("42 = 40 + 2", 42, True),
    ("42 = 40 + 2", 40, False), ("5 km = 5000 m", 5000, True), ("5 km = 5000 m", 5, False),
    ("74 - 95 = -21", -21, True), ("74 - 95 = -21", 95, False), ("43 + 35 is 78", 78, True),
    ("40 + 2", 42, False), ("40 - 41 - 42", 42, False),
])
def test_equation_chains_credit_only_the_result(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("answer", [
    "42 is wrong; the answer is 41.", "42 is incorrect, it is 41.", "42 is not the answer: 41.", "42 不对,是41。",
])
def test_negation_after_the_number(answer):
    assert not hit(answer, 42)
    assert hit(answer, 41)


@pytest.mark.parametrize("answer", [
    "between 42 and 45", "at least 42", "more than 42", "42 or more", "42 to 45", "from 42 to 45", "42-45",
    "42~45", "至少42", "超过42", "42以上", "less than 42", "up to 42", "> 42", "≥ 42",
])
def test_bounds_and_ranges_get_no_credit(answer):
    assert not hit(answer, 42)


@pytest.mark.parametrize("answer, gt, expected", [
    ("√1764", 1764, False), ("sqrt(1764)", 1764, False), ("sqrt(1764) = 42", 42, True),
    ("sqrt(1764) = 42", 1764, False), ("5!", 5, False), ("5! = 120", 120, True), ("5! = 120", 5, False),
    ("10 squared", 10, False), ("log(100) = 2", 100, False), ("log(100) = 2", 2, True),
])
def test_an_operand_is_not_its_functions_value(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("dash", list("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d"))
def test_dash_like_signs_are_minus(dash):
    assert not hit(f"x = {dash}42", 42)
    assert hit(f"x = {dash}42", -42)


@pytest.mark.parametrize("answer, gt, expected", [
    ("0.25%", 0.25, False), ("25%", 25, False), ("25%", 0.25, True), ("25 percent", 0.25, True),
    ("25 per cent", "25%", True), ("百分之25", 0.25, True), ("25", "25%", True), ("0.25", "25%", True),
    ("42,5", 42, False), ("42,5", 42.5, True), ("1.234,5", 1234.5, True), ("1,5 kg", 1, False),
    ("2:42", 42, False), ("at 14:05:42", 42, False), ("2025-03-07", 7, False), ("07/03/2025", 7, False),
    ("2025年3月7日", 7, False), ("3٫5", 3, False), ("3٫5", 3.5, True), ("1٬000", 1000, True), ("٤٢", 42, True),
    ('{"name": "calculate_math", "arguments": {"expression": "40+2", "value": 42}}', 42, False),
    ('I called {"result": "42"}', 42, False),
])
def test_percent_locale_times_dates_and_json(answer, gt, expected):
    assert hit(answer, gt) is expected


@pytest.mark.parametrize("answer, gt", [
    ("1 000 000", 1_000_000), ("1\u2009000\u2009000", 1_000_000), ("1\u202f000", 1000), ("1\u00a0000", 1000),
    ("1'000", 1000), ("1\u2019000", 1000), (r"$1{,}000$", 1000), (r"$1\,000$", 1000), ("10,00,000", 1_000_000),
    ("1.234.567", 1_234_567), ("1.5 million", 1_500_000), ("2 billion", 2_000_000_000), ("3 thousand", 3000),
    ("1.5k", 1500), ("25 percent", "25%"), ("1/3", 0.33), ("0.33", 1 / 3), ("1/3", "0.33"),
    ("The answer is 42. <think>let me check</think>", 42), ("<think>a</think>The answer is 42.<think>b</think>", 42),
    ("答案是12，5。", 12),
])
def test_correct_answers_written_as_users_write_them(answer, gt):
    assert verify(final_answer_text(answer), [gt]).success


def test_gold_answers_of_every_generated_stratum_verify(registry):
    """Every final answer the SFT data teaches (all operation types, 1-3 GT values, both
    languages) gets full credit: the rules never refuse the project's own answer format."""
    tasks = generate_tasks(240, seed=7, registry=registry)
    for task in tasks:
        answer = gold_trajectory(task, registry)["conversations"][-1]["content"]
        result = verify(final_answer_text(answer), task["gt"])
        assert result.success, (answer, task["gt"], result.gt_hits)


# --------------------------------------------------------------------------------------------
# Issue 40.2: restatements state nothing, any alternative bars its values, locale and unit
# forms, percentage questions, enumerators, one GT slot per mention
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer, gt", [
    ("12^4", 20736), ("The answer is 12^4.", 20736), ("12²", 144), ("12**4", 20736), ("12 to the power of 4", 20736),
    ("84/2", 42), (r"\frac{84}{2}", 42), (r"\dfrac{6}{8}", 0.75), ("6/8", 0.75), ("1.5/2", 0.75),
    (r"\sqrt{1764}", 42), ("√1764", 42), ("∛27", 3), (r"\sqrt[3]{27}", 3), (r"2\sqrt{2}", "2.828"),
    ("50/(100/20)", 10), ("x = 2^10", 1024), (r"\boxed{12^4}", 20736), ("答案是 12^4。", 20736),
])
def test_an_unevaluated_power_root_or_quotient_states_no_value(answer, gt):
    assert not hit(answer, gt)


@pytest.mark.parametrize("answer, gt", [
    ("3/4", 0.75), (r"\frac{3}{4}", 0.75), ("-7/2", -3.5), ("12^4 = 20736", 20736), ("20736 = 12^4", 20736),
    (r"\sqrt{1764} = 42", 42), ("84/2 = 42", 42), ("1.5×10^3", 1500), ("1e3", 1000), ("12² = 144", 144),
])
def test_a_lowest_terms_fraction_and_an_evaluated_expression_state_their_value(answer, gt):
    assert hit(answer, gt)


@pytest.mark.parametrize("answer", [
    "42 (or 41)", "42, alternatively 41", "42 or else 41", "42 | 41", "42 vs 41", "42 vs. 41", "42. Or 41.",
    "42(或41)", "42 oder 41", "42 ou 41", r"\boxed{41} \boxed{42}", r"\boxed{42} or \boxed{41}", "42 — actually 41",
    "42, I mean 41", "42 (maybe 41)", "42。或者41。", "42 要么 41",
])
def test_a_second_value_offered_as_an_alternative_bars_both(answer):
    assert not hit(answer, 42) and not hit(answer, 41)


@pytest.mark.parametrize("answer", ["42±1", "42 ± 1", "42 plus or minus 1", "[42, 45]", "(42, 45)", "[42, 45)",
                                    "42...45", "42..45", "42…45", "42 ≤ x ≤ 45", "42 < x < 45"])
def test_ranges_and_bounds_in_any_notation_get_no_credit(answer):
    assert not hit(answer, 42)


@pytest.mark.parametrize("answer", ["42 (wrong)", "42 (incorrect)", "42 [wrong]", "42 ✗", "wrong: 42",
                                    "Wrong answer: 42", "错误:42", "42(错)"])
def test_a_negation_after_or_before_the_number_bars_it(answer):
    assert not hit(answer, 42)


@pytest.mark.parametrize("answer", ["~~42~~ 41", "<del>42</del> 41", "<s>42</s> 41", r"\sout{42} 41"])
def test_a_struck_value_is_barred_and_the_correction_keeps_its_credit(answer):
    assert not hit(answer, 42)
    assert hit(answer, 41)


@pytest.mark.parametrize("answer, gt", [
    ("[59, 20.5]", [59, "20.5"]), (r"\boxed{59} and \boxed{20.5}", [59, "20.5"]), ("42 or 42.0", [42]),
    ("(59, 20.5)", [59, "20.5"]), ("| part | value |\n| 1 | 59 |\n| 2 | 20.5 |", [59, "20.5"]),
])
def test_lists_of_gt_values_are_not_alternatives(answer, gt):
    assert verify(answer, gt).success


@pytest.mark.parametrize("text, numbers", [
    ("0,186", [0.186]), ("0,125", [0.125]), ("-0,5", [-0.5]), ("0 186", [0, 186]), ("10,186", [10186]),
    ("369.15K", [369.15]), ("1.5k", [1500]), ("5 MILLION", [5_000_000]), ("2 Billion", [2e9]),
    ("3 Thousands", [3000]), ("Result: minus 7", [-7]), ("negative 3.5", [-3.5]), ("负7", [-7]),
    ("①256 ②729", [1, 256, 2, 729]), ("42...45", [42, 45]), ("√1764", [42]), ("∛27", [3]),
])
def test_extract_numbers_issue_40_forms(text, numbers):
    assert extract_numbers(text) == pytest.approx(numbers)


@pytest.mark.parametrize("answer, gt, expected", [
    ("0,186", 0.186, True), ("0,125", 125, False), ("0,125", 0.125, True), ("369.15K", 369.15, True),
    ("369.15K", 369150, False), ("5 MILLION", 5_000_000, True), ("5 MILLION", 5, False),
    ("Result: minus 7", -7, True), ("Result: minus 7", 7, False), ("10 minus 3 = 7", 7, True),
    ("10 minus 3 = 7", -3, False), ("负7", 7, False),
])
def test_decimal_comma_kelvin_scale_words_and_sign_words(answer, gt, expected):
    assert hit(answer, gt) is expected


PERCENT_QUESTION = "What percentage of 80 is 55?"


@pytest.mark.parametrize("question, answer, gt, expected", [
    (PERCENT_QUESTION, "68.75%", 68.75, True), ("", "68.75%", 68.75, False),
    (PERCENT_QUESTION, "68.75", 68.75, True), (PERCENT_QUESTION, "68.75 percent", 68.75, True),
    ("55 is what percent of 80?", "68.75%", 68.75, True), ("55 占 80 的百分之几?", "68.75%", 68.75, True),
    (PERCENT_QUESTION, "0.6875", 68.75, False), (PERCENT_QUESTION, "4200%", 42, False), ("", "4200%", 42, False),
    ("", "150%", 1.5, False), ("", "25%", 0.25, True), ("What is 20% of 50?", "20%", 20, False),
    ("What is 20% of 50?", "10", 10, True), ("", "25%", "25%", True), ("", "4200%", "42%", False),
])
def test_a_percent_sign_reads_by_what_the_task_asks(question, answer, gt, expected):
    assert verify(answer, [gt], question=question).success is expected


@pytest.mark.parametrize("answer, gt", [
    ("12乘以3是36", 36), ("12乘以3为36", 36), ("结果为36", 36), ("5公里等于5000米", 5000),
    ("12 times 3 is 36", 36), ("36 divided by 4 equals 9", 9), ("20% of 50 is 10", 10), ("50的20%是10", 10),
    ("2的10次方是1024", 1024), ("5 m² = 50000 cm²", 50000),
])
def test_restatements_in_words_keep_the_chain(answer, gt):
    assert hit(answer, gt)
    operands = [v for v in extract_numbers(answer) if v != pytest.approx(gt)]
    assert not any(hit(answer, v) for v in operands)


def test_gold_answers_with_unit_tokens_holding_digits_verify():
    # the project's own gold wording (data/gold.py) for square units
    answer = "Here are the answers: (1) 61 km2 = 61000000 m2; (2) 39 km2 = 39000000 m2."
    assert verify(answer, ["61000000", "39000000"]).success
    answer = "各题答案如下:(1) 47 km2 = 47000000 m2;(2) 3 km2 = 300 ha。"
    assert verify(answer, ["47000000", "300"]).success


@pytest.mark.parametrize("answer", ["(1) 256 (2) 729 (3) 64", "①256 ②729 ③64", "1) 256 2) 729 3) 64",
                                    "⑴ 256 ⑵ 729 ⑶ 64"])
def test_enumerators_without_a_separator_are_labels(answer):
    assert verify(answer, [256, 729, 64]).gt_hits == [True, True, True]


def test_a_numbered_line_is_a_label_only_in_sequence():
    assert verify("1. 40\n2. 41\n3. 42", [42]).gt_hits == [False]  # a hedge of three values, as before
    assert verify("42. Or 41.", [41]).gt_hits == [False]  # 42 is a value, not the label of a list


@pytest.mark.parametrize("answer, gt, hits", [
    ("729", [729, 729], [True, False]), ("729 and 729", [729, 729], [True, True]),
    ("729 and 5", [729, 729, 3], [True, False, False]), ("(1) 729 (2) 729 (3) 3", [729, 729, 3], [True, True, True]),
    ("3.14", [3.14159, "3.14"], [True, False]),
])
def test_gt_slots_are_matched_one_to_one(answer, gt, hits):
    assert verify(answer, gt).gt_hits == hits


@pytest.mark.parametrize("answer, gt, expected", [
    (r"The answer is \boxed{42}. (41)", 41, False), (r"The answer is \boxed{42}. (41)", 42, True),
    (r"12 + 30 = \boxed{42}", 42, True), (r"\boxed{42} km, that is 42000 m", 42000, False),
])
def test_boxes_are_the_answer_when_the_answer_boxes_a_value(answer, gt, expected):
    assert hit(answer, gt) is expected
