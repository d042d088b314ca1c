"""Run folders: refusal to overwrite, manifest, status, resume, final weights, stop on non-finite.

Layout of ``RUN_DIR``::

    manifest.json        resolved recipe and training arguments, versions, git commit, data and
                         initial-model hashes, seed, world size, resume history (written at start)
    status.json          {"state": "running" | "completed" | "stopped", ...} (atomic)
    metrics.jsonl        one record per optimizer step (GRPO; see docs/recipes.md)
    initial_model/       the starting weights in Hub format (the reference model loads from here)
    checkpoint-N/        Trainer checkpoints, each written in .staging-checkpoint-N/ then renamed
    final/               Hub-format weights + tokenizer of the last step (written atomically)
    adapter/             with a ``peft`` section: the LoRA adapter (PEFT format); final/ holds it merged

Every file that matters is written atomically; a killed run leaves the previous checkpoint
loadable and at most a torn last line in ``metrics.jsonl`` (cut back on resume). A start that
fails or is killed before ``manifest.json`` exists leaves nothing that blocks a re-run: a failed
start empties the folder, and a killed start's ``initial_model/`` is removed by the next run.
``final/`` is replaced by renames (new folder staged, old one moved aside, new one moved in, old
one deleted); leftovers of a killed replacement are removed when the run resumes.
"""

from __future__ import annotations

import datetime as _dt
import json
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

from minimind_trl.data.manifest import write_json_atomic
from minimind_trl.trainer.callbacks import truncate_metrics
from minimind_trl.trainer.checkpoints import commit_folder
from minimind_trl.trainer.recipe import one_line

MANIFEST = "manifest.json"
STATUS = "status.json"
INITIAL_MODEL = "initial_model"
FINAL_MODEL = "final"
ADAPTER = "adapter"
START_LEFTOVERS = {INITIAL_MODEL, f".staging-{INITIAL_MODEL}"}  # all a start writes before its manifest
# leftovers of a killed save: staging folders, save_for_hub's temporary and moved-aside copies
_SAVE_LEFTOVERS = (".staging-*", "..staging-*.tmp", f".{FINAL_MODEL}.*.tmp", f".{FINAL_MODEL}.old-*",
                   f"{FINAL_MODEL}.old", f"{ADAPTER}.old")
_PACKAGES = (
    "torch", "transformers", "trl", "accelerate", "datasets", "tokenizers", "deepspeed", "peft", "minimind-trl",
)


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (not empty without --resume, nothing to resume...)."""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def prepare_run_dir(run_dir: str | os.PathLike, resume: bool) -> str | None:
    """Check the folder and return the checkpoint to resume from (None: start from scratch).

    A new run needs a missing or empty folder, or one holding only what a killed start left
    (:data:`START_LEFTOVERS`, removed). ``resume`` needs a folder with a manifest (an existing
    folder holding no started run is started); it resumes from the newest complete checkpoint
    (leftovers of a killed save are removed) and cuts ``metrics.jsonl`` back to that
    checkpoint's step. Call on the main process only.
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
    if not (run_dir / MANIFEST).is_file():
        raise RunFolderError(f"--resume: {run_dir} has no {MANIFEST}; there is no run to resume")
    for pattern in _SAVE_LEFTOVERS:
        for leftover in run_dir.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)
    checkpoint = get_last_checkpoint(str(run_dir))
    truncate_metrics(run_dir / "metrics.jsonl", checkpoint_step(checkpoint) if checkpoint else 0)
    return checkpoint


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


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


def completed_run(run_dir: str | os.PathLike, recipe_sha: str) -> dict[str, Any] | None:
    """The status of a completed run in ``run_dir`` (None if it is not one); its recipe must be
    ``recipe_sha`` (else RunFolderError naming the sections that differ)."""
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST).is_file() or not (run_dir / STATUS).is_file() \
            or not (run_dir / FINAL_MODEL / "config.json").is_file():
        return None
    status = read_status(run_dir)
    if status.get("state") != "completed":
        return None
    with open(run_dir / MANIFEST, encoding="utf-8") as handle:
        _check_same_recipe(json.load(handle), recipe_sha, None)
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
        from minimind_trl.trainer.grpo_trainer import NonFiniteStateError

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
    with open(path, encoding="utf-8") as handle:
        previous = json.load(handle)
    _check_same_recipe(previous, manifest.get("recipe_sha256"), manifest.get("recipe", {}))
    event = {"time": now(), "checkpoint": resumed_from, "world_size": manifest.get("world_size"),
             "command": manifest.get("command"), "git": manifest.get("git")}
    previous["resumes"] = [*previous.get("resumes", []), event]
    write_json_atomic(path, previous)
    return previous


