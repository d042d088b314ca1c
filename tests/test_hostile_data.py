"""Hostile data files (issue 17.4): every command that reads JSONL (`data prepare`, `data gold`,
`eval` on a split folder, `summarize` on eval folders, `train`'s split) answers a malformed input
with one line naming file, line and field and exit 2, never a traceback; `--skip-invalid` counts
each kind in the manifest; a byte-order mark and CRLF line ends are accepted."""

import json
import tracemalloc

import pytest

from minimind_trl.data.cli import main as data_main
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.eval.cli import eval_main, summarize_main
from minimind_trl.eval.errors import EvalError
from minimind_trl.eval.runner import load_split_tasks
from minimind_trl.fsio import MAX_LINE_BYTES, DataFormatError, iter_jsonl_lines, parse_jsonl_line, sha256_file
from minimind_trl.trainer.build import load_split
from minimind_trl.trainer.recipe import RecipeError

TOOLS = json.dumps([{"type": "function", "function": {"name": "calculate_math", "parameters": {}}}])


def good(question="What is 2 + 3?", gt=("5",)):
    return {"conversations": [{"role": "system", "content": "Use tools.", "tools": TOOLS},
                              {"role": "user", "content": question},
                              {"role": "assistant", "content": ""}], "gt": list(gt)}


def _gt_line(raw_gt: str) -> bytes:
    return json.dumps(good("What is 9 * 9?")).replace('"gt": ["5"]', f'"gt": [{raw_gt}]').encode()


def _tools_line(tools: str) -> bytes:
    row = good("What is 9 * 9?")
    row["conversations"][0]["tools"] = tools
    return json.dumps(row).encode()


# name: (raw line, field named, kind counted by --skip-invalid)
HOSTILE = {
    "invalid_utf8": (json.dumps(good("What is 9 * 9?")).encode().replace(b"What", b"Wh\xff"), "<json>", "encoding"),
    "deep_array": (b"[" * 100_000, "<json>", "too_deep"),
    "deep_object": (('{"a":' * 2000 + "1" + "}" * 2000).encode(), "<json>", "too_deep"),
    "deep_tools": (_tools_line("[" * 5000 + "]" * 5000), "conversations[0].tools", "too_deep"),
    "gt_5000_digits": (_gt_line("1" * 5000), "<json>", "number"),
    "gt_4000_digits": (_gt_line("1" * 4000), "gt[0]", "number"),
    "lone_surrogate": (json.dumps(good("What is \ud800 9 * 9?")).encode(), "conversations[1].content", "surrogate"),
    "huge_line": (json.dumps(good("9 * 9? " + "x" * MAX_LINE_BYTES)).encode(), "<json>", "too_long"),
    "wrong_type": (_gt_line('{"value": 81}'), "gt[0]", "schema"),
    "bad_json": (b'{"conversations": [', "<json>", "json"),
}


def write_lines(path, lines: list[bytes]):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err[-2000:]
    return lines[0]


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_prepare_names_file_line_and_field(kind, tmp_path, capsys):
    raw, field, _ = HOSTILE[kind]
    path = write_lines(tmp_path / "tasks.jsonl", [json.dumps(good()).encode(), b"", raw])
    status = data_main(["prepare", "--input", path, "--output-dir", str(tmp_path / "out"), "--sizes", "1,0,0"])
    assert status == 2 and not (tmp_path / "out").exists()
    assert one_error_line(capsys).startswith(f"minimind-trl data: error: {path}:3: field '{field}': ")


def test_skip_invalid_counts_each_kind(tmp_path):
    lines = [json.dumps(good(f"What is {i} + 1?", [str(i + 1)])).encode() for i in range(3)]
    lines += [raw for raw, _, _ in HOSTILE.values()]
    path = write_lines(tmp_path / "mixed.jsonl", lines)
    manifest = prepare_splits([path], tmp_path / "out", seed=0, sizes=[3, 0, 0], skip_invalid=True)
    expected = {kind: 0 for kind in ("encoding", "too_long", "json", "too_deep", "number", "surrogate",
                                     "schema", "duplicate_id")}
    for _, _, kind in HOSTILE.values():
        expected[kind] += 1
    assert manifest["rows"]["invalid_by_kind"] == expected
    assert manifest["rows"]["invalid_skipped"] == len(HOSTILE)
    assert [(r["line"], r["field"], r["kind"]) for r in manifest["invalid_rows"]] == \
        [(4 + i, field, kind) for i, (_, field, kind) in enumerate(HOSTILE.values())]
    assert manifest["inputs"][0]["rows_read"] == 3 + len(HOSTILE)


