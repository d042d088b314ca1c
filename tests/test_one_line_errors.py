"""Issue 28.6: inputs that used to end in a traceback end in exit 2 and one line naming the problem;
a resume over a broken manifest builds nothing; a run that fails on a full disk says so in
status.json."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import write_recipe

from minimind_trl import demo
from minimind_trl.cli import main as cli_main
from minimind_trl.eval.cli import eval_main, summarize_main
from minimind_trl.eval.runner import resolve_device
from minimind_trl.fsio import sha256_file
from minimind_trl.modeling import MiniMindForCausalLM, get_preset, save_for_hub
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.trainer import cli, run


def one_line_exit_2(code: int, capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]  # progress bars of the run may come before it
    assert last.startswith("minimind-trl "), err
    for needle in needles:
        assert needle in last, err
    return last


def test_recipe_paths_that_are_folders_or_symlink_loops(tmp_path, capsys):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    (tmp_path / "top.yaml").write_text("base: a.yaml\nseed: 1\n")
    one_line_exit_2(cli.main([str(tmp_path / "top.yaml"), "--output-dir", str(tmp_path / "o")]), capsys, "symlink loop")
    one_line_exit_2(cli.main([str(tmp_path / "a.yaml"), "--output-dir", str(tmp_path / "o")]), capsys, "a.yaml")
    (tmp_path / "folder").mkdir()
    one_line_exit_2(cli.main([str(tmp_path / "folder"), "--output-dir", str(tmp_path / "o")]), capsys, "is a folder")


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take(seed, tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    code = cli.main([str(recipe), "--output-dir", str(tmp_path / "o"), "--set", f"seed={seed}"])
    one_line_exit_2(code, capsys, "seed must be an int in [0, 2**32 - 1]", seed)


def test_resume_over_a_corrupt_manifest_builds_nothing(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"kind": "grpo", "recipe": ')  # torn
    code = cli.main([str(recipe), "--output-dir", str(folder), "--resume"])
    one_line_exit_2(code, capsys, "manifest.json", "not a readable run manifest")
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]  # no initial_model/ written


def test_resume_with_another_recipe_is_refused_before_building(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    folder = tmp_path / "run"
    assert cli.main([str(recipe), "--output-dir", str(folder)]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in folder.iterdir())
    code = cli.main([str(recipe), "--output-dir", str(folder), "--resume", "--set", "training.max_steps=4",
                     "--set", "training.learning_rate=0.5"])
    one_line_exit_2(code, capsys, "recipe differs", "training")
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_full_disk_marks_the_run_failed(tmp_path, split_dir, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run, "save_final_model", full)
    recipe = write_recipe(tmp_path, split_dir)
    folder = tmp_path / "run"
    one_line_exit_2(cli.main([str(recipe), "--output-dir", str(folder)]), capsys, "No space left", "--resume")
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "failed" and "No space left" in status["reason"]
    monkeypatch.undo()
    assert cli.main([str(recipe), "--output-dir", str(folder), "--resume"]) == 0  # space is back
    assert json.loads((folder / "status.json").read_text())["state"] == "completed"


def test_demo_output_dir_naming_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    one_line_exit_2(demo.main(["--output-dir", str(tmp_path / "afile"), "--quick"]), capsys, "is a file")


def test_eval_with_a_nan_temperature(tmp_path, split_dir, capsys):
    code = eval_main(["--checkpoint", str(tmp_path / "nowhere"), "--split-dir", str(split_dir), "--output-dir",
                      str(tmp_path / "e"), "--pass-k", "1", "--temperature", "nan"])
    one_line_exit_2(code, capsys, "temperature")


def _eval_folder(path: Path, n_tool_calls: int = 1) -> Path:
    path.mkdir()
    record = {"id": "q1", "success": True, "all_gt_covered": True, "gt_hits": [True], "n_tool_calls": n_tool_calls,
              "answer_length": 3}
    (path / "records.jsonl").write_text(json.dumps(record) + "\n")
    split = {"name": "test", "manifest_sha256": "a" * 64, "evaluated": 1}
    outputs = {"records.jsonl": sha256_file(path / "records.jsonl")}
    (path / "eval_manifest.json").write_text(json.dumps({"split": split, "outputs": outputs}))
    return path


def test_summarize_with_absurd_numbers(tmp_path, capsys):
    good = _eval_folder(tmp_path / "sft")
    code = summarize_main([str(good), "--output-dir", str(tmp_path / "o1"), "--n-resamples", "2000000000"])
    one_line_exit_2(code, capsys, "n_resamples")
    huge = _eval_folder(tmp_path / "big", n_tool_calls=10**4000 - 1)
    code = summarize_main([str(huge), "--output-dir", str(tmp_path / "o2")])
    one_line_exit_2(code, capsys, "records.jsonl:1", "n_tool_calls")


def test_a_recipe_from_a_pipe_is_read_with_a_bound(tmp_path, capsys):
    fifo = tmp_path / "recipe.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('seed: 1\\n' + '#' * 5_000_000)"])
    try:
        one_line_exit_2(cli.main([str(fifo), "--output-dir", str(tmp_path / "o")]), capsys, "a recipe may have at most")
    finally:
        writer.kill()
        writer.wait()


def test_resume_removes_temporary_files_of_a_killed_atomic_write(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"kind": "grpo", "recipe": {}}))
    for name in (".status.json.k1.tmp", ".manifest.json.k2.tmp"):
        (folder / name).write_text("{half")
    assert run.prepare_run_dir(folder, resume=True) is None  # no checkpoint yet: from the start
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]


def test_completion_length_is_bounded(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    too_long = "rollout.max_completion_length=10000000"
    code = cli.main([str(recipe), "--output-dir", str(tmp_path / "o"), "--set", too_long])
    one_line_exit_2(code, capsys, "rollout.max_completion_length", "32768")


def test_group_size_is_bounded(tmp_path, split_dir, capsys):
    recipe = write_recipe(tmp_path, split_dir)
    code = cli.main([str(recipe), "--output-dir", str(tmp_path / "o"), "--set", "rollout.group_size=1000000000"])
    one_line_exit_2(code, capsys, "rollout.group_size", "1024")


@pytest.mark.parametrize("option, value, bound", [
    ("--max-new-tokens", "100000000", "32768"), ("--max-tool-turns", "100000", "64"),
    ("--batch-size", "1000000000", "4096"), ("--num-samples", "1000000", "1024"),
])
def test_eval_limits_are_bounded(option, value, bound, tmp_path, split_dir, capsys):
    code = eval_main(["--checkpoint", str(tmp_path / "nowhere"), "--split-dir", str(split_dir), "--output-dir",
                      str(tmp_path / "e"), option, value])
    one_line_exit_2(code, capsys, option, bound)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a GPU")
def test_eval_on_a_device_this_torch_cannot_use(tmp_path, split_dir, capsys):
    code = eval_main(["--checkpoint", str(tmp_path / "nowhere"), "--split-dir", str(split_dir), "--output-dir",
                      str(tmp_path / "e"), "--device", "cuda"])
    one_line_exit_2(code, capsys, "--device 'cuda' is not usable here")
    assert resolve_device("auto") == "cpu"


def test_eval_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        eval_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: auto)", "(default: 0.8)", "(default: 256)", "(default: 25)", "(default: test)"):
        assert shown in text


def test_e4_without_a_reward_model_names_the_option_before_building(tmp_path, split_dir, capsys):
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "e4" / "grpo_reward_model.yaml"
    folder = tmp_path / "run"
    code = cli.main([str(recipe), "--output-dir", str(folder), "--set", "model.preset=tiny", "--set", "model.path=null",
                     "--set",
                     f"data.path={split_dir}", "--set", "training.use_cpu=true", "--set", "training.bf16=false",
                     "--set", f"rewards.0.options.path={tmp_path / 'no_such_model'}"])
    one_line_exit_2(code, capsys, "rewards.0.options.path", "not a folder", "never looked up on the Hub")
    assert not folder.exists() or not any(folder.iterdir())  # nothing built, no initial_model/


# ------------------------------------------- issue 40.6: broken checkpoints are one line, not a traceback


def _edit_config(**changes):
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return edit


def _truncate(file: Path, size: int) -> None:
    file.write_bytes(file.read_bytes()[:size])


BROKEN_CHECKPOINTS = {
    "empty_weights": (lambda f: (f / "model.safetensors").write_bytes(b""), "model.safetensors"),
    "truncated_weights": (lambda f: _truncate(f / "model.safetensors", 4000), "model.safetensors"),
    "config_not_json": (lambda f: (f / "config.json").write_text("{"), "config.json"),
    "config_not_an_object": (lambda f: (f / "config.json").write_text("[1]"), "config.json"),
    "config_heads": (_edit_config(num_attention_heads=3), "num_attention_heads"),
    "config_hidden_size": (_edit_config(hidden_size=128), "does not fit"),
    "config_vocab_size": (_edit_config(vocab_size=100), "embed_tokens"),
    "config_unknown_model_type": (_edit_config(model_type="nonsense"), "config.json"),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Hub export, and one whose consistent config has fewer ids than its tokenizer."""
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    good = save_for_hub(MiniMindForCausalLM(get_preset("tiny")), load_tokenizer(), root / "good")
    small = save_for_hub(MiniMindForCausalLM(get_preset("tiny", vocab_size=100)), load_tokenizer(), root / "small")
    return good, small


