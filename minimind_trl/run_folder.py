"""The run-folder format: file names, the state a folder is in, and reading it back.

``minimind-trl train`` writes run folders (:mod:`minimind_trl.trainer.run`); the sweep, the demo,
evaluation and plots read them through :class:`RunFolder` instead of spelling paths by hand.
Layout of ``RUN_DIR``::

    manifest.json        resolved recipe and training arguments, versions, git commit, data and
                         initial-model hashes, seed, world size, resume history (written at start)
    status.json          {"state": "running" | "completed" | "stopped", "time", ...} (atomic)
    metrics.jsonl        one record per optimizer step (GRPO; see docs/recipes.md); eval_metrics.jsonl
                         one line per in-training evaluation
    initial_model/       the starting weights in Hub format (the reference model loads from here)
    checkpoint-N/        Trainer checkpoints, each built in .staging-checkpoint-N/ and committed
    final/               Hub-format weights + tokenizer of the last step
    adapter/             with a ``peft`` section: the LoRA adapter (PEFT format); final/ holds it merged

Every folder is replaced by :func:`minimind_trl.fsio.commit_directory` (built in ``.staging-NAME``,
the old one moved to ``.old-NAME``, the new one moved in, the old one deleted). :meth:`RunFolder.recover`
finishes a commit a kill interrupted (and the older layouts' ``final.old`` / ``.final.old-*``
aside folders); :meth:`RunFolder.final_model` recovers before it answers.

States (:meth:`RunFolder.state`): ``new`` (missing or empty), ``pre_manifest`` (only what a start
writes before its manifest), ``interrupted`` (a manifest, not completed or stopped), ``stopped``
(stopped on a non-finite value), ``completed`` (status completed and ``final/config.json``) and
``foreign`` (anything else: not a run folder).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimind_trl.fsio import DataFormatError, aside_path, read_json_file, recover_directory, staging_path

MANIFEST = "manifest.json"
STATUS = "status.json"
METRICS = "metrics.jsonl"
EVAL_METRICS = "eval_metrics.jsonl"
INITIAL_MODEL = "initial_model"
FINAL_MODEL = "final"
ADAPTER = "adapter"
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")

START_LEFTOVERS = frozenset({INITIAL_MODEL, staging_path(INITIAL_MODEL).name})
"""All a start writes before its manifest (removed by the next start)."""
SAVE_LEFTOVERS = (".staging-*", ".old-*", "..staging-*.tmp", f".{FINAL_MODEL}.*.tmp", f".{FINAL_MODEL}.old-*",
                  f"{FINAL_MODEL}.old", f"{ADAPTER}.old", f".{STATUS}.*.tmp", f".{MANIFEST}.*.tmp")
"""Leftovers of killed saves, removed on resume after :meth:`RunFolder.recover`: staging and aside
folders, the temporary files of an atomic ``status.json`` / ``manifest.json`` write a kill cut
short, and the names older versions used (``save_for_hub``'s temporary and moved-aside copies,
``final.old``)."""
_LEGACY_ASIDES = {FINAL_MODEL: (f"{FINAL_MODEL}.old", f".{FINAL_MODEL}.old-*/{FINAL_MODEL}"),
                  ADAPTER: (f"{ADAPTER}.old",)}

RUN_STATES = ("new", "pre_manifest", "interrupted", "stopped", "completed", "foreign")


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """N of a ``checkpoint-N`` folder."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


class RunFolderConflict(Exception):
    """A folder a driver would train into holds something it must not reuse or overwrite."""


@dataclass(frozen=True)
class ToolSetup:
    """The tools a GRPO run trained with: ``rollout.tools`` (plugins beyond the built-ins) and
    ``rollout.tool_names`` (the tools offered; None: all)."""

    plugins: tuple[str, ...]
    tool_names: tuple[str, ...] | None


