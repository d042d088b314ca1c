"""Malformed task rows: a specific error naming file, line and field; or skipped and reported."""

import json

import pytest

from minimind_trl.data import splits
from minimind_trl.data.cli import main as data_main
from minimind_trl.data.splits import prepare_splits
from minimind_trl.fsio import DataFormatError

TOOLS = json.dumps([{"type": "function", "function": {"name": "calculate_math", "parameters": {}}}])


def good(question="What is 2 + 3?", gt=("5",)):
    return {"conversations": [{"role": "system", "content": "Use tools.", "tools": TOOLS},
                              {"role": "user", "content": question},
                              {"role": "assistant", "content": ""}], "gt": list(gt)}


def broken(edit):
    row = good("What is 9 * 9?", ["81"])
    edit(row)
    return json.dumps(row)


def _set(path, value):
    def edit(row):
        target = row
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


# (raw line, field named in the error)
CASES = {
    "bad_json": ('{"conversations": [', "<json>"),
    "not_an_object": ("[1, 2, 3]", "<row>"),
    "missing_conversations": (json.dumps({"gt": ["1"]}), "conversations"),
    "conversations_not_list": (broken(_set(["conversations"], "hi")), "conversations"),
    "missing_gt": (broken(lambda row: row.pop("gt")), "gt"),
    "gt_not_list": (broken(_set(["gt"], "81")), "gt"),
    "gt_empty": (broken(_set(["gt"], [])), "gt"),
    "gt_bad_value": (broken(_set(["gt"], ["81", None])), "gt[1]"),
    "tools_not_json": (broken(_set(["conversations", 0, "tools"], "[{'name': 'calc'}")), "conversations[0].tools"),
    "tools_missing": (broken(lambda row: row["conversations"][0].pop("tools")), "conversations[0].tools"),
    "tool_without_name": (broken(_set(["conversations", 0, "tools"], '[{"type": "function"}]')),
                          "conversations[0].tools[0]"),
    "unknown_role": (broken(_set(["conversations", 1, "role"], "robot")), "conversations[1].role"),
    "roles_out_of_order": (broken(lambda row: row["conversations"].insert(1, {"role": "assistant", "content": "hi"})),
                           "conversations[1].role"),
    "system_not_first": (broken(lambda row: row["conversations"].append({"role": "system", "content": "x"})),
                         "conversations[3].role"),
    "answered_prompt": (broken(_set(["conversations", 2, "content"], "81")), "conversations[2].role"),
    "content_not_string": (broken(_set(["conversations", 1, "content"], 81)), "conversations[1].content"),
    "id_not_string": (broken(_set(["id"], 7)), "id"),
    "meta_n_gt_wrong": (broken(_set(["meta"], {"n_gt": 2})), "meta.n_gt"),
    "meta_op_type_unknown": (broken(_set(["meta"], {"op_type": "calculus"})), "meta.op_type"),
}


def write_file(tmp_path, bad_line: str) -> str:
    path = tmp_path / "tasks.jsonl"
    lines = [json.dumps(good()), "", json.dumps(good("What is 4 - 1?", ["3"])), bad_line,
             json.dumps(good("7 + 7?", ["14"]))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_malformed_row_names_file_line_and_field(kind, tmp_path):
    line, field = CASES[kind]
    path = write_file(tmp_path, line)
    with pytest.raises(DataFormatError) as info:
        prepare_splits([path], tmp_path / "out", seed=0)
    error = info.value
    assert (error.path, error.line, error.field) == (path, 4, field)
    assert str(error).startswith(f"{path}:4: field '{field}': ")
    assert not (tmp_path / "out").exists(), "nothing is written when the input is bad"


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    path = write_file(tmp_path, CASES["tools_not_json"][0])
    status = data_main(["prepare", "--input", path, "--output-dir", str(tmp_path / "out"), "--seed", "1"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"minimind-trl data: error: {path}:4: field 'conversations[0].tools': not valid JSON")


def test_skip_invalid_drops_rows_and_reports_them(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [json.dumps(good(f"What is {i} + 1?", [str(i + 1)])) for i in range(30)]
    rows[3], rows[10], rows[20] = CASES["bad_json"][0], CASES["gt_not_list"][0], CASES["unknown_role"][0]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    manifest = prepare_splits([str(path)], tmp_path / "out", seed=0, skip_invalid=True, sizes=[20, 3, 4])
    assert manifest["rows"]["invalid_skipped"] == 3 and manifest["rows"]["after_dedup"] == 27
    assert [(r["line"], r["field"]) for r in manifest["invalid_rows"]] == [
        (4, "<json>"), (11, "gt"), (21, "conversations[1].role")]
    assert all(r["file"] == str(path) and r["reason"] for r in manifest["invalid_rows"])
    assert manifest["inputs"][0]["rows_read"] == 30 and manifest["inputs"][0]["rows_valid"] == 27


def test_duplicate_id_for_a_different_question_is_an_error_or_skipped(tmp_path):
    first, second = good("What is 1 + 1?", ["2"]), good("What is 2 + 2?", ["4"])
    first["id"] = second["id"] = "same"
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"ids.jsonl:2: field 'id': 'same' is already used .*ids.jsonl:1"):
        prepare_splits([str(path)], tmp_path / "out", seed=0)
    manifest = prepare_splits([str(path)], tmp_path / "out", seed=0, skip_invalid=True, sizes=[1, 0, 0])
    assert [(r["line"], r["field"]) for r in manifest["invalid_rows"]] == [(2, "id")]


def test_a_failed_prepare_leaves_no_folder_behind(tmp_path, monkeypatch):
    path = write_file(tmp_path, json.dumps(good("9 - 1?", ["8"])))

    def broken_writer(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(splits, "write_json_atomic", broken_writer)
    with pytest.raises(OSError, match="disk full"):
        prepare_splits([path], tmp_path / "out", seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]  # no output, no staging folder
