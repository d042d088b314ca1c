"""Run folders: refusal to overwrite, manifest, status, resume, final weights, stop on non-finite.

The folder's layout, states and reading are :mod:`minimind_trl.run_folder` (:class:`RunFolder`);
this module writes it. Every file that matters is written atomically and every folder (checkpoints,
``initial_model/``, ``final/``, ``adapter/``) is committed whole by
:func:`minimind_trl.fsio.commit_directory`: built in ``.staging-NAME``, the old folder renamed to
``.old-NAME``, the new one renamed in, the old one deleted. A kill at any point leaves the old or the
new folder (between the renames the old one waits under ``.old-NAME``, and the next resume or reader
moves it back); a killed run leaves the previous checkpoint loadable and at most a torn last line in
``metrics.jsonl`` (cut back on resume). A start that fails or is killed before ``manifest.json``
exists leaves nothing that blocks a re-run: a failed start empties the folder, and a killed start's
``initial_model/`` is removed by the next run.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from minimind_trl.fsio import (
    DataFormatError,
    build_directory,
    read_json_file,
    write_json_atomic,
)
from minimind_trl.modeling.hub import write_hub_folder
from minimind_trl.modeling.modeling_minimind import MiniMindForCausalLM
from minimind_trl.run_folder import (
    MANIFEST,
    SAVE_LEFTOVERS,
    START_LEFTOVERS,
    STATUS,
    RunFolder,
    checkpoint_step,
)
from minimind_trl.trainer.errors import NonFiniteError, NonFiniteStateError
from minimind_trl.trainer.recipe import one_line, recipe_sha256
from minimind_trl.trainer.recorder import truncate_metrics
from minimind_trl.trainer.zero3 import full_weights

__all__ = [
    "CheckFiniteWeights", "RunFolderError", "StopAtMaxSteps", "abort_start", "apply_umask", "completed_run",
    "git_state", "merged_model", "now", "package_versions", "prepare_run_dir", "read_status", "run_training",
    "save_final_model", "save_initial_model", "write_manifest", "write_status",
]
_PACKAGES = (
    "torch", "transformers", "trl", "accelerate", "datasets", "tokenizers", "deepspeed", "peft", "minimind-trl",
)


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (not empty without --resume, nothing to resume...)."""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _readable_manifest(folder: RunFolder) -> dict[str, Any]:
    """The run's manifest, or a one-line RunFolderError naming it when it is not a readable one."""
    try:
        manifest = folder.manifest()
    except (DataFormatError, OSError) as exc:
        raise RunFolderError(f"--resume: {folder.manifest_path} is not a readable run manifest ({one_line(exc)}); "
                             "this run cannot be resumed: start it in a new folder") from None
    if manifest is None:
        raise RunFolderError(f"--resume: {folder.path} has no {MANIFEST}; there is no run to resume")
    return manifest