@dataclass(frozen=True)
class RunFolder:
    """One run folder (it need not exist yet)."""

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))

    @classmethod
    def of_checkpoint(cls, checkpoint: str | os.PathLike) -> RunFolder | None:
        """The run folder holding ``checkpoint`` (its ``final/`` or a ``checkpoint-N/``), else None."""
        checkpoint = Path(checkpoint)
        folder = cls(checkpoint.parent)
        if checkpoint.name != FINAL_MODEL and not CHECKPOINT_RE.match(checkpoint.name):
            return None
        return folder if folder.manifest_path.is_file() else None

    # ------------------------------------------------------------------------------------- paths

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def status_path(self) -> Path:
        return self.path / STATUS

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def final_dir(self) -> Path:
        return self.path / FINAL_MODEL

    @property
    def adapter_dir(self) -> Path:
        return self.path / ADAPTER

    def checkpoints(self) -> list[Path]:
        """Committed ``checkpoint-N`` folders, oldest first."""
        if not self.path.is_dir():
            return []
        found = [p for p in self.path.iterdir() if CHECKPOINT_RE.match(p.name) and p.is_dir()]
        return sorted(found, key=checkpoint_step)

    # ----------------------------------------------------------------------------------- reading

    def manifest(self) -> dict[str, Any] | None:
        """The manifest (None when there is none); a malformed one raises DataFormatError."""
        if not self.manifest_path.is_file():
            return None
        manifest = read_json_file(self.manifest_path)
        if not isinstance(manifest, dict):
            raise DataFormatError(self.manifest_path, None, "<json>", "a run manifest must be a JSON object")
        return manifest

    def status(self) -> dict[str, Any] | None:
        """``status.json`` (None when absent or unreadable: it is written atomically, so an
        unreadable one was not written by a run)."""
        try:
            status = read_json_file(self.status_path)
        except (OSError, DataFormatError):
            return None
        return status if isinstance(status, dict) else None

    def state(self) -> str:
        """One of :data:`RUN_STATES` (module docstring)."""
        path = self.path
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return "new"
        if not path.is_dir():
            return "foreign"
        if self.manifest_path.is_file():
            status = self.status() or {}
            if status.get("state") == "completed" and (self.final_dir / "config.json").is_file():
                return "completed"
            return "stopped" if status.get("state") == "stopped" else "interrupted"
        if {p.name for p in path.iterdir()} <= START_LEFTOVERS:
            return "pre_manifest"
        return "foreign"

    def recipe_sha256(self) -> str | None:
        """The manifest's ``recipe_sha256`` (None without a readable manifest)."""
        try:
            manifest = self.manifest()
        except (OSError, DataFormatError):
            return None
        return None if manifest is None else manifest.get("recipe_sha256")

    def reuse_action(self, recipe: dict, recipe_sha256: str) -> str:
        """What a driver (sweep, demo) does with this folder to get a finished run of ``recipe``:
        ``train`` (nothing there yet), ``skip`` (completed), ``resume`` (interrupted) or ``stopped``
        (stopped on a non-finite value; not retried). The one reuse rule: a folder is reused only
        when its manifest's ``recipe_sha256`` equals ``recipe_sha256`` (the resolved recipe this call
        would run); otherwise :class:`RunFolderConflict` names the top-level fields that differ. A
        folder that is not a run folder is a conflict too."""
        state = self.state()
        if state in ("new", "pre_manifest"):
            return "train"
        if state == "foreign":
            raise RunFolderConflict(f"{self.path}: not empty and not a run folder (no {MANIFEST}); refusing to "
                                    "touch it")
        if self.recipe_sha256() != recipe_sha256:
            try:
                old = (self.manifest() or {}).get("recipe") or {}
            except (OSError, DataFormatError):
                raise RunFolderConflict(f"{self.path}: its {MANIFEST} is unreadable; refusing to reuse it") from None
            changed = sorted(k for k in set(old) | set(recipe) if old.get(k) != recipe.get(k))
            raise RunFolderConflict(f"{self.path}: ran a different recipe (differs in {changed})")
        return {"completed": "skip", "interrupted": "resume", "stopped": "stopped"}[state]

    def tool_setup(self) -> ToolSetup | None:
        """The tools of the GRPO run recorded in the manifest's resolved recipe (``rollout.tools``,
        ``rollout.tool_names``); None for other kinds or without a manifest. A malformed manifest
        raises DataFormatError."""
        manifest = self.manifest()
        recipe = (manifest or {}).get("recipe") or {}
        rollout = recipe.get("rollout") if isinstance(recipe, dict) and recipe.get("kind") == "grpo" else None
        if not isinstance(rollout, dict):
            return None
        names = rollout.get("tool_names")
        return ToolSetup(tuple(rollout.get("tools") or ()), None if names is None else tuple(names))

    def final_model(self) -> Path | None:
        """``final/`` when it holds a model (``config.json``), after recovering a killed commit."""
        if self.path.is_dir():
            self.recover()
        return self.final_dir if (self.final_dir / "config.json").is_file() else None

    # ---------------------------------------------------------------------------------- recovery

    def recover(self) -> None:
        """Finish commits a kill interrupted: every aside folder whose folder is missing is moved
        back (``final/``, ``adapter/``, ``initial_model/``, ``checkpoint-N/``, and the older
        layouts' ``final.old`` / ``.final.old-*/final`` / ``adapter.old``); asides whose
        replacement is in place are deleted. Staging folders are left for :data:`SAVE_LEFTOVERS`."""
        for name, patterns in _LEGACY_ASIDES.items():
            target = self.path / name
            for pattern in patterns:
                for legacy in sorted(self.path.glob(pattern)):
                    if not target.exists() and legacy.is_dir():
                        os.replace(legacy, target)
        names = {FINAL_MODEL, ADAPTER, INITIAL_MODEL}
        names |= {p.name[len(".old-"):] for p in self.path.glob(f".old-{CHECKPOINT_PREFIX}*")}
        for name in sorted(names):
            if aside_path(self.path / name).exists():
                recover_directory(self.path / name)
