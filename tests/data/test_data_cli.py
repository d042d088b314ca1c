"""`minimind-trl data ...` end to end, and the shared hash / atomic-write helpers."""

import hashlib
import json
import os

import pytest

from minimind_trl.cli import main as top_main
from minimind_trl.data.cli import main as data_main
from minimind_trl.data.formats import row_task_prompt
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.data.splits import load_splits
from minimind_trl.fsio import sha256_file, write_json_atomic, write_text_atomic


def test_generate_prepare_gold_verify(tmp_path, capsys, registry):
    tasks, sft = tmp_path / "tasks.jsonl", tmp_path / "sft.jsonl"
    assert top_main(["data", "generate", "--num-tasks", "90", "--seed", "4", "--output", str(tasks),
                     "--gold-sft", str(sft)]) == 0
    rows = [json.loads(line) for line in tasks.read_text(encoding="utf-8").splitlines()]
    gold = [json.loads(line) for line in sft.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(gold) == 90 and [g["id"] for g in gold] == [r["id"] for r in rows]

    again = tmp_path / "again.jsonl"
    assert data_main(["generate", "--num-tasks", "90", "--seed", "4", "--output", str(again)]) == 0
    assert sha256_file(again) == sha256_file(tasks)

    out = tmp_path / "splits"
    assert data_main(["prepare", "--input", str(tasks), "--output-dir", str(out), "--seed", "42",
                      "--fractions", "0.8,0.1,0.1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["split_sizes"] == {"train": 72, "val": 9, "test": 9, "unused": 0}
    assert manifest["stratification"]["op_type_inferred_rows"] == 0
    train = [json.loads(line) for line in (out / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    by_id = {row["id"]: row for row in rows}
    for row in train:  # generated rows pass through unchanged, plus the op_type_source mark
        source = by_id[row["id"]]
        assert row["conversations"] == source["conversations"] and row["gt"] == source["gt"]
        assert row["meta"] == {**source["meta"], "op_type_source": "meta"}

    train_sft = tmp_path / "train_sft.jsonl"
    assert data_main(["gold", "--input", str(out / "train.jsonl"), "--output", str(train_sft)]) == 0
    gold_ids = {json.loads(line)["id"] for line in train_sft.read_text(encoding="utf-8").splitlines()}
    assert gold_ids == {r["id"] for r in train}

    loaded = load_splits(out)  # rows read back through datasets still replay and render
    for row in loaded["val"]:
        source = by_id[row["id"]]
        assert gold_trajectory(row, registry) == gold_trajectory(source, registry)
        messages, tools = row_task_prompt(row)
        assert [m["role"] for m in messages] == ["system", "user"]
        assert tools == json.loads(source["conversations"][0]["tools"])

    again_out = tmp_path / "re-prepared"  # preparing prepared rows changes nothing
    assert data_main(["prepare", "--input", str(out / "train.jsonl"), "--output-dir", str(again_out),
                      "--sizes", "72,0,0"]) == 0
    reprepared_lines = (again_out / "train.jsonl").read_text(encoding="utf-8").splitlines()
    reprepared = {json.loads(line)["id"]: json.loads(line) for line in reprepared_lines}
    assert reprepared == {row["id"]: row for row in train}

    assert data_main(["verify", str(out)]) == 0
    (out / "test.jsonl").write_text("tampered\n", encoding="utf-8")
    capsys.readouterr()
    assert data_main(["verify", str(out)]) == 2
    assert "test.jsonl has sha256" in capsys.readouterr().err


def test_prepare_refuses_non_empty_folder_and_missing_input(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    data_main(["generate", "--num-tasks", "20", "--seed", "1", "--output", str(tasks)])
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.jsonl").write_text("{}\n")
    capsys.readouterr()
    assert data_main(["prepare", "--input", str(tasks), "--output-dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert data_main(["prepare", "--input", str(tmp_path / "nope.jsonl"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse usage errors also exit 2
        data_main(["prepare", "--input", str(tasks), "--output-dir", str(tmp_path / "o"), "--sizes", "1,x,2"])
    assert info.value.code == 2


def test_sha256_and_atomic_writes(tmp_path, monkeypatch):
    path = write_json_atomic(tmp_path / "sub" / "m.json", {"b": "中文", "a": [1, 2]})
    assert json.loads(path.read_text(encoding="utf-8")) == {"b": "中文", "a": [1, 2]}
    assert "中文" in path.read_text(encoding="utf-8")
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a normal file's mode, not mkstemp's 0600

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new content")
    assert json.loads(path.read_text(encoding="utf-8")) == {"b": "中文", "a": [1, 2]}  # old file intact
    assert os.listdir(path.parent) == ["m.json"]  # temporary file removed
