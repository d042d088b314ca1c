"""Audited splits: disjoint, stratified within one row, reproducible, hashed, loadable."""

import json
import random
from fractions import Fraction

import pytest

from minimind_trl.data.allocation import allocate, largest_remainder
from minimind_trl.data.manifest import verify_manifest
from minimind_trl.data.normalize import normalize_text
from minimind_trl.data.splits import SPLITS, load_splits, prepare_splits
from minimind_trl.data.strata import infer_op_type
from minimind_trl.fsio import DataError, sha256_file

TOOLS = json.dumps([{"type": "function", "function": {"name": "calculate_math", "description": "math",
                    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                   "required": ["expression"]}}}])

# question templates whose inferred op type is known: (op_type, n_gt, template)
KINDS = [
    ("arithmetic", 1, "What is {a} + {b}?"),
    ("percentage", 1, "What is {a}% of {b}?"),
    ("power", 2, "Compute {a} squared and {b} cubed."),
    ("exchange_rate", 1, "{a}: what is the USD to CNY exchange rate? ({b})"),
    ("chain", 2, "计算 {a} 乘以 {b}，然后把结果加上 7。"),
    ("unit_conversion", 3, "Convert {a} km to m, {b} kg to g and 3 h to min."),
]


def upstream_row(question: str, gt: list) -> dict:
    return {"conversations": [{"role": "system", "content": "You can use tools.", "tools": TOOLS},
                              {"role": "user", "content": question},
                              {"role": "assistant", "content": ""}], "gt": gt}


def make_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        _, n_gt, template = KINDS[rng.randrange(len(KINDS)) if index % 7 else index % len(KINDS)]
        question = template.format(a=index + 2, b=rng.randint(1, 10**6))
        rows.append(upstream_row(question, [rng.randint(0, 999) for _ in range(n_gt)]))
    return rows


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def read_split(folder, name) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture()
def source(tmp_path):
    return write_rows(tmp_path / "tasks.jsonl", make_rows(503))


def test_splits_disjoint_complete_and_sized(source, tmp_path):
    manifest = prepare_splits([source], tmp_path / "out", seed=42, sizes=[400, 50, 53])
    parts = {name: read_split(tmp_path / "out", name) for name in SPLITS}
    assert [len(parts[name]) for name in SPLITS] == [400, 50, 53]
    ids = [row["id"] for rows in parts.values() for row in rows]
    keys = [normalize_text(row["conversations"][1]["content"]) for rows in parts.values() for row in rows]
    assert len(set(ids)) == len(ids) == 503 and len(set(keys)) == 503
    assert manifest["split_sizes"] == {"train": 400, "val": 50, "test": 53, "unused": 0}


def test_every_stratum_within_one_row_of_its_expected_share(source, tmp_path):
    """|count(h, s) - N_h * n_s / N| < 1 for every stratum h and split s (N: rows after de-dup)."""
    manifest = prepare_splits([source], tmp_path / "out", seed=7, fractions=[0.8, 0.1, 0.1])
    parts = {name: read_split(tmp_path / "out", name) for name in SPLITS}
    total = sum(len(rows) for rows in parts.values())
    strata = {}
    for name, rows in parts.items():
        for row in rows:
            key = f"{row['meta']['n_gt']}|{row['meta']['op_type']}"
            strata.setdefault(key, dict.fromkeys(SPLITS, 0))[name] += 1
    assert len(strata) == len(KINDS)
    for key, counts in strata.items():
        stratum_total = sum(counts.values())
        assert manifest["strata"][key]["total"] == stratum_total
        for name in SPLITS:
            expected = Fraction(stratum_total * len(parts[name]), total)
            assert abs(counts[name] - expected) < 1, (key, name, counts[name], expected)
            assert manifest["strata"][key][name] == counts[name]


def test_allocation_bound_holds_on_random_tables():
    rng = random.Random(3)
    for _ in range(300):
        strata = [rng.randint(0, 60) for _ in range(rng.randint(1, 18))]
        total = sum(strata)
        splits = largest_remainder(total, [rng.random() + 0.01 for _ in range(4)]) if total else [0] * 4
        counts = allocate(strata, splits)
        assert [sum(row) for row in counts] == strata
        assert [sum(col) for col in zip(*counts)] == splits
        for h, row in enumerate(counts):
            for s, count in enumerate(row):
                assert abs(count - Fraction(strata[h] * splits[s], total or 1)) < 1


def test_reproducible_and_input_order_independent(source, tmp_path):
    prepare_splits([source], tmp_path / "a", seed=42)
    prepare_splits([source], tmp_path / "b", seed=42)
    shuffled = make_rows(503)
    random.Random(1).shuffle(shuffled)
    prepare_splits([write_rows(tmp_path / "shuffled.jsonl", shuffled)], tmp_path / "c", seed=42)
    prepare_splits([source], tmp_path / "d", seed=43)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        assert sha256_file(tmp_path / "a" / name) == sha256_file(tmp_path / "c" / name)
    assert (tmp_path / "a" / "test.jsonl").read_bytes() != (tmp_path / "d" / "test.jsonl").read_bytes()


