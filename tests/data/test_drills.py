"""Number-copy drills (`minimind_trl.data.drills`): format, determinism, copyable numbers."""

import random
import re

import pytest

from minimind_trl.data.drills import OPERATORS, copy_drill, copy_drills


def test_drills_repeat_the_expression_exactly_on_every_line():
    rows = copy_drills(400, seed=3)
    assert rows == copy_drills(400, seed=3) and rows != copy_drills(400, seed=4)
    for i, row in enumerate(rows):
        question, expression, answer = row["text"].split("\n")
        left, op, right = expression.split(" ")
        assert op in OPERATORS and re.fullmatch(r"\d{1,5}", left) and re.fullmatch(r"\d{1,5}", right)
        assert str(int(left)) == left and str(int(right)) == right  # no leading zeros
        if i % 2 == 0:
            assert (question, answer) == (f"计算 {expression} 的值。", f"答案:{expression}。")
        else:
            assert (question, answer) == (f"What is {expression}?", f"The answer: {expression}.")
    lengths = {len(row["text"].split("\n")[1].split(" ")[0]) for row in rows}
    assert lengths == {1, 2, 3, 4, 5}


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="lang"):
        copy_drill(random.Random(0), "fr")
    with pytest.raises(ValueError, match="num_rows"):
        copy_drills(-1, seed=0)
    assert copy_drills(3, seed=0, langs=("en",))[0]["text"].startswith("What is ")