def write_status(run_dir: str | os.PathLike, state: str, **info: Any) -> None:
    write_json_atomic(Path(run_dir) / STATUS, {"state": state, "time": now(), **info})


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    with open(Path(run_dir) / STATUS, encoding="utf-8") as handle:
        return json.load(handle)


def save_initial_model(model, folder: str | os.PathLike) -> Path:
    """Save the starting weights (Hub format) and point ``model.config`` at them.

    TRL builds the reference model (beta > 0) from ``config._name_or_path``.
    """
    folder = Path(folder)
    staging = _staging(folder)
    model.save_pretrained(staging)
    _commit(staging, folder)
    model.config._name_or_path = str(folder)
    model.name_or_path = str(folder)
    return folder


def save_final_model(model, tokenizer, folder: str | os.PathLike) -> Path:
    """Hub-format weights and tokenizer, atomically (MiniMind via ``save_for_hub``)."""
    from minimind_trl.modeling import MiniMindForCausalLM, save_for_hub

    folder = Path(folder)
    staging = _staging(folder)
    if isinstance(model, MiniMindForCausalLM):
        save_for_hub(model, tokenizer, staging, format="minimind")
    else:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    _commit(staging, folder)
    return folder


def _staging(folder: Path) -> Path:
    staging = folder.with_name(f".staging-{folder.name}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _commit(staging: Path, folder: Path) -> None:
    """Modes from the umask, then the rename swap of :func:`commit_folder` (never rmtree first:
    a kill leaves the old folder, the new one, or both, and the next resume cleans up)."""
    apply_umask(staging)
    commit_folder(str(staging), str(folder))


def merged_model(model, run_dir: str | os.PathLike):
    """A LoRA (PEFT) model's adapter is saved to ``RUN_DIR/adapter/`` and merged into the base
    weights, so ``final/`` is always a complete Hub-format model; other models pass through."""
    if not hasattr(model, "merge_and_unload"):
        return model
    adapter = Path(run_dir) / ADAPTER
    staging = _staging(adapter)
    model.save_pretrained(staging)
    _commit(staging, adapter)
    return model.merge_and_unload()


def run_training(trainer, run_dir: str | os.PathLike, resume_from: str | None) -> dict[str, Any]:
    """Train, then write the final weights and the status; a non-finite value stops the run.

    Returns the final status dict. On :class:`NonFiniteError` (a non-finite reward, loss or
    gradient, found before the optimizer step) the last good step is checkpointed, ``status.json``
    says ``stopped`` with the reason, and the error is re-raised. Non-finite weights after an
    optimizer step (:class:`CheckFiniteWeights`), torch's float overflow in the optimizer step and
    a non-finite sampling distribution in the next rollout stop the same way, but the broken
    state is not saved: ``checkpoint`` is the newest complete one (None: ``initial_model/``).
    """
    from minimind_trl.trainer.grpo_trainer import NonFiniteError, NonFiniteStateError

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
            close = getattr(getattr(trainer, "diagnostics", None), "close", None)
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
        close = getattr(getattr(trainer, "diagnostics", None), "close", None)
        if close:
            close()
        if main:
            step = checkpoint_step(checkpoint) if checkpoint else 0
            write_status(run_dir, "stopped", reason=str(exc), step=step, checkpoint=checkpoint)
        raise
    trainer.accelerator.wait_for_everyone()
    final = Path(run_dir) / FINAL_MODEL
    if getattr(trainer, "is_deepspeed_enabled", False):  # ZeRO-3 shards: every process takes part
        staging = final.with_name(f".staging-{final.name}")
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
        trainer.save_model(str(staging))
        if main:
            trainer.processing_class.save_pretrained(staging)
            _commit(staging, final)
    elif main:
        save_final_model(merged_model(trainer.accelerator.unwrap_model(trainer.model), run_dir),
                         trainer.processing_class, final)
    if main:
        status = {"step": trainer.state.global_step, "train_loss": training_loss, "final_model": str(final)}
        write_status(run_dir, "completed", **status)
    trainer.accelerator.wait_for_everyone()
    return {"state": "completed", "step": trainer.state.global_step}
