"""Task generator: deterministic, balanced, and every GT equals both the tool and exact arithmetic."""

import ast
import json
import re
from collections import Counter
from fractions import Fraction

import pytest

from minimind_trl.data.generator import generate_tasks, strata_for
from minimind_trl.data.normalize import canonical_tools_json, normalize_text
from minimind_trl.data.splits import normalize_task_row
from minimind_trl.data.strata import infer_lang, infer_op_type
from minimind_trl.data.templates import CURRENCY_NAMES_ZH
from minimind_trl.data.validation import GenerationError, validate_task_row
from minimind_trl.envs.tools import EXCHANGE_RATES, UNIT_FACTORS, default_registry

PURE_MATH = ("arithmetic", "percentage", "power")


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(340, seed=11, registry=default_registry())


# --- an evaluator written for the test, independent of the tool and of the generator --------------

def frac_eval(node):
    if isinstance(node, ast.Expression):
        return frac_eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Fraction(repr(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -frac_eval(node.operand)
    if isinstance(node, ast.BinOp):
        left, right = frac_eval(node.left), frac_eval(node.right)
        ops = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right, ast.Mult: lambda: left * right,
               ast.Div: lambda: left / right, ast.Pow: lambda: left ** int(right)}
        return ops[type(node.op)]()
    raise AssertionError(f"unexpected node {ast.dump(node)}")


def factor(value: float) -> Fraction:
    small = Fraction(value).limit_denominator(1000)
    return small if abs(float(small) - value) <= 1e-12 * value else Fraction(repr(value))


def temperature(value: Fraction, source: str, target: str) -> Fraction:
    kelvin_offset = Fraction("273.15")
    celsius = {"celsius": value, "kelvin": value - kelvin_offset, "fahrenheit": (value - 32) * Fraction(5, 9)}[source]
    return {"celsius": celsius, "kelvin": celsius + kelvin_offset, "fahrenheit": celsius * Fraction(9, 5) + 32}[target]


def exact_value(call: dict) -> Fraction:
    args = call["arguments"]
    if call["name"] == "calculate_math":
        return frac_eval(ast.parse(args["expression"], mode="eval"))
    if call["name"] == "unit_converter":
        value = Fraction(repr(args["value"]))
        if args["from_unit"] in ("celsius", "kelvin", "fahrenheit"):
            return temperature(value, args["from_unit"], args["to_unit"])
        return value * factor(UNIT_FACTORS[args["from_unit"]][1]) / factor(UNIT_FACTORS[args["to_unit"]][1])
    assert call["name"] == "get_exchange_rate"
    return factor(EXCHANGE_RATES[args["from_currency"]]) / factor(EXCHANGE_RATES[args["to_currency"]])


def four_places(value: Fraction) -> str:
    scaled = round(value * 10**4)
    sign, scaled = ("-" if scaled < 0 else ""), abs(scaled)
    text = f"{scaled // 10**4}.{scaled % 10**4:04d}".rstrip("0").rstrip(".")
    return "0" if text == "0" else sign + text


# --- tests ----------------------------------------------------------------------------------------

def test_same_seed_same_rows_other_seed_other_rows(registry, tasks):
    again = generate_tasks(340, seed=11, registry=registry)
    assert json.dumps(again, ensure_ascii=False) == json.dumps(tasks, ensure_ascii=False)
    assert generate_tasks(40, seed=12, registry=registry) != tasks[:40]


def test_every_gt_equals_the_tool_and_exact_arithmetic(registry, tasks):
    for task in tasks:
        calls = json.loads(task["meta"]["calls"])
        assert len(calls) == len(task["gt"]) == task["meta"]["n_gt"]
        for call, gt in zip(calls, task["gt"]):
            observation = json.loads(registry.call(call["name"], call["arguments"]))
            assert observation == {"result": gt}, (task["id"], call)
            exact = exact_value(call)
            assert four_places(exact) == gt, (task["id"], call, exact)
            if task["meta"]["op_type"] in PURE_MATH:
                assert exact == Fraction(gt), "pure math answers are exact, never rounded"
            else:
                assert abs(Fraction(gt) - exact) <= abs(exact) / 1000


def test_chain_steps_use_the_previous_result(tasks):
    chains = [task for task in tasks if task["meta"]["op_type"] == "chain"]
    assert chains and {task["meta"]["n_gt"] for task in chains} == {2, 3}
    for task in chains:
        calls = json.loads(task["meta"]["calls"])
        for previous, call in zip(task["gt"], calls[1:]):
            assert call["name"] == "calculate_math"
            previous_as_number = rf"(?<![\d.]){re.escape(previous)}(?![\d.])"
            assert re.search(previous_as_number, call["arguments"]["expression"]), (previous, call)


def test_call_operands_appear_in_the_question(tasks):
    for task in tasks:
        if task["meta"]["op_type"] == "chain":
            continue
        question = task["conversations"][1]["content"]
        shown = set(re.findall(r"\d+(?:\.\d+)?", question))
        for call in json.loads(task["meta"]["calls"]):
            args = call["arguments"]
            if call["name"] == "calculate_math":
                implicit = {"1", "100"} | ({"2", "3"} if re.search("squared|cubed|平方|立方", question) else set())
                numbers = set(re.findall(r"\d+(?:\.\d+)?", args["expression"])) - implicit
                assert numbers <= shown, (question, args)
            elif call["name"] == "unit_converter":
                assert str(args["value"]).lstrip("-") in shown
            else:
                for code in (args["from_currency"], args["to_currency"]):
                    assert code in question or CURRENCY_NAMES_ZH[code] in question, (question, args)


def test_strata_balanced_and_heuristics_agree(tasks):
    counts = Counter((task["meta"]["n_gt"], task["meta"]["op_type"]) for task in tasks)
    assert set(counts) == set(strata_for())
    assert max(counts.values()) - min(counts.values()) <= 1
    for task in tasks:
        question = task["conversations"][1]["content"]
        assert infer_op_type(question, task["meta"]["n_gt"]) == task["meta"]["op_type"], question
        assert infer_lang(question) == task["meta"]["lang"]
    assert {task["meta"]["lang"] for task in tasks} == {"zh", "en"}
    assert {task["meta"]["difficulty"] for task in tasks} == {"easy", "medium", "hard"}


def test_rows_are_valid_canonical_and_unique(registry, tasks):
    questions = [task["conversations"][1]["content"] for task in tasks]
    assert len(set(questions)) == len(questions)
    assert len({task["id"] for task in tasks}) == len(tasks)
    distractor_counts = Counter()
    for task in tasks:
        validate_task_row(task)
        normalized = normalize_task_row(task)
        assert normalized["conversations"] == task["conversations"] and normalized["id"] == task["id"]
        assert normalized["gt"] == task["gt"] and all(isinstance(v, str) for v in task["gt"])
        system = task["conversations"][0]
        assert system["tools"] == canonical_tools_json(system["tools"])
        offered = [tool["function"]["name"] for tool in json.loads(system["tools"])]
        needed = {call["name"] for call in json.loads(task["meta"]["calls"])}
        assert needed <= set(offered) and len(offered) == len(set(offered))
        assert json.loads(system["tools"]) == registry.schemas(offered)
        distractor_counts[len(offered) - len(needed)] += 1
        assert task["conversations"][2] == {"role": "assistant", "content": ""}
        assert normalize_text(task["conversations"][1]["content"]) == task["conversations"][1]["content"]
    assert set(distractor_counts) == {0, 1, 2}


def test_an_exhausted_stratum_is_retired_and_others_fill_in(registry):
    # easy English one-rate questions: 10 currency pairs x 5 wordings = at most 50 distinct ones
    rows = generate_tasks(120, seed=3, registry=registry, op_types=("exchange_rate", "arithmetic"),
                          n_gt_values=(1,), difficulties=("easy",), langs=("en",), max_distractors=0)
    kinds = Counter(row["meta"]["op_type"] for row in rows)
    assert len(rows) == 120 and 40 <= kinds["exchange_rate"] <= 50 and kinds["arithmetic"] >= 70
    assert len({row["conversations"][1]["content"] for row in rows}) == 120


def test_exhausted_generator_raises_a_clear_error(registry):
    with pytest.raises(GenerationError, match="ran out of new questions"):
        generate_tasks(80, seed=3, registry=registry, op_types=("exchange_rate",), n_gt_values=(1,),
                       difficulties=("easy",), langs=("en",))
