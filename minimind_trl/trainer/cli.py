"""``minimind-trl train RECIPE.yaml --output-dir DIR [--set key=value ...] [--resume]``.

The same entry runs under ``python -m``, ``accelerate launch`` and ``torchrun``: every process
builds the same objects; only the main process touches the run folder's bookkeeping files.
Exit codes: 0 completed (``--resume`` of a completed run: nothing done), 2 bad recipe (any value,
a file or plugin it names, an error while the trainer is built: one line naming file and key) or
run folder, 3 stopped on a non-finite value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from transformers import set_seed

from minimind_trl.fsio import FolderLockError, lock_folder, sha256_file, unlock_folder
from minimind_trl.run_folder import INITIAL_MODEL, MANIFEST
from minimind_trl.targets import OutputTargetError, check_output_folder
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR, load_tokenizer
from minimind_trl.trainer import build, run
from minimind_trl.trainer.errors import NonFiniteError, NonFiniteStateError
from minimind_trl.trainer.kinds import get_kind, kind_names
from minimind_trl.trainer.precision import training_arguments
from minimind_trl.trainer.recipe import RecipeError, load_recipe, located, one_line, recipe_sha256
from minimind_trl.trainer.recipe_schema import recipe_key
from minimind_trl.trainer.run import RunFolderError
from minimind_trl.trainer.zero3 import full_weights, num_parameters


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minimind-trl train",
        description=f"Train a recipe (kind: {', '.join(kind_names())}) into a run folder; see docs/recipes.md.",
        epilog="Exit codes: 0 completed, 2 bad recipe or run folder, 3 stopped on a non-finite value.",
    )
    parser.add_argument("recipe", help="recipe YAML (see docs/recipes.md)")
    parser.add_argument("--output-dir", required=True, help="run folder (must be new or empty unless --resume)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key, e.g. --set objective.preset=cispo (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir from its last checkpoint")
    return parser


def _on_main(state, func: Callable[[], Any]) -> Any:
    """Run ``func`` on the main process and share its result (or its error) with every process."""
    payload: list[Any] = [None]
    if state.is_main_process:
        try:
            payload[0] = ("ok", func())
        except (RecipeError, RunFolderError, FileNotFoundError, FolderLockError, OutputTargetError) as exc:
            payload[0] = ("error", f"{type(exc).__name__}: {exc}")
    if state.num_processes > 1:
        broadcast_object_list(payload)
    status, value = payload[0]
    if status == "error":
        raise RunFolderError(value)
    return value


def train(recipe: dict, run_dir: str, resume: bool, command: list[str]) -> dict:
    """Build everything from a resolved recipe and run it in ``run_dir`` (see module docstring).

    Every build error is a :class:`RecipeError` naming the recipe key, raised before any model is
    built where it can be (config, data, tokenizer, plugins); a new run that fails to start leaves
    its folder empty. Resuming a completed run does nothing and says so."""
    config = build.training_config(recipe, run_dir)  # sets up the process group first
    state = PartialState()
    if state.is_main_process:
        print(f"minimind-trl train: {training_arguments(recipe)[1].log_line()}", flush=True)
    _on_main(state, lambda: _claim(run_dir))
    try:
        return _train_locked(recipe, config, run_dir, resume, command, state)
    finally:
        if state.is_main_process:
            unlock_folder(run_dir)


def _claim(run_dir: str) -> None:
    """Check the run folder as an output target (never the root or home folder, under a file, or an
    eval, sweep or demo folder: :mod:`minimind_trl.targets`; emptiness and resuming are
    :func:`run.prepare_run_dir`'s), then lock it."""
    check_output_folder(run_dir, own=(MANIFEST,), reuse=lambda folder: True)
    lock_folder(run_dir, "minimind-trl train")


def _train_locked(recipe: dict, config, run_dir: str, resume: bool, command: list[str], state) -> dict:
    """:func:`train` with the run folder locked by the main process."""
    if resume:
        done = _on_main(state, lambda: run.completed_run(run_dir, recipe))
        if done is not None:
            if state.is_main_process:
                print(f"minimind-trl train: {run_dir} is already completed (step {done.get('step')}); nothing to do")
            return {"state": "completed", "step": done.get("step"), "already_completed": True}
    resume_from = _on_main(state, lambda: run.prepare_run_dir(run_dir, resume, recipe))
    try:
        trainer, manifest = _start(recipe, config, run_dir, state, command)
        _on_main(state, lambda: run.write_manifest(run_dir, manifest, resume_from))
    except BaseException:
        if resume_from is None and state.is_main_process:
            run.abort_start(run_dir)
        raise
    return run.run_training(trainer, run_dir, resume_from)


def _start(recipe: dict, config, run_dir: str, state, command: list[str]):
    """Tokenizer, data, plugins, model, initial weights, trainer; the manifest to write."""
    set_seed(recipe["seed"])
    with recipe_key("tokenizer.path"):
        tokenizer_dir = build.tokenizer_folder(recipe)
        tokenizer = load_tokenizer(tokenizer_dir)
    with recipe_key("data"):
        rows, data_info = build.load_split(recipe["data"])
        eval_rows, eval_info = build.load_eval_split(recipe["data"])
        if eval_info is not None:
            data_info = {**data_info, "eval": eval_info}
    build.check_plugins(recipe)
    with recipe_key("model"):
        model = build.build_model(recipe["model"], get_kind(recipe["kind"]).model_head)
    initial = Path(run_dir) / INITIAL_MODEL
    with full_weights(model):  # ZeRO-3: every process takes part; the main one writes
        if state.is_main_process and not initial.is_dir():
            run.save_initial_model(model, initial)
    state.wait_for_everyone()
    model.config._name_or_path = model.name_or_path = str(initial)
    with recipe_key("training"):
        trainer = build.build_trainer(recipe, config, model, tokenizer, rows, eval_rows)
    manifest = {
        "kind": recipe["kind"],
        "command": command,
        "recipe": recipe,
        "recipe_sha256": recipe_sha256(recipe),
        "training_args": json.loads(trainer.args.to_json_string()),
        "precision": training_arguments(recipe)[1].as_dict(),
        "objective": get_kind(recipe["kind"]).manifest_objective(trainer.args),
        "replay": get_kind(recipe["kind"]).manifest_replay(trainer.args),
        "versions": run.package_versions(),
        "git": run.git_state(),
        "data": data_info,
        "initial_model": {"path": str(initial), "num_parameters": num_parameters(model)},
        "tokenizer": {"path": None if tokenizer_dir is None else str(tokenizer_dir),
                      "sha256": sha256_file((tokenizer_dir or DEFAULT_TOKENIZER_DIR) / "tokenizer.json")},
        "seed": recipe["seed"],
        "world_size": state.num_processes,
        "torch_threads": torch.get_num_threads(),  # float reductions, hence results, depend on it
    }
    return trainer, manifest


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except (RecipeError, FileNotFoundError) as exc:
        print(f"minimind-trl train: {located(args.recipe, exc)}", file=sys.stderr)
        return 2
    try:
        command = ["minimind-trl", "train", *(argv if argv is not None else sys.argv[1:])]
        train(recipe, args.output_dir, args.resume, command)
    except RecipeError as exc:
        print(f"minimind-trl train: {located(args.recipe, exc)}", file=sys.stderr)
        return 2
    except RunFolderError as exc:
        print(f"minimind-trl train: {one_line(exc)}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        unsaved = isinstance(exc, NonFiniteStateError)
        saved = "Not saved; the last good state is named in" if unsaved else "State saved; see"
        print(f"minimind-trl train: run stopped: {exc} {saved} {args.output_dir}/status.json.", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
