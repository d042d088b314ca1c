"""`minimind-trl eval` end to end on a tiny random model and a tiny generated split, plus a
scripted policy whose answers are known, so records and metrics can be checked by hand."""

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from rollout_helpers import scripted  # forces replies longer than one decode slice
from transformers import LogitsProcessor, LogitsProcessorList

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.splits import prepare_splits
from minimind_trl.envs.tools import default_registry
from minimind_trl.eval.cli import eval_main
from minimind_trl.eval.errors import EvalError, OutputDirNotEmptyError
from minimind_trl.eval.metrics import compute_metrics, per_question_values
from minimind_trl.eval.runner import (
    EvalSettings,
    _manifest,
    build_record,
    evaluate_tasks,
    run_evaluation,
    run_tools,
    with_run_tools,
)
from minimind_trl.eval.stats import pass_at_k
from minimind_trl.fsio import sha256_file
from minimind_trl.modeling import MiniMindForCausalLM, save_native_checkpoint
from minimind_trl.modeling.checkpoints import CheckpointInfo, CheckpointNotFoundError
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR, build_tokenizer, load_tokenizer

SETTINGS = EvalSettings(batch_size=4, max_new_tokens=10, max_tool_turns=1)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The shipped tokenizer when present, else one trained here on rendered generated tasks."""
    if (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file():
        return DEFAULT_TOKENIZER_DIR
    root = tmp_path_factory.mktemp("tok")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": json.dumps(t, ensure_ascii=False)}) + "\n"
                              for t in generate_tasks(60, seed=5)), encoding="utf-8")
    build_tokenizer([str(corpus)], str(root / "tokenizer"), vocab_size=1000)
    return root / "tokenizer"


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in generate_tasks(12, seed=3)),
                     encoding="utf-8")
    prepare_splits([tasks], root / "splits", seed=0, sizes=[6, 2, 4])
    return root / "splits"


@pytest.fixture
def model(tiny_model):
    """The shared tiny model (conftest: seed 0, eval mode), under this file's name."""
    return tiny_model


