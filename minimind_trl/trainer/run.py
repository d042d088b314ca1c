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
loadable and at most a torn last line in ``metrics.jsonl`` (cut back on resume).
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

from transformers.trainer_utils import get_last_checkpoint

from minimind_trl.data.manifest import write_json_atomic
from minimind_trl.trainer.callbacks import truncate_metrics

MANIFEST = "manifest.json"
STATUS = "status.json"
INITIAL_MODEL = "initial_model"
FINAL_MODEL = "final"
ADAPTER = "adapter"
_PACKAGES = (
    "torch", "transformers", "trl", "accelerate", "datasets", "tokenizers", "deepspeed", "peft", "minimind-trl",
)


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (not empty without --resume, nothing to resume...)."""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def prepare_run_dir(run_dir: str | os.PathLike, resume: bool) -> str | None:
    """Check the folder and return the checkpoint to resume from (None: start from scratch).

    A new run needs a missing or empty folder. ``resume`` needs a folder with a manifest; it
    resumes from the newest complete checkpoint (staging leftovers of a killed save are removed)
    and cuts ``metrics.jsonl`` back to that checkpoint's step. Call on the main process only.
    """
    run_dir = Path(run_dir)
    if not resume:
        if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
            raise RunFolderError(
                f"run folder {run_dir} is not empty: choose a new folder, or pass --resume to continue that run"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        return None
    if not (run_dir / MANIFEST).is_file():
        raise RunFolderError(f"--resume: {run_dir} has no {MANIFEST}; there is no run to resume")
    for leftover in run_dir.glob(".staging-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    checkpoint = get_last_checkpoint(str(run_dir))
    truncate_metrics(run_dir / "metrics.jsonl", checkpoint_step(checkpoint) if checkpoint else 0)
    return checkpoint


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


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
    if previous.get("recipe_sha256") != manifest.get("recipe_sha256"):
        old, new = previous.get("recipe", {}), manifest.get("recipe", {})
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise RunFolderError(f"--resume: the recipe differs from the run's manifest in {changed}")
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
    staging = folder.with_name(f".staging-{folder.name}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    model.config._name_or_path = str(folder)
    model.name_or_path = str(folder)
    return folder


def save_final_model(model, tokenizer, folder: str | os.PathLike) -> Path:
    """Hub-format weights and tokenizer, atomically (MiniMind via ``save_for_hub``)."""
    from minimind_trl.modeling import MiniMindForCausalLM, save_for_hub

    folder = Path(folder)
    if isinstance(model, MiniMindForCausalLM):
        return save_for_hub(model, tokenizer, folder, format="minimind")
    staging = folder.with_name(f".staging-{folder.name}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    return folder


def merged_model(model, run_dir: str | os.PathLike):
    """A LoRA (PEFT) model's adapter is saved to ``RUN_DIR/adapter/`` and merged into the base
    weights, so ``final/`` is always a complete Hub-format model; other models pass through."""
    if not hasattr(model, "merge_and_unload"):
        return model
    adapter = Path(run_dir) / ADAPTER
    staging = adapter.with_name(f".staging-{adapter.name}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    shutil.rmtree(adapter, ignore_errors=True)
    os.replace(staging, adapter)
    return model.merge_and_unload()


def run_training(trainer, run_dir: str | os.PathLike, resume_from: str | None) -> dict[str, Any]:
    """Train, then write the final weights and the status; a non-finite value stops the run.

    Returns the final status dict. On :class:`NonFiniteError` the last good step is
    checkpointed, ``status.json`` says ``stopped`` with the reason, and the error is re-raised.
    """
    from minimind_trl.trainer.grpo_trainer import NonFiniteError

    main = trainer.accelerator.is_main_process
    if main:
        write_status(run_dir, "running", resumed_from=resume_from, pid=os.getpid())
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except NonFiniteError as exc:
        checkpoint = trainer.save_state_after_failure()
        close = getattr(getattr(trainer, "diagnostics", None), "close", None)
        if close:
            close()
        if main:
            write_status(run_dir, "stopped", reason=str(exc), step=trainer.state.global_step, checkpoint=checkpoint)
        raise
    trainer.accelerator.wait_for_everyone()
    final = Path(run_dir) / FINAL_MODEL
    if getattr(trainer, "is_deepspeed_enabled", False):  # ZeRO-3 shards: every process takes part
        staging = final.with_name(f".staging-{final.name}")
        trainer.save_model(str(staging))
        if main:
            trainer.processing_class.save_pretrained(staging)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(staging, final)
    elif main:
        save_final_model(merged_model(trainer.accelerator.unwrap_model(trainer.model), run_dir),
                         trainer.processing_class, final)
    if main:
        status = {"step": trainer.state.global_step, "train_loss": result.training_loss, "final_model": str(final)}
        write_status(run_dir, "completed", **status)
    trainer.accelerator.wait_for_everyone()
    return {"state": "completed", "step": trainer.state.global_step}
