"""docs/verifier.md's tables are the verifier's actual answers: every row is re-run here (a
table with a question column verifies each answer with that task question)."""

import json
import re
from pathlib import Path

import pytest

from minimind_trl.rewards import final_answer_text, verify

DOC = Path(__file__).resolve().parents[2] / "docs" / "verifier.md"
ROW = re.compile(r"^\| `(?P<answer>.*)` \| `(?P<gt>\[[^`]*\])` \| (?:`(?P<question>[^`]*)` \| )?"
                 r"(?P<hits>(?:yes|no)(?: (?:yes|no))*) \|$")


def rows():
    found = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            answer = match["answer"].replace("\\n", "\n").replace("\\|", "|")
            found.append((answer, json.loads(match["gt"]), match["question"] or "",
                          [h == "yes" for h in match["hits"].split()]))
    return found


def test_the_doc_has_tables():
    found = rows()
    assert len(found) >= 130 and sum(bool(question) for _, _, question, _ in found) >= 8


@pytest.mark.parametrize("answer, gt, question, hits", rows())
def test_every_row_of_the_doc_is_what_the_verifier_says(answer, gt, question, hits):
    assert verify(final_answer_text(answer), gt, question=question).gt_hits == hits
