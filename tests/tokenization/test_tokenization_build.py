"""Building tokenizers: determinism, corpus formats, errors, the CLI, and the shipped folder."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from minimind_trl.cli import main as minimind_trl_cli
from minimind_trl.data.tokenizer_corpus import default_corpus, general_text
from minimind_trl.tokenization import CHAT_TEMPLATE, DEFAULT_TOKENIZER_DIR, build_tokenizer
from minimind_trl.tokenization.cli import main as tokenizer_cli

SMALL_VOCAB = 600
TOOLS = [{"type": "function", "function": {"name": "calculate_math", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expression": {"type": "string"}},
                                                          "required": ["expression"]}}}]


def _conversation(a: int, b: int) -> list[dict]:
    return [
        {"role": "system", "content": "You are a helpful assistant.", "tools": json.dumps(TOOLS)},
        {"role": "user", "content": f"What is {a} times {b}?"},
        {"role": "assistant", "content": "",
         "tool_calls": json.dumps([{"name": "calculate_math", "arguments": {"expression": f"{a} * {b}"}}])},
        {"role": "tool", "content": json.dumps({"result": str(a * b)})},
        {"role": "assistant", "content": f"{a} times {b} is {a * b}."},
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    text = folder / "general.txt"
    text.write_text(general_text(), encoding="utf-8")
    rows = folder / "rows.jsonl"
    with rows.open("w", encoding="utf-8") as handle:
        for a in range(3, 40, 3):
            handle.write(json.dumps({"conversations": _conversation(a, a + 7)}) + "\n")
        handle.write(json.dumps({"text": "A pretraining row. 一行预训练文本。"}, ensure_ascii=False) + "\n")
    return [str(text), str(rows)]


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "tok"
    return out, build_tokenizer(corpus, str(out), vocab_size=SMALL_VOCAB)


def test_build_is_deterministic_and_the_cli_builds(corpus, built, tmp_path, capsys):
    """A second build (through `minimind-trl tokenizer build`) gives byte-identical files.

    (Builds in separate processes were also checked to give identical files when this was written.)"""
    out, _ = built
    again = tmp_path / "again"
    rc = minimind_trl_cli(["tokenizer", "build", "--corpus", *corpus, "--output-dir", str(again),
                           "--vocab-size", str(SMALL_VOCAB)])
    assert rc == 0
    assert f"{SMALL_VOCAB} tokens" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "build_info.json"} <= set(names)
    for name in names:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_built_folder_is_a_standard_tokenizer(built, corpus):
    out, tok = built
    auto = AutoTokenizer.from_pretrained(str(out))
    assert len(auto) == SMALL_VOCAB and auto.chat_template == CHAT_TEMPLATE
    text = "What is 12 times 19? 天空 🙂"
    assert auto.decode(auto(text)["input_ids"]) == text
    assert auto(text)["input_ids"] == tok(text)["input_ids"]
    info = json.loads((out / "build_info.json").read_text(encoding="utf-8"))
    assert info["vocab_size"] == SMALL_VOCAB and info["documents_used"] == info["documents_read"]
    assert [c["name"] for c in info["corpus"]] == ["general.txt", "rows.jsonl"]
    # conversations rows were rendered through the template: its pieces became tokens
    assert len(tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]) <= 3


def test_max_documents_sample_follows_the_seed(corpus, tmp_path):
    def sample(seed, name):
        build_tokenizer(corpus, str(tmp_path / name), vocab_size=300, seed=seed, max_documents=5)
        info = json.loads((tmp_path / name / "build_info.json").read_text(encoding="utf-8"))
        return info, (tmp_path / name / "tokenizer.json").read_bytes()

    info_a, json_a = sample(1, "a")
    info_b, json_b = sample(1, "b")
    _, json_c = sample(2, "c")
    assert info_a["documents_used"] == 5 and info_a["documents_read"] > 5
    assert json_a == json_b and json_a != json_c


def test_cli_refuses_a_non_empty_output_dir(corpus, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    rc = tokenizer_cli(["build", "--corpus", *corpus, "--output-dir", str(tmp_path), "--vocab-size", "300"])
    assert rc == 1
    assert "output_dir is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_cli_inspect(capsys, built):
    out, _ = built
    assert tokenizer_cli(["inspect", "--path", str(out), "--text", "12 times"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pad/bos/eos ids"] == [0, 1, 2]
    assert summary["added tokens"]["<think>"] == 25
    assert "".join(summary["tokens"]) == "12 times"


def test_corpus_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"other": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: a corpus row needs"):
        build_tokenizer([str(bad)], str(tmp_path / "o1"), vocab_size=300)
    bad.write_text('{"conversations": [{"role": "system", "tools": "[oops"}]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: conversations\[0\]\.tools: not valid JSON"):
        build_tokenizer([str(bad)], str(tmp_path / "o2"), vocab_size=300)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        build_tokenizer([str(tmp_path / "missing.txt")], str(tmp_path / "o3"))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abc abc abd", encoding="utf-8")
    with pytest.raises(ValueError, match="too small to learn 400 tokens"):
        build_tokenizer([str(tiny)], str(tmp_path / "o4"), vocab_size=400)
    with pytest.raises(ValueError, match="vocab_size must be at least 293"):
        build_tokenizer([str(tiny)], str(tmp_path / "o5"), vocab_size=100)
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="the corpus is empty"):
        build_tokenizer([str(empty)], str(tmp_path / "o6"), vocab_size=300)
    with pytest.raises(ValueError, match="no corpus files given"):
        build_tokenizer([], str(tmp_path / "o7"), vocab_size=300)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 8))


def test_shipped_folder_is_small_and_current():
    names = sorted(p.name for p in DEFAULT_TOKENIZER_DIR.iterdir())
    assert names == ["build_info.json", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert sum((DEFAULT_TOKENIZER_DIR / n).stat().st_size for n in names) < 1_000_000
    assert (DEFAULT_TOKENIZER_DIR / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE
    info = json.loads((DEFAULT_TOKENIZER_DIR / "build_info.json").read_text(encoding="utf-8"))
    assert info["vocab_size"] == 6400 and info["provenance"]["recipe"] == "scripts/build_default_tokenizer.py"


def test_default_corpus_renders_gold_trajectories():
    documents = default_corpus(num_tasks=6, seed=3, general_repeats=2)
    tasks, general = documents[:6], documents[6:]
    for doc in tasks:
        assert doc.startswith("<|im_start|>system\n") and "\n\n# Tools\n\n" in doc
        assert '<tool_call>\n{"name": ' in doc and "<tool_response>\n" in doc and doc.endswith("<|im_end|>\n")
    assert general and len(general) % 2 == 0 and "<|im_start|>" not in "".join(general)