def prepare_run_dir(run_dir: str | os.PathLike, resume: bool, recipe: dict | None = None) -> str | None:
    """Check the folder and return the checkpoint to resume from (None: start from scratch).

    A new run needs a missing or empty folder, or one holding only what a killed start left
    (:data:`START_LEFTOVERS`, removed). ``resume`` needs a folder with a manifest (an existing
    folder holding no started run is started); it resumes from the newest complete checkpoint
    (leftovers of a killed save are removed) and cuts ``metrics.jsonl`` back to that
    checkpoint's step; with ``recipe`` the manifest must be readable and record that recipe, checked
    before anything is built or written. Folders a kill left moved aside mid-commit are moved back first
    (:meth:`RunFolder.recover`). Call on the main process only.
    """
    run_dir = Path(run_dir)
    not_started = run_dir.is_dir() and not (run_dir / MANIFEST).is_file() \
        and {p.name for p in run_dir.iterdir()} <= START_LEFTOVERS
    if not_started:  # empty, or a start killed before its manifest: nothing was trained, start again
        for name in START_LEFTOVERS:
            shutil.rmtree(run_dir / name, ignore_errors=True)
        if resume:
            print(f"minimind-trl train: --resume: {run_dir} holds no started run (no {MANIFEST}); starting it")
    if not resume or not_started:
        if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
            raise RunFolderError(
                f"run folder {run_dir} is not empty: choose a new folder, or pass --resume to continue that run"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        return None
    folder = RunFolder(run_dir)
    previous = _readable_manifest(folder)
    if recipe is not None:  # checked before anything is built or written
        _check_same_recipe(previous, recipe_sha256(recipe), recipe)
    folder.recover()
    for pattern in SAVE_LEFTOVERS:
        for leftover in run_dir.glob(pattern):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    checkpoint = get_last_checkpoint(str(run_dir))
    truncate_metrics(folder.metrics_path, checkpoint_step(checkpoint) if checkpoint else 0)
    return checkpoint


def abort_start(run_dir: str | os.PathLike) -> None:
    """After a failed start (before the manifest): empty the folder, which a new run found empty."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or (run_dir / MANIFEST).is_file():
        return
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def completed_run(run_dir: str | os.PathLike, recipe: dict) -> dict[str, Any] | None:
    """The status of a completed run in ``run_dir`` (None if it is not one); its recipe must be
    ``recipe`` (else RunFolderError naming the sections that differ)."""
    folder = RunFolder(run_dir)
    if not folder.status_path.is_file() or folder.state() != "completed":
        return None
    status = read_status(run_dir)
    _check_same_recipe(_readable_manifest(folder), recipe_sha256(recipe), recipe)
    return status


def _check_same_recipe(previous: dict, recipe_sha: str | None, recipe: dict | None) -> None:
    if previous.get("recipe_sha256") == recipe_sha:
        return
    old, new = previous.get("recipe", {}), recipe or {}
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)) if recipe else "its hash"
    raise RunFolderError(f"--resume: the recipe differs from the run's manifest in {changed}")


class _AtMaxSteps(Exception):
    """Raised by :class:`StopAtMaxSteps` (caught by :func:`run_training`)."""


class StopAtMaxSteps(TrainerCallback):
    """HF's loop checks ``max_steps`` only after a step, so a run resumed from its last step's
    checkpoint (killed while writing final/) would train one step too many; this stops it once
    the checkpoint is restored, before the step begins (backend-independent; tested on CPU only)."""

    def on_step_begin(self, args, state, control, **kwargs):
        if 0 < state.max_steps <= state.global_step:
            raise _AtMaxSteps()


class CheckFiniteWeights(TrainerCallback):
    """After every optimizer step every parameter must be finite: an update can overflow even when
    the loss and the gradient were finite (learning rate 1e38)."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        params = [p for p in model.parameters() if p.numel()] if model is not None else []
        if params and not bool(torch.stack([torch.isfinite(p).all().to(params[0].device) for p in params]).all()):
            raise NonFiniteStateError(f"the weights are not finite after the optimizer step of step "
                                      f"{state.global_step + 1} (the update overflowed: learning rate or update "
                                      "too large).")


# torch's messages for an update overflowing float32 (AdamW's step size lr / (1 - beta1^t)) and
# for sampling from a policy whose logits are not finite (weights finite but huge after an update)
_OVERFLOW_MESSAGES = ("cannot be converted to type float without overflow",
                      "probability tensor contains either `inf`, `nan` or element < 0")


def apply_umask(folder: str | os.PathLike) -> None:
    """Give a saved folder the modes a plain ``mkdir`` / ``open`` would (temporary-folder helpers
    create 0700 folders and 0600 files)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(path: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout holding this package, or None."""
    where = Path(path) if path else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=where, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def write_manifest(run_dir: str | os.PathLike, manifest: dict[str, Any], resumed_from: str | None) -> dict:
    """Write the manifest at start; on resume keep the original and append to ``resumes``.

    A resume must use the same recipe (``recipe_sha256``); a mismatch raises naming the
    top-level recipe sections that differ.
    """
    path = Path(run_dir) / MANIFEST
    if resumed_from is None and not path.is_file():
        manifest = {**manifest, "created": now(), "resumes": []}
        write_json_atomic(path, manifest)
        return manifest
    previous = read_json_file(path)
    _check_same_recipe(previous, manifest.get("recipe_sha256"), manifest.get("recipe", {}))
    event = {"time": now(), "checkpoint": resumed_from, "world_size": manifest.get("world_size"),
             "command": manifest.get("command"), "git": manifest.get("git")}
    previous["resumes"] = [*previous.get("resumes", []), event]
    write_json_atomic(path, previous)
    return previous


def write_status(run_dir: str | os.PathLike, state: str, **info: Any) -> None:
    write_json_atomic(Path(run_dir) / STATUS, {"state": state, "time": now(), **info})


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``status.json`` (raises when it is missing or malformed; :meth:`RunFolder.status` does not)."""
    return read_json_file(Path(run_dir) / STATUS)


def save_initial_model(model, folder: str | os.PathLike) -> Path:
    """Save the starting weights (Hub format) and point ``model.config`` at them.

    TRL builds the reference model (beta > 0) from ``config._name_or_path``.
    """
    folder = Path(folder)
    with build_directory(folder) as staging:
        model.save_pretrained(staging)
        apply_umask(staging)
    model.config._name_or_path = str(folder)
    model.name_or_path = str(folder)
    return folder


def save_final_model(model, tokenizer, folder: str | os.PathLike) -> Path:
    """Hub-format weights and tokenizer, committed whole (MiniMind via ``write_hub_folder``, the
    files of ``save_for_hub``; the model card reads the run's manifest beside ``folder``)."""
    folder = Path(folder)
    with build_directory(folder) as staging:
        if isinstance(model, MiniMindForCausalLM):
            write_hub_folder(model, tokenizer, staging, format="minimind", run_manifest=folder.parent / MANIFEST)
        else:
            model.save_pretrained(staging)
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
        apply_umask(staging)
    return folder


def merged_model(model, run_dir: str | os.PathLike):
    """A LoRA (PEFT) model's adapter is saved to ``RUN_DIR/adapter/`` and merged into the base
    weights, so ``final/`` is always a complete Hub-format model; other models pass through."""
    if not hasattr(model, "merge_and_unload"):
        return model
    with build_directory(RunFolder(run_dir).adapter_dir) as staging:
        model.save_pretrained(staging)
        apply_umask(staging)
    return model.merge_and_unload()


def run_training(trainer, run_dir: str | os.PathLike, resume_from: str | None) -> dict[str, Any]:
    """:func:`_train_and_save`; an OSError (a full disk, a read-only filesystem, ...) marks
    ``status.json`` failed with the reason (best effort: the disk may refuse that too) and becomes
    a one-line :class:`RunFolderError`. ``--resume`` continues from the newest complete checkpoint."""
    try:
        return _train_and_save(trainer, run_dir, resume_from)
    except OSError as exc:
        if trainer.accelerator.is_main_process:
            try:
                write_status(run_dir, "failed", reason=one_line(exc), step=trainer.state.global_step)
            except OSError:
                pass
        raise RunFolderError(f"run failed at step {trainer.state.global_step}: {one_line(exc)}; {run_dir}/status.json "
                             "says failed: fix the cause (disk space, permissions) and rerun with --resume") from None


def remove_draft_card(run_dir: str | os.PathLike) -> None:
    """Delete the README.md TRL's trainers write into the run folder at every checkpoint (a draft
    card, "generated_from_trainer", that names no base model); the run's model card is
    ``final/README.md``. A README.md written by anyone else is kept."""
    card = Path(run_dir) / "README.md"
    if card.is_file() and "generated_from_trainer" in card.read_text(encoding="utf-8", errors="replace"):
        card.unlink()


def _train_and_save(trainer, run_dir: str | os.PathLike, resume_from: str | None) -> dict[str, Any]:
    """Train, then write the final weights and the status; a non-finite value stops the run.

    Returns the final status dict. On :class:`NonFiniteError` (a non-finite reward, loss or
    gradient, found before the optimizer step) the last good step is checkpointed, ``status.json``
    says ``stopped`` with the reason, and the error is re-raised. Non-finite weights after an
    optimizer step (:class:`CheckFiniteWeights`), torch's float overflow in the optimizer step and
    a non-finite sampling distribution in the next rollout stop the same way, but the broken
    state is not saved: ``checkpoint`` is the newest complete one (None: ``initial_model/``).
    """
    main = trainer.accelerator.is_main_process
    if main:
        write_status(run_dir, "running", resumed_from=resume_from, pid=os.getpid())
    try:
        trainer.add_callback(StopAtMaxSteps())
        trainer.add_callback(CheckFiniteWeights())
        try:
            training_loss = trainer.train(resume_from_checkpoint=resume_from).training_loss
        except _AtMaxSteps:  # resumed from the last step's checkpoint: restored, nothing left to train
            training_loss = None
            close = getattr(getattr(trainer, "step_recorder", None), "close", None)
            if close:
                close()
        except RuntimeError as exc:
            if isinstance(exc, NonFiniteError) or not any(m in str(exc) for m in _OVERFLOW_MESSAGES):
                raise
            raise NonFiniteStateError(f"non-finite update or policy after step {trainer.state.global_step}: "
                                      f"{one_line(exc)} (learning rate or update too large).") from None
    except NonFiniteError as exc:
        if isinstance(exc, NonFiniteStateError):  # the weights in memory are broken: keep the last saved state
            checkpoint = get_last_checkpoint(str(run_dir))
        else:
            checkpoint = trainer.save_state_after_failure()
        close = getattr(getattr(trainer, "step_recorder", None), "close", None)
        if close:
            close()
        if main:
            step = checkpoint_step(checkpoint) if checkpoint else 0
            write_status(run_dir, "stopped", reason=str(exc), step=step, checkpoint=checkpoint)
        raise
    trainer.accelerator.wait_for_everyone()
    final = RunFolder(run_dir).final_dir
    # One path for every launcher: the main process writes the Hub folder (remote-code files,
    # LoRA merged, the adapter beside it) from whole weights; under ZeRO-3 every process takes
    # part in the gather (issue 25 D).
    model = trainer.accelerator.unwrap_model(trainer.model)
    with full_weights(model):
        if main:
            save_final_model(merged_model(model, run_dir), trainer.processing_class, final)
    if main:
        remove_draft_card(run_dir)
        status = {"step": trainer.state.global_step, "train_loss": training_loss, "final_model": str(final)}
        write_status(run_dir, "completed", **status)
    trainer.accelerator.wait_for_everyone()
    return {"state": "completed", "step": trainer.state.global_step}