def test_bom_and_crlf_are_accepted_and_empty_files_refused(tmp_path, capsys):
    rows = [json.dumps(good(f"What is {i} + 1?", [str(i + 1)])) for i in range(4)]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b"\xef\xbb\xbf" + "".join(r + "\r\n" for r in rows).encode())
    prepare_splits([plain], tmp_path / "a", seed=0, sizes=[2, 1, 1])
    prepare_splits([windows], tmp_path / "b", seed=0, sizes=[2, 1, 1])
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    for command in (["prepare", "--input", str(empty), "--output-dir", str(tmp_path / "c")],
                    ["gold", "--input", str(empty), "--output", str(tmp_path / "gold.jsonl")]):
        assert data_main(command) == 2
        assert one_error_line(capsys) == f"minimind-trl data: error: {empty}: no rows (the file is empty or blank)"
    assert not (tmp_path / "gold.jsonl").exists()


def test_a_50_mb_line_is_refused_unread(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as handle:
        handle.write(b'{"text": "' + b"x" * (50 << 20) + b'"}\n' + json.dumps(good()).encode() + b"\n")
    tracemalloc.start()
    lines = list(iter_jsonl_lines(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [number for number, _ in lines] == [1, 2] and lines[0][1] is None
    assert peak < 4 * MAX_LINE_BYTES, f"held {peak} bytes"
    with pytest.raises(DataFormatError, match="line is longer than 1048576 bytes") as info:
        parse_jsonl_line(lines[0][1], path, 1)
    assert info.value.kind == "too_long"
    assert parse_jsonl_line(lines[1][1], path, 2) == good()


@pytest.mark.parametrize("kind", ["deep_object", "lone_surrogate", "gt_5000_digits"])
def test_gold_names_file_line_and_field(kind, tmp_path, capsys):
    raw, field, _ = HOSTILE[kind]
    path = write_lines(tmp_path / "tasks.jsonl", [json.dumps(generate_tasks(1, seed=0)[0]).encode(), raw])
    assert data_main(["gold", "--input", path, "--output", str(tmp_path / "gold.jsonl")]) == 2
    assert one_error_line(capsys).startswith(f"minimind-trl data: error: {path}:2: field '{field}': ")


@pytest.fixture()
def split_dir(tmp_path):
    tasks = write_lines(tmp_path / "tasks.jsonl", [json.dumps(t).encode() for t in generate_tasks(6, seed=1)])
    prepare_splits([tasks], tmp_path / "splits", seed=0, sizes=[3, 1, 2])
    return tmp_path / "splits"


def plant(split_dir, raw: bytes, name="test.jsonl"):
    """Append ``raw`` to a split file and re-record its hash and row count, as a hand-made split
    folder would: only row checks can catch it."""
    path = split_dir / name
    path.write_bytes(path.read_bytes() + raw + b"\n")
    manifest = json.loads((split_dir / "manifest.json").read_text(encoding="utf-8"))
    manifest["outputs"][name] = {"sha256": sha256_file(path), "rows": manifest["outputs"][name]["rows"] + 1}
    (split_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", ["invalid_utf8", "deep_array", "deep_tools", "lone_surrogate", "huge_line",
                                  "wrong_type"])
def test_eval_split_rows_name_file_line_and_field(kind, split_dir):
    raw, field, _ = HOSTILE[kind]
    path = plant(split_dir, raw)
    with pytest.raises(EvalError) as info:
        load_split_tasks(split_dir, "test")
    assert str(info.value).startswith(f"{path}:3: field '{field}': ")


def test_eval_cli_and_a_malformed_split_manifest(split_dir, tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"  # hashed, never loaded: the split is read first
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"0")
    path = plant(split_dir, HOSTILE["gt_5000_digits"][0])
    command = ["--checkpoint", str(checkpoint), "--split-dir", str(split_dir), "--output-dir", str(tmp_path / "o")]
    assert eval_main(command) == 2
    assert one_error_line(capsys).startswith(f"minimind-trl eval: error: {path}:3: field '<json>': holds an integer")
    manifest = split_dir / "manifest.json"
    bad = (("[" * 100_000, "<json>"), ("[1, 2]", "outputs"), ('{"outputs": {"../x": {}}}', "outputs.../x"))
    for text, field in bad:
        manifest.write_text(text)
        assert eval_main(command) == 2
        assert f"{manifest}: field '{field}': " in one_error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_train_split_rows_name_file_line_and_field(split_dir):
    path = plant(split_dir, HOSTILE["lone_surrogate"][0], "train.jsonl")
    spec = {"path": str(split_dir), "split": "train", "verify": True, "max_rows": None}
    with pytest.raises(RecipeError, match=rf"^recipe: data.path: {path}:4: field 'conversations\[1\].content': "):
        load_split(spec)
    path.write_bytes(path.read_bytes().splitlines(keepends=True)[0] + b"[1]\n")
    with pytest.raises(RecipeError, match=r"train.jsonl:2: field '<row>': must be a JSON object"):
        load_split({**spec, "verify": False})


def record(qid="q0", **changes):
    rec = {"id": qid, "success": True, "all_gt_covered": True, "gt_hits": [True], "n_tool_calls": 1, "answer_length": 9}
    rec.update(changes)
    return rec


def eval_folder(root, records: list[bytes], manifest=None, metrics="{}"):
    root.mkdir()
    write_lines(root / "records.jsonl", records)
    split = {"split": {"name": "test", "manifest_sha256": "a" * 64}}
    (root / "eval_manifest.json").write_text(manifest or json.dumps(split))
    (root / "metrics.json").write_text(metrics)
    return root


RECORD_CASES = {
    "deep_array": (HOSTILE["deep_array"][0], "<json>"),
    "lone_surrogate": (json.dumps(record(final_answer="\ud800")).encode(), "final_answer"),
    "huge_line": (json.dumps(record(text="x" * MAX_LINE_BYTES)).encode(), "<json>"),
    "invalid_utf8": (json.dumps(record(text="caf\u00e9")).encode().replace(b"\\u00e9", b"\xe9"), "<json>"),
    "not_an_object": (b"[1, 2]", "<row>"),
    "missing_key": (json.dumps({"id": "q1"}).encode(), "success"),
    "success_text": (json.dumps(record(success="yes")).encode(), "success"),
    "gt_hits_empty": (json.dumps(record(gt_hits=[])).encode(), "gt_hits"),
    "tool_calls_text": (json.dumps(record(n_tool_calls="3")).encode(), "n_tool_calls"),
    "pass_at_k_bad": (json.dumps(record(pass_at_k={"1": "all"})).encode(), "pass_at_k"),
    "duplicate_id": (json.dumps(record("q0")).encode(), "id"),
}


@pytest.mark.parametrize("kind", sorted(RECORD_CASES))
def test_summarize_records_name_file_line_and_field(kind, tmp_path, capsys):
    raw, field = RECORD_CASES[kind]
    folder = eval_folder(tmp_path / "sft", [json.dumps(record("q0")).encode(), b"", raw])
    assert summarize_main([str(folder), "--output-dir", str(tmp_path / "s")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"minimind-trl summarize: error: {folder / 'records.jsonl'}:3: field '{field}': "), line


@pytest.mark.parametrize("name, text, field", [
    ("eval_manifest.json", '{"split": ' * 5000, "<json>"),
    ("eval_manifest.json", json.dumps({"split": "test"}), "split.manifest_sha256"),
    ("eval_manifest.json", json.dumps({"split": {"manifest_sha256": "a", "name": 3}}), "split.name"),
    ("eval_manifest.json", json.dumps({"split": {"manifest_sha256": "a"}, "checkpoint": "c"}), "checkpoint"),
    ("eval_manifest.json", "", "<json>"),
    ("metrics.json", "[1]", "<json>"),
    ("metrics.json", '{"a": "\\ud800"}', "a"),
])
def test_summarize_manifests_name_file_and_field(name, text, field, tmp_path, capsys):
    folder = eval_folder(tmp_path / "sft", [json.dumps(record()).encode()])
    (folder / name).write_text(text)
    assert summarize_main([str(folder), "--output-dir", str(tmp_path / "s")]) == 2
    assert one_error_line(capsys).startswith(f"minimind-trl summarize: error: {folder / name}: field '{field}': ")