@pytest.fixture
def hub_ckpt(tmp_path_factory, model):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    model.save_pretrained(str(path))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_eval_writes_documented_outputs_and_is_reproducible(tmp_path, hub_ckpt, split_dir, tokenizer_dir):
    out1 = run_evaluation(hub_ckpt, split_dir, tmp_path / "e1", tokenizer_path=tokenizer_dir,
                          settings=SETTINGS, progress=False)
    records = _read(out1 / "records.jsonl")
    test_ids = [json.loads(line)["id"] for line in (split_dir / "test.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == test_ids
    for r in records:
        assert len(r["gt_hits"]) == r["n_gt"] == len(r["gt"])
        assert r["answer_length"] <= r["completion_length"]
        assert r["answer_length"] >= 1 and r["num_turns"] >= 1
        assert r["success"] == all(r["gt_hits"])
        assert r["n_tool_calls"] == len(r["tool_calls"])
        assert isinstance(r["text"], str) and r["question"]

    metrics = json.loads((out1 / "metrics.json").read_text())
    n = len(records)
    assert metrics["count"] == n
    assert metrics["task_success"] == pytest.approx(sum(r["success"] for r in records) / n)
    assert metrics["macro_gt_coverage"] == pytest.approx(sum(sum(r["gt_hits"]) / r["n_gt"] for r in records) / n)
    assert metrics["mean_answer_length"] == pytest.approx(sum(r["answer_length"] for r in records) / n)
    assert metrics["tool_call_rate"] == pytest.approx(sum(r["n_tool_calls"] > 0 for r in records) / n)
    assert set(metrics["by_op_type"]) == {r["op_type"] for r in records}

    manifest = json.loads((out1 / "eval_manifest.json").read_text())
    assert manifest["checkpoint"]["sha256"] == sha256_file(hub_ckpt / "model.safetensors")
    assert manifest["split"]["manifest_sha256"] == sha256_file(split_dir / "manifest.json")
    assert manifest["split"]["name"] == "test" and manifest["split"]["evaluated"] == n
    assert manifest["decoding"]["max_new_tokens"] == 10 and manifest["decoding"]["greedy"] is True
    assert manifest["versions"]["minimind_trl"] and manifest["pass_at_k"] is None
    assert manifest["outputs"]["records.jsonl"] == hashlib.sha256((out1 / "records.jsonl").read_bytes()).hexdigest()

    out2 = run_evaluation(hub_ckpt, split_dir, tmp_path / "e2", tokenizer_path=tokenizer_dir,
                          settings=SETTINGS, progress=False)
    for name in ("records.jsonl", "metrics.json", "eval_manifest.json"):
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name

    # the same weights as a native fp32 .pth with a preset give the same records
    pth = save_native_checkpoint(MiniMindForCausalLM.from_pretrained(str(hub_ckpt)), tmp_path / "tiny.pth", dtype=None)
    out3 = run_evaluation(pth, split_dir, tmp_path / "e3", preset="tiny", tokenizer_path=tokenizer_dir,
                          settings=SETTINGS, progress=False)
    assert (out3 / "records.jsonl").read_bytes() == (out1 / "records.jsonl").read_bytes()
    assert json.loads((out3 / "eval_manifest.json").read_text())["checkpoint"]["kind"] == "native"


def test_eval_refuses_bad_input(tmp_path, hub_ckpt, split_dir, tokenizer_dir, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x.txt").write_text("keep me")
    with pytest.raises(OutputDirNotEmptyError):
        run_evaluation(hub_ckpt, split_dir, busy, tokenizer_path=tokenizer_dir, settings=SETTINGS, progress=False)
    with pytest.raises(CheckpointNotFoundError):
        run_evaluation(tmp_path / "missing", split_dir, tmp_path / "o1", settings=SETTINGS, progress=False)
    (tmp_path / "no_split").mkdir()
    with pytest.raises(EvalError, match="manifest.json"):
        run_evaluation(hub_ckpt, tmp_path / "no_split", tmp_path / "o2", tokenizer_path=tokenizer_dir,
                       settings=SETTINGS)
    with pytest.raises(EvalError, match="num-samples"):
        run_evaluation(hub_ckpt, split_dir, tmp_path / "o3", settings=EvalSettings(pass_k=(4,), num_samples=2))
    code = eval_main(["--checkpoint", str(tmp_path / "missing"), "--split-dir", str(split_dir),
                      "--output-dir", str(tmp_path / "o4")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("minimind-trl eval: error: checkpoint not found") and "\n" not in err
    assert (busy / "x.txt").read_text() == "keep me" and not (tmp_path / "o4").exists()


class _Script(LogitsProcessor):
    """Forces, in a row whose context contains a key, the reply ``scripts[key][turn]`` + eos.

    turn = (eos in the context - 2) / 2: system and user turns end with eos, then every model
    turn and every tool turn adds one."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts, self.start, self.targets = tokenizer, scripts, None, None

    def __call__(self, input_ids, scores):
        if self.start is None:
            self.start = input_ids.shape[1]
            self.targets = []
            for row in input_ids.tolist():
                text = self.tokenizer.decode(row)
                key = next((k for k in self.scripts if k in text), None)
                turn = (row.count(self.tokenizer.eos_token_id) - 2) // 2
                reply = self.scripts[key][turn] if key else None
                self.targets.append(None if reply is None else self.tokenizer(reply, add_special_tokens=False)[
                    "input_ids"] + [self.tokenizer.eos_token_id])
        step = input_ids.shape[1] - self.start
        for row, target in enumerate(self.targets):
            if target is not None:
                scores[row] = float("-inf")
                scores[row, target[min(step, len(target) - 1)]] = 0.0
        return scores


CALL = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "3*7"}}\n</tool_call>'
SCRIPTS = {"[right]": [CALL, "The answer is 21."], "[wrong]": ["It is 22."]}


def _scripted(model, tokenizer):
    """A copy of ``model`` whose ``generate`` follows SCRIPTS."""
    scripted = MiniMindForCausalLM(model.config)
    scripted.load_state_dict(model.state_dict())
    scripted.eval()
    generate = scripted.generate

    def forced(*args, logits_processor=None, **kwargs):  # the engine's sampler (if any) first, the script last
        processors = LogitsProcessorList([*(logits_processor or []), _Script(tokenizer, SCRIPTS)])
        return generate(*args, logits_processor=processors, **kwargs)

    scripted.generate = forced
    return scripted


def _task(key, task_id):
    tools = json.dumps(default_registry().schemas(["calculate_math"]))
    return {"id": task_id, "gt": ["21"], "meta": {"op_type": "arith", "n_gt": 1},
            "conversations": [{"role": "system", "content": "Use tools.", "tools": tools},
                              {"role": "user", "content": f"{key} What is 3 times 7?"},
                              {"role": "assistant", "content": ""}]}


def test_scripted_records_and_pass_at_k(model, tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    tasks = [_task("[right]", "a"), _task("[wrong]", "b")]
    settings = EvalSettings(batch_size=2, max_new_tokens=60, max_tool_turns=2)
    right, wrong = evaluate_tasks(_scripted(model, tokenizer), tokenizer, tasks, settings, progress=False)

    n_ids = [len(tokenizer(s, add_special_tokens=False)["input_ids"]) + 1 for s in SCRIPTS["[right]"]]
    assert right["success"] and right["gt_hits"] == [True] and right["tool_backed"]
    assert right["final_answer"] == "The answer is 21."
    assert right["tool_calls"] == [{"turn": 0, "name": "calculate_math", "arguments": {"expression": "3*7"}}]
    assert right["observations"] == ['{"result": "21"}'] and right["n_tool_calls"] == 1
    assert right["answer_length"] == sum(n_ids) and right["completion_length"] > sum(n_ids)
    assert right["num_turns"] == 2 and right["finished"] and not right["truncated"]
    assert not wrong["success"] and wrong["gt_hits"] == [False] and wrong["n_tool_calls"] == 0
    assert wrong["final_answer"] == "It is 22."
    assert wrong["answer_length"] == wrong["completion_length"] == len(tokenizer("It is 22.")["input_ids"]) + 1

    metrics = compute_metrics([right, wrong])
    assert metrics["task_success"] == 0.5 and metrics["tool_call_rate"] == 0.5
    assert metrics["tool_count_match"] == 0.5
    assert metrics["mean_answer_length"] == (sum(n_ids) + wrong["answer_length"]) / 2

    # sampled pass@k: the script forces every sample, so c = n for "right" and 0 for "wrong"
    sampled = evaluate_tasks(_scripted(model, tokenizer), tokenizer, tasks,
                             EvalSettings(batch_size=4, max_new_tokens=60, max_tool_turns=2, pass_k=(1, 2),
                                          num_samples=3, temperature=0.7), progress=False)
    assert sampled[0]["samples"]["num_correct"] == 3 and sampled[1]["samples"]["num_correct"] == 0
    assert sampled[0]["pass_at_k"] == {"1": 1.0, "2": 1.0} and sampled[1]["pass_at_k"] == {"1": 0.0, "2": 0.0}
    metrics = compute_metrics(sampled, pass_k=[1, 2])
    assert metrics["pass@1"] == pytest.approx((pass_at_k(3, 3, 1) + pass_at_k(3, 0, 1)) / 2) == 0.5
    assert [r["samples"]["temperature"] for r in sampled] == [0.7, 0.7]
    assert per_question_values(sampled, "sampled_pass@1").tolist() == [1.0, 0.0]
    assert metrics["mean_malformed_calls"] == 0.0 == right["malformed_calls"] == wrong["malformed_calls"]


def test_a_record_is_scored_with_its_task_question():
    """Issue 40.2: evaluation hands the task's question to the verifier, as training's reward does:
    ``68.75%`` answers "what percentage" (GT 68.75) and states 0.6875 elsewhere."""
    trajectory = SimpleNamespace(
        text="<think>\n\n</think>\n\nThe answer is 68.75%.<|im_end|>", turn_texts=["The answer is 68.75%."],
        tool_calls=[], observations=[], valid_calls=0, failed_calls=0, malformed_calls=0, n_turns=1, finished=True,
        pending_call=False, truncated=False, prompt_ids=[1, 2], completion_ids=[3, 4], n_model_tokens=2)

    def task(question):
        return {"id": "p", "gt": ["68.75"], "conversations": [{"role": "user", "content": question},
                                                             {"role": "assistant", "content": ""}]}

    asked = build_record(task("What percentage of 80 is 55?"), trajectory)
    assert asked["success"] and asked["question"] == "What percentage of 80 is 55?"
    assert not build_record(task("What is 0.6875 times 100?"), trajectory)["success"]


def test_the_manifest_records_the_sampling_temperature():
    """`summarize` reads it to refuse comparing runs sampled at different temperatures."""
    info = CheckpointInfo(Path("ckpt"), "hub", {"model.safetensors": "c" * 64})
    split = {"name": "test", "manifest_sha256": "a" * 64}
    sampled = _manifest(info, None, "t" * 64, split, 2, EvalSettings(pass_k=(1,), num_samples=4, temperature=0.7),
                        "cpu")
    assert sampled["pass_at_k"]["temperature"] == 0.7 and sampled["pass_at_k"]["num_samples"] == 4
    assert "temperature" not in sampled["decoding"] and sampled["decoding"]["greedy"] is True
    assert _manifest(info, None, "t" * 64, split, 2, EvalSettings(), "cpu")["pass_at_k"] is None


PLUGIN = str(Path(__file__).resolve().parents[2] / "plugins" / "example_tool.py")
INTEREST = ('<tool_call>\n{"name": "compound_interest", "arguments": {"principal": 100, "annual_rate_percent": 10, '
            '"years": 2}}\n</tool_call>')


def test_a_run_is_evaluated_with_the_tools_it_trained_with(tmp_path, model, tokenizer_dir, split_dir, hub_ckpt):
    """A checkpoint inside a GRPO run folder: the run's rollout.tools (a plugin) and tool_names are
    the evaluation's tools; the built-ins alone answer 'Tool compound_interest not found'."""
    tokenizer = load_tokenizer(tokenizer_dir)
    task = _task("[interest]", "c")
    copy = MiniMindForCausalLM(model.config)
    copy.load_state_dict(model.state_dict())
    policy = scripted(copy.eval(), tokenizer, {"[interest]": [INTEREST, "It is 121."]})
    plugin_only = EvalSettings(batch_size=1, max_new_tokens=200, max_tool_turns=1, tools=(PLUGIN,))
    (ours,) = evaluate_tasks(policy, tokenizer, [task], plugin_only, progress=False)
    (builtins,) = evaluate_tasks(policy, tokenizer, [task], EvalSettings(batch_size=1, max_new_tokens=200,
                                                                          max_tool_turns=1), progress=False)
    assert ours["observations"] == ['{"result": "121"}']
    assert builtins["observations"] == ["{'error': 'Tool compound_interest not found.'}"]

    run = tmp_path / "run"
    shutil.copytree(hub_ckpt, run / "final")
    recipe = {"kind": "grpo", "rollout": {"tools": [PLUGIN], "tool_names": ["calculate_math", "compound_interest"]}}
    (run / "manifest.json").write_text(json.dumps({"recipe": recipe}))
    assert run_tools(run / "final") == ((PLUGIN,), ("calculate_math", "compound_interest"))
    assert run_tools(hub_ckpt) is None  # not inside a run folder
    out = run_evaluation(run / "final", split_dir, tmp_path / "eval", settings=SETTINGS, progress=False)
    decoding = json.loads((out / "eval_manifest.json").read_text())["decoding"]
    assert decoding["tools"] == [PLUGIN] and decoding["tool_names"] == ["calculate_math", "compound_interest"]
    with pytest.raises(EvalError, match="unknown tool"):
        evaluate_tasks(model, tokenizer, [task], EvalSettings(tool_names=("nope",)), progress=False)


def test_the_runs_tools_are_the_default_and_explicit_settings_win(tmp_path):
    """RUN/final and RUN/checkpoint-N take the run manifest's tool set-up; --tools / --tool-names
    given explicitly replace it; a folder outside a run keeps the settings as given."""
    run = tmp_path / "run"
    recipe = {"kind": "grpo", "rollout": {"tools": [PLUGIN], "tool_names": ["compound_interest"]}}
    (run / "final").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"recipe": recipe}))
    for checkpoint in (run / "final", run / "checkpoint-3"):
        chosen = with_run_tools(EvalSettings(), checkpoint)
        assert (chosen.tools, chosen.tool_names) == ((PLUGIN,), ("compound_interest",))
    explicit = EvalSettings(tool_names=("calculate_math",))
    assert with_run_tools(explicit, run / "final") is explicit
    explicit = EvalSettings(tools=("other.py",))
    assert with_run_tools(explicit, run / "final") is explicit
    assert with_run_tools(EvalSettings(), tmp_path / "export") == EvalSettings()
    (run / "manifest.json").write_text("{")
    with pytest.raises(EvalError, match="not a readable run manifest"):
        with_run_tools(EvalSettings(), run / "final")
