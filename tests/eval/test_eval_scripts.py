"""The top-level eval/ folder: eval/tool_math.py end to end on a tiny model and split, and the
lm-evaluation-harness task folder (YAML fields, utils hooks on hand-made outputs)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from minimind_trl.conversation import normalize_conversation
from minimind_trl.data.cli import main as data_main
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.eval.metrics import compute_metrics
from minimind_trl.fsio import read_jsonl
from minimind_trl.modeling import save_for_hub

ROOT = Path(__file__).resolve().parents[2]
TASK_DIR = ROOT / "eval" / "lm_eval_tasks" / "minimind_tool_math"
GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


class TaskLoader(yaml.SafeLoader):
    """YAML with lm-eval's `!function module.name` tag (kept as ("function", "module.name"))."""


TaskLoader.add_constructor("!function", lambda loader, node: ("function", loader.construct_scalar(node)))


def load_utils():
    spec = importlib.util.spec_from_file_location("minimind_lm_eval_utils", TASK_DIR / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_configs() -> dict[str, dict]:
    configs = [yaml.load(p.read_text(encoding="utf-8"), Loader=TaskLoader) for p in sorted(TASK_DIR.glob("*.yaml"))]
    return {c["task"]: c for c in configs}


def prepared_splits(tmp_path: Path, n: int = 24) -> Path:
    """data/splits/ written by the project's own `data generate` + `data prepare`."""
    assert data_main(["generate", "--num-tasks", str(n), "--seed", "5", "--output", str(tmp_path / "tasks.jsonl")]) == 0
    assert data_main(["prepare", "--input", str(tmp_path / "tasks.jsonl"), "--output-dir",
                      str(tmp_path / "data" / "splits"), "--sizes", f"{n - 8},4,4"]) == 0
    return tmp_path / "data" / "splits"


def test_lm_eval_yaml_names_existing_functions_fields_and_files(tmp_path, monkeypatch):
    configs = task_configs()
    assert set(configs) == {"minimind_tool_math_direct", "minimind_tool_math_final"}
    utils = load_utils()
    prepared_splits(tmp_path)
    monkeypatch.chdir(tmp_path)  # lm-eval runs from the repository root; data_files are relative
    for name, config in configs.items():
        assert config["output_type"] == "generate_until" and config["dataset_path"] == "json"
        assert config["tag"] == "minimind_tool_math" and config["num_fewshot"] == 0
        hooks = {key: config[key][1] for key in ("doc_to_text", "doc_to_target", "process_results")}
        for key, ref in hooks.items():
            module, func = ref.split(".")
            assert config[key][0] == "function" and module == "utils" and callable(getattr(utils, func)), (name, key)
        # the split files the YAML names load with datasets as lm-eval loads them
        loaded = datasets.load_dataset("json", **config["dataset_kwargs"])
        assert set(loaded) == {config["validation_split"], config["test_split"]}
        doc = loaded[config["test_split"]][0]
        text = getattr(utils, hooks["doc_to_text"].split(".")[1])(doc)
        assert text.endswith(GENERATION_PROMPT) and utils.question(doc) in text
        assert getattr(utils, hooks["doc_to_target"].split(".")[1])(doc) == ", ".join(doc["gt"])
        scores = getattr(utils, hooks["process_results"].split(".")[1])(doc, ["I do not know."])
        assert set(scores) == {m["metric"] for m in config["metric_list"]} == {"task_success", "gt_coverage"}
        assert config["generation_kwargs"]["until"][0] == "<|im_end|>"
        assert config["generation_kwargs"]["do_sample"] is False


def test_lm_eval_prompts(registry, tokenizer):
    utils = load_utils()
    task = next(t for t in generate_tasks(12, seed=2) if t["meta"]["op_type"] == "chain")
    assert utils.doc_to_text_direct(task) == f"<|im_start|>user\n{utils.question(task)}<|im_end|>\n" + GENERATION_PROMPT
    # final: prompt + the gold final answer is exactly the gold trajectory's rendering (as trained on)
    gold = gold_trajectory(task, registry)["conversations"]
    messages, tools = normalize_conversation(gold)
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    prompt = utils.doc_to_text_final(task)
    assert prompt + gold[-1]["content"] + "<|im_end|>\n" == full
    assert prompt.count("<tool_response>") == len(task["gt"]) and "<tools>" in prompt


@pytest.mark.parametrize("gt,output,success,coverage", [
    (["84"], "<think>\n\n</think>\n\nThe answer is 84.", 1.0, 1.0),
    (["84"], "12 * 7 = 84", 1.0, 1.0),
    (["84"], "The answer is 85.", 0.0, 0.0),
    (["84"], "It is 84 or 85.", 0.0, 0.0),  # hedging gets no credit
    (["84"], "2840", 0.0, 0.0),  # no substring matching
    (["6561", "2000.7"], "The result is 2000.7.", 0.0, 0.5),
    (["6561", "2000.7"], "9^4 = 6561, and 30% of 6669 is 2000.7.", 1.0, 1.0),
    (["0.75"], "The answer is 3/4.", 1.0, 1.0),
])
def test_lm_eval_process_results_scores_hand_made_outputs(gt, output, success, coverage):
    scores = load_utils().process_results({"gt": gt}, [output])
    assert scores == {"task_success": success, "gt_coverage": coverage}


def test_lm_eval_process_results_reads_the_question():
    doc = {"gt": ["68.75"], "conversations": [{"role": "user", "content": "55 占 80 的百分之几?"}]}
    assert load_utils().process_results(doc, ["68.75%"])["task_success"] == 1.0
    assert load_utils().process_results({"gt": ["68.75"]}, ["68.75%"])["task_success"] == 0.0


def test_tool_math_script_end_to_end(tmp_path, tiny_model, tokenizer):
    run = tmp_path / "runs" / "sft"
    save_for_hub(tiny_model, tokenizer, run / "final")
    splits = tmp_path / "splits"
    splits.mkdir()
    tasks = generate_tasks(5, seed=7)
    (splits / "test.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "eval" / "tool_math.py"), "--model", str(run), "--data", str(splits),
           "--split", "test", "--limit", "3", "--max-new-tokens", "6", "--max-tool-turns", "1",
           "--batch-size", "2", "--device", "cpu", "--output-dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_jsonl(out / "records.jsonl")
    assert [r["id"] for r in records] == [t["id"] for t in tasks[:3]]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(compute_metrics(records)))  # the local evaluate module's numbers
    printed = json.loads(result.stdout)
    assert printed["count"] == 3 and printed["task_success"] == metrics["task_success"]
    assert 0 < max(r["answer_length"] for r in records) <= 6

    missing = subprocess.run([*cmd[:4], "--data", str(tmp_path / "nowhere")], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert missing.returncode == 1 and "no task file" in missing.stderr


def test_readme_tool_math_command_runs_as_written(tmp_path, tiny_model, tokenizer):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("python eval/tool_math.py "))
    prepared_splits(tmp_path, n=12)  # data/splits with 4 test questions
    save_for_hub(tiny_model, tokenizer, tmp_path / "runs" / "e0_sft" / "final")
    args = line.split()[2:]
    result = subprocess.run([sys.executable, str(ROOT / "eval" / "tool_math.py"), *args, "--device", "cpu"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "evals" / "sft_script" / "metrics.json").read_text())["count"] == 4
