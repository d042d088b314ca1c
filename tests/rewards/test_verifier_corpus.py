"""Issue 40.2: the labelled verifier corpus and the project's gold answers, measured.

`verifier_corpus.jsonl` (written by scripts/make_verifier_corpus.py; every row labelled with the
credit a careful grader gives per GT value) is re-run here: no false credit in the hedge, range,
negation, restatement and misread classes, at most 2% false refusals of natural correct answers,
and the figures docs/verifier.md states are the measured ones. Every gold answer of every
generated stratum (operation type x GT count x language x difficulty) verifies."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from minimind_trl.data.generator import DIFFICULTIES, LANGS, generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.data.strata import OP_TYPES
from minimind_trl.rewards import final_answer_text, verify

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).with_name("verifier_corpus.jsonl")
DOC = ROOT / "docs" / "verifier.md"
ADVERSARIAL = ("hedge", "range", "negation", "restatement", "misread")
MAX_FALSE_REFUSALS = 0.02
GOLD_PER_CELL = 40
FIGURE_ROW = re.compile(r"^\| (?P<cls>[a-z]+) \| (?P<inputs>\d+) \| (?P<credits>\d+) \| (?P<refusals>\d+) \|$")
GOLD_LINE = re.compile(r"(?P<verified>[\d,]+) of (?P<total>[\d,]+) gold\s+answers\s+verify")


def _rows() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def _measure() -> dict[str, dict[str, int]]:
    """Per class: inputs, false credits (a GT labelled no is hit), false refusals (a GT labelled
    yes is not hit)."""
    figures: dict[str, dict[str, int]] = {}
    for row in _rows():
        hits = verify(final_answer_text(row["answer"]), row["gt"], question=row["question"]).gt_hits
        counts = figures.setdefault(row["class"], {"inputs": 0, "credits": 0, "refusals": 0})
        counts["inputs"] += 1
        counts["credits"] += any(hit and not label for hit, label in zip(hits, row["credit"]))
        counts["refusals"] += any(label and not hit for hit, label in zip(hits, row["credit"]))
    return figures


@pytest.fixture(scope="module")
def figures():
    return _measure()


def test_the_corpus_is_large_labelled_and_reproducible():
    rows = _rows()
    assert len(rows) >= 400
    assert {row["class"] for row in rows} == {"natural", *ADVERSARIAL}
    assert all(len(row["credit"]) == len(row["gt"]) >= 1 for row in rows)
    spec = importlib.util.spec_from_file_location("make_verifier_corpus", ROOT / "scripts" / "make_verifier_corpus.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    assert maker.build_corpus() == rows  # the file is what the script writes


@pytest.mark.parametrize("cls", ADVERSARIAL)
def test_no_false_credit_in_the_adversarial_classes(figures, cls):
    assert figures[cls]["inputs"] >= 20 and figures[cls]["credits"] == 0


def test_natural_answers_are_refused_at_most_two_percent_of_the_time(figures):
    natural = figures["natural"]
    assert natural["inputs"] >= 200
    assert natural["refusals"] <= MAX_FALSE_REFUSALS * natural["inputs"]


def test_the_doc_states_the_measured_figures(figures):
    stated = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if match := FIGURE_ROW.match(line):
            stated[match["cls"]] = {key: int(match[key]) for key in ("inputs", "credits", "refusals")}
    assert stated == figures


def _gold_tasks(registry) -> list[dict]:
    tasks = []
    for op_type in OP_TYPES:
        for lang in LANGS:
            for difficulty in DIFFICULTIES:
                tasks += generate_tasks(GOLD_PER_CELL, seed=40, registry=registry, op_types=(op_type,),
                                        langs=(lang,), difficulties=(difficulty,))
    return tasks


def test_every_gold_answer_of_every_generated_stratum_verifies(registry):
    tasks = _gold_tasks(registry)
    cells = {(t["meta"]["op_type"], t["meta"]["n_gt"], t["meta"]["lang"], t["meta"]["difficulty"]) for t in tasks}
    assert len(cells) == (len(OP_TYPES) * 3 - 1) * len(LANGS) * len(DIFFICULTIES)  # chain has no one-value stratum
    refused = []
    for task in tasks:
        answer = gold_trajectory(task, registry)["conversations"][-1]["content"]
        question = next(turn["content"] for turn in task["conversations"] if turn["role"] == "user")
        if not verify(final_answer_text(answer), task["gt"], question=question).success:
            refused.append((answer, task["gt"]))
    assert not refused
    match = GOLD_LINE.search(DOC.read_text(encoding="utf-8"))
    assert match and int(match["verified"].replace(",", "")) == int(match["total"].replace(",", "")) == len(tasks)