def _broken(checkpoint, tmp_path, case) -> Path:
    folder = tmp_path / case
    shutil.copytree(checkpoint[0], folder)
    BROKEN_CHECKPOINTS[case][0](folder)
    return folder


def _eval(folder: Path, split_dir: Path, out: Path) -> int:
    return cli_main(["eval", "--checkpoint", str(folder), "--split-dir", str(split_dir), "--output-dir", str(out),
                     "--limit", "1", "--max-new-tokens", "2", "--device", "cpu"])


@pytest.mark.parametrize("case", sorted(BROKEN_CHECKPOINTS))
def test_eval_and_export_of_a_broken_checkpoint_are_one_line(case, checkpoint, tmp_path, split_dir, capsys):
    folder, needle = _broken(checkpoint, tmp_path, case), BROKEN_CHECKPOINTS[case][1]
    one_line_exit_2(_eval(folder, split_dir, tmp_path / "eval"), capsys, needle)
    one_line_exit_2(cli_main(["export", str(folder), str(tmp_path / "export")]), capsys, needle)
    assert not (tmp_path / "eval").exists() and not (tmp_path / "export").exists()


def test_a_vocab_smaller_than_the_tokenizer_is_one_line(checkpoint, tmp_path, split_dir, capsys):
    small = checkpoint[1]
    one_line_exit_2(_eval(small, split_dir, tmp_path / "eval"), capsys, "vocab_size 100", "6400")
    one_line_exit_2(cli_main(["export", str(small), str(tmp_path / "export")]), capsys, "vocab_size 100")
