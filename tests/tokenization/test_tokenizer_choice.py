"""Which tokenizer goes with a model (issue 26.1): a model folder's own tokenizer is the default in
train, eval and export; an explicit one with other ids is refused (exit 2 naming both) unless the
user opts in. The silent swap this prevents makes every run from upstream weights look collapsed."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from helpers import tiny_model, write_recipe

from minimind_trl.data.generator import generate_tasks
from minimind_trl.modeling import cli as export_cli
from minimind_trl.modeling.checkpoints import CheckpointError, load_checkpoint_tokenizer, resolve_checkpoint
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR, build_tokenizer, load_tokenizer
from minimind_trl.tokenization.loading import (
    TokenizerMismatchError,
    resolve_tokenizer_folder,
    tokenization_model,
)
from minimind_trl.trainer import cli


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A tiny model folder holding its own tokenizer, trained here: other ids than the packaged one."""
    root = tmp_path_factory.mktemp("start")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": json.dumps(t, ensure_ascii=False)}) + "\n"
                              for t in generate_tasks(40, seed=11)), encoding="utf-8")
    build_tokenizer([str(corpus)], str(root / "tok"), vocab_size=700)
    folder = root / "start"
    tiny_model().save_pretrained(str(folder))
    load_tokenizer(root / "tok").save_pretrained(str(folder))
    assert tokenization_model(folder) != tokenization_model(DEFAULT_TOKENIZER_DIR)
    return folder


def test_the_model_folders_own_tokenizer_is_the_default(start, tmp_path):
    assert resolve_tokenizer_folder(start, None) == start
    assert resolve_tokenizer_folder(tmp_path, None) is None  # no tokenizer there: the packaged one
    same = tmp_path / "same"
    shutil.copytree(start, same)
    assert resolve_tokenizer_folder(start, same) == same  # same ids: fine
    with pytest.raises(TokenizerMismatchError) as error:
        resolve_tokenizer_folder(start, DEFAULT_TOKENIZER_DIR)
    assert str(start) in str(error.value) and str(DEFAULT_TOKENIZER_DIR) in str(error.value)
    assert resolve_tokenizer_folder(start, DEFAULT_TOKENIZER_DIR, allow_mismatch=True) == DEFAULT_TOKENIZER_DIR


def _recipe(tmp_path, split_dir, start, **tokenizer):
    path = write_recipe(tmp_path, split_dir)
    recipe = yaml.safe_load(path.read_text())
    recipe["model"] = {"path": str(start)}
    recipe["tokenizer"] = tokenizer
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_training_from_a_folder_keeps_its_tokenizer_in_final(start, split_dir, tmp_path):
    run = tmp_path / "run"
    assert cli.main([str(_recipe(tmp_path, split_dir, start)), "--output-dir", str(run)]) == 0
    assert tokenization_model(run / "final") == tokenization_model(start)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["tokenizer"]["path"] == str(start)


def test_training_with_another_tokenizer_exits_2_naming_both(start, split_dir, tmp_path, capsys):
    recipe = _recipe(tmp_path, split_dir, start, path=str(DEFAULT_TOKENIZER_DIR))
    run = tmp_path / "run"
    assert cli.main([str(recipe), "--output-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "tokenizer.path" in err and str(start) in err and str(DEFAULT_TOKENIZER_DIR) in err
    assert not run.exists() or not any(run.iterdir())


def test_training_with_another_tokenizer_runs_when_opted_in(start, split_dir, tmp_path):
    recipe = _recipe(tmp_path, split_dir, start, path=str(DEFAULT_TOKENIZER_DIR), allow_mismatch=True)
    run = tmp_path / "run"
    assert cli.main([str(recipe), "--output-dir", str(run)]) == 0
    assert tokenization_model(run / "final") == tokenization_model(DEFAULT_TOKENIZER_DIR)


def test_eval_and_export_refuse_another_tokenizer_unless_opted_in(start, tmp_path, capsys):
    info = resolve_checkpoint(start)
    _, source, _ = load_checkpoint_tokenizer(info)
    assert source == str(start)
    with pytest.raises(CheckpointError, match="differs from the tokenizer of the model folder"):
        load_checkpoint_tokenizer(info, DEFAULT_TOKENIZER_DIR)
    _, source, _ = load_checkpoint_tokenizer(info, DEFAULT_TOKENIZER_DIR, allow_mismatch=True)
    assert source == str(DEFAULT_TOKENIZER_DIR)
    assert export_cli.main([str(start), str(tmp_path / "out"), "--tokenizer", str(DEFAULT_TOKENIZER_DIR)]) == 2
    assert "differs from the tokenizer" in capsys.readouterr().err
    assert export_cli.main([str(start), str(tmp_path / "out")]) == 0
    assert tokenization_model(tmp_path / "out") == tokenization_model(start)
