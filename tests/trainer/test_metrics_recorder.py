"""metrics.jsonl: the trainer pushes its step records into the recorder, with unchanged content.

``tests/golden/grpo_metrics_tiny.json`` holds what the trainer wrote before the recorder moved out
of a callback (issue 14): three scripted tiny runs (dense with a KL term, tiny-moe, gspo), two
steps each. A fresh run must write the same keys in the same order and the same values (timings,
which vary run to run, excepted).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import make_trainer, saved_tiny_model, tiny_model

from minimind_trl.metric_names import (
    GENERATION_TOKENS_PER_SECOND,
    GRPO_RECORD_KEYS,
    STEP,
    TIMING_KEYS,
    UPDATE_TOKENS_PER_SECOND,
    is_record_key,
)
from minimind_trl.trainer.recorder import StepRecorder, read_metrics, truncate_metrics

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "grpo_metrics_tiny.json"
VARYING = {*TIMING_KEYS, UPDATE_TOKENS_PER_SECOND, GENERATION_TOKENS_PER_SECOND}


def run_overrides(name: str, folder: Path) -> dict:
    if name == "dense":
        return {"beta": 0.1, "model": saved_tiny_model(folder / "init")}
    if name == "moe":
        return {"model": tiny_model(moe=True)}
    return {"objective": "gspo"}


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))["runs"]


@pytest.mark.parametrize("name", ["dense", "moe", "gspo"])
def test_metrics_file_keeps_the_keys_order_and_values(tmp_path, golden, name):
    run_dir = tmp_path / name
    trainer = make_trainer(run_dir, max_steps=2, num_iterations=2, **run_overrides(name, tmp_path))
    trainer.train()
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    expected = golden[name]
    assert len(rows) == len(expected) == 2
    for row, before in zip(rows, expected):
        assert list(row) == list(before)  # same keys, same order
        for key, value in before.items():
            if key in VARYING:
                assert (row[key] is None) == (value is None), key
            elif value is None:
                assert row[key] is None, key
            else:
                assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        assert all(is_record_key(key) for key in row), [key for key in row if not is_record_key(key)]
        assert set(GRPO_RECORD_KEYS) <= set(row)
    assert trainer.last_record == rows[-1]  # what was pushed is what was written


def test_no_callback_holds_the_trainer(tmp_path):
    """The trainer feeds the recorder; no callback reaches back into the trainer."""
    trainer = make_trainer(tmp_path, max_steps=1, num_iterations=1)
    for callback in trainer.callback_handler.callbacks:
        assert not any(value is trainer for value in vars(callback).values()), type(callback).__name__
    assert not any(isinstance(callback, StepRecorder) for callback in trainer.callback_handler.callbacks)
    trainer.train()
    assert [row[STEP] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_step_recorder_writes_pushed_records_once(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    recorder = StepRecorder(path)
    assert not path.exists()  # opened on the first record
    assert recorder.record({STEP: 1, "loss": 0.5, "kl": math.nan, "load": [0.25, math.inf]})
    assert not recorder.record({STEP: 1, "loss": 9.0})  # a step is written once
    recorder.close()
    assert recorder.record({STEP: 2, "loss": 0.25})  # reopens for appending
    recorder.close()
    recorder.close()
    assert path.read_text(encoding="utf-8").splitlines() == [
        '{"step":1,"loss":0.5,"kl":null,"load":[0.25,null]}', '{"step":2,"loss":0.25}'
    ]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"step":3,"lo')  # a torn last line from a kill
    assert [row[STEP] for row in read_metrics(path)] == [1, 2]
    assert truncate_metrics(path, 1) == 1
    assert read_metrics(path) == [{"step": 1, "loss": 0.5, "kl": None, "load": [0.25, None]}]