def test_manifest_hashes_match_and_tampering_is_detected(source, tmp_path):
    out = tmp_path / "out"
    manifest = prepare_splits([source], out, seed=42)
    assert manifest["inputs"][0]["sha256"] == sha256_file(source)
    for name in SPLITS:
        record = manifest["outputs"][f"{name}.jsonl"]
        assert record["sha256"] == sha256_file(out / f"{name}.jsonl")
        assert record["rows"] == len(read_split(out, name))
    on_disk = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert on_disk == manifest and on_disk["seed"] == 42 and on_disk["package_version"]
    assert set(on_disk["normalisation"]) == {"text", "tools", "gt", "prompt_key", "id"}
    verify_manifest(out)
    with open(out / "val.jsonl", "a", encoding="utf-8") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match="val.jsonl"):
        verify_manifest(out)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


def test_duplicates_after_normalisation_are_dropped_and_reported(tmp_path):
    rows = make_rows(40)
    base = rows[0]["conversations"][1]["content"]
    variant = "  " + base.replace("?", "？").replace(" ", "\u3000") + "\n"  # full-width, odd spaces
    rows.append(upstream_row(variant, rows[0]["gt"]))
    rows.append(upstream_row(base, ["different"]))
    manifest = prepare_splits([write_rows(tmp_path / "in.jsonl", rows)], tmp_path / "out", seed=1)
    assert manifest["duplicates"]["dropped"] == 2
    assert manifest["duplicates"]["conflicting_gt"] == 1
    assert manifest["rows"]["after_dedup"] == 40
    assert sum(len(read_split(tmp_path / "out", name)) for name in SPLITS) == 40


def test_upstream_rows_get_ids_meta_and_canonical_fields(tmp_path):
    row = upstream_row("Ｗhat is 12 ＋ 30?\r\n\r\n\r\n  Thanks", [42, 20.5, 3.0])
    row["conversations"][0]["tools"] = json.dumps(
        [{"name": "calculate_math", "parameters": {"type": "object", "properties": {}}}])
    prepare_splits([write_rows(tmp_path / "in.jsonl", [row])], tmp_path / "out", seed=0, sizes=[1, 0, 0])
    (out,) = read_split(tmp_path / "out", "train")
    assert out["id"].startswith("t-") and len(out["id"]) == 18
    assert out["gt"] == ["42", "20.5", "3"]
    assert out["conversations"][1]["content"] == "What is 12 + 30?\n\nThanks"
    tools = json.loads(out["conversations"][0]["tools"])
    assert tools == [{"type": "function", "function": {"name": "calculate_math",
                                                       "parameters": {"type": "object", "properties": {}}}}]
    assert out["conversations"][0]["tools"] == json.dumps(tools, ensure_ascii=False)
    assert out["meta"] == {"op_type": "arithmetic", "n_gt": 3, "lang": "en", "difficulty": "unknown",
                           "op_type_source": "inferred"}


def test_op_type_heuristics():
    assert infer_op_type("先算 3 乘 4，然后把结果加 5", 2) == "chain"
    assert infer_op_type("先算 3 乘 4，然后把结果加 5", 1) == "arithmetic"
    assert infer_op_type("100 USD 兑 CNY", 1) == "exchange_rate"
    assert infer_op_type("把 5 km 换算成 m", 1) == "unit_conversion"
    assert infer_op_type("What is 15% of 80?", 1) == "percentage"
    assert infer_op_type("2 的 10 次方", 1) == "power"
    assert infer_op_type("What is 7 * 8?", 1) == "arithmetic"


def test_refuses_non_empty_output_folder_and_bad_sizes(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(DataError, match="not empty"):
        prepare_splits([source], out, seed=42)
    with pytest.raises(DataError, match="only 503 remain"):
        prepare_splits([source], tmp_path / "o2", seed=42, sizes=[500, 5, 5])
    with pytest.raises(DataError, match="fractions"):
        prepare_splits([source], tmp_path / "o3", seed=42, fractions=[0.9, 0.2, 0.1])


def test_sizes_smaller_than_data_leave_stratified_unused_rows(source, tmp_path):
    manifest = prepare_splits([source], tmp_path / "out", seed=42, sizes=[300, 20, 20])
    assert manifest["rows"]["unused"] == 163
    for record in manifest["strata"].values():
        assert abs(record["unused"] - record["expected"]["unused"]) < 1


def test_splits_load_through_datasets(source, tmp_path):
    prepare_splits([source], tmp_path / "out", seed=42, sizes=[450, 25, 28])
    loaded = load_splits(tmp_path / "out")
    assert {name: len(ds) for name, ds in loaded.items()} == {"train": 450, "val": 25, "test": 28}
    row = loaded["test"][0]
    assert isinstance(row["gt"], list) and all(isinstance(v, str) for v in row["gt"])
    assert row["conversations"][0]["role"] == "system" and json.loads(row["conversations"][0]["tools"])
    assert set(row["meta"]) >= {"op_type", "n_gt", "lang", "difficulty"}
