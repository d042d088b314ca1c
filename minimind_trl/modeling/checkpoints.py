"""Checkpoint resolution, hashing and loading (evaluation, export and the lm-eval task use it).

A checkpoint is either

* a Hub-format folder (``config.json`` plus ``*.safetensors`` or ``pytorch_model*.bin`` weights,
  the layout of ``save_pretrained`` / ``save_for_hub``), loaded with ``AutoModelForCausalLM``; or
* a native MiniMind ``.pth`` state dict, loaded with ``load_native_checkpoint`` and a config
  preset (``get_preset(name)``).

Checkpoint SHA256: the SHA256 of the weights file when there is one; with several weight files
(shards), the SHA256 of the UTF-8 text ``"<sha256>  <file name>\\n"`` over the files sorted by name
(the ``sha256sum`` listing format). Config and tokenizer files are hashed separately.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from minimind_trl.fsio import sha256_file
from minimind_trl.modeling import get_preset, load_native_checkpoint  # importing modeling registers the Auto classes
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR, load_tokenizer
from minimind_trl.tokenization.loading import resolve_tokenizer_folder

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


class CheckpointError(Exception):
    """A checkpoint (or the tokenizer chosen for it) cannot be used: a user error, reported on one line."""


class CheckpointNotFoundError(CheckpointError):
    """The checkpoint path does not exist or holds no weights."""


@dataclass(frozen=True)
class CheckpointInfo:
    """Where the weights are and what they hash to."""

    path: Path
    kind: str  # "hub" or "native"
    weight_files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    preset: str | None = None

    @property
    def sha256(self) -> str:
        if len(self.weight_files) == 1:
            return next(iter(self.weight_files.values()))
        listing = "".join(f"{sha}  {name}\n" for name, sha in sorted(self.weight_files.items()))
        return hashlib.sha256(listing.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "preset": self.preset, "sha256": self.sha256,
                "weight_files": dict(sorted(self.weight_files.items()))}


def resolve_checkpoint(path: str | os.PathLike, preset: str | None = None) -> CheckpointInfo:
    """Check the checkpoint exists and hash its weight files; raise a clear error otherwise."""
    p = Path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"checkpoint not found: {p}")
    if p.is_file():
        if p.suffix != ".pth":
            raise CheckpointNotFoundError(f"{p}: a checkpoint file must be a native MiniMind .pth")
        if not preset:
            raise CheckpointError(f"{p} is a native .pth checkpoint: give its config with --preset (e.g. minimind-3)")
        return CheckpointInfo(p, "native", {p.name: sha256_file(p)}, preset)
    if not (p / "config.json").is_file():
        raise CheckpointNotFoundError(f"{p} is not a Hub-format checkpoint folder (no config.json)")
    weights = sorted({w for pattern in _WEIGHT_PATTERNS for w in p.glob(pattern) if w.is_file()})
    if not weights:
        raise CheckpointNotFoundError(f"{p} holds no weights (*.safetensors or pytorch_model*.bin)")
    return CheckpointInfo(p, "hub", {w.name: sha256_file(w) for w in weights}, preset)


def load_model(info: CheckpointInfo, device: str = "cpu"):
    """The model in float32 eval mode on ``device``."""
    if info.kind == "native":
        try:
            config = get_preset(info.preset)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        try:
            model = load_native_checkpoint(info.path, config)
        except (RuntimeError, ValueError, KeyError) as exc:
            first_line = str(exc).splitlines()[0]
            raise CheckpointError(f"{info.path} does not fit preset {info.preset!r}: {first_line}") from None
    else:
        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32)
    return model.to(device=device, dtype=torch.float32).eval()


def load_checkpoint_tokenizer(info: CheckpointInfo, tokenizer_path: str | os.PathLike | None = None,
                        allow_mismatch: bool = False):
    """(tokenizer, source folder or None for the packaged one, tokenizer.json SHA256), chosen by
    :func:`~minimind_trl.tokenization.loading.resolve_tokenizer_folder`: a Hub folder's own tokenizer
    is the default, and an explicit one that differs from it is refused unless ``allow_mismatch``.
    A native ``.pth`` carries no tokenizer: without ``tokenizer_path`` the packaged one is used, and
    a line on stderr says so (upstream weights need upstream's tokenizer)."""
    try:
        folder = resolve_tokenizer_folder(info.path if info.kind == "hub" else None, tokenizer_path, allow_mismatch)
        tokenizer = load_tokenizer(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None
    if info.kind == "native" and folder is None:
        print(f"note: {info.path} carries no tokenizer: using the packaged one; for upstream MiniMind weights "
              "pass --tokenizer with upstream's tokenizer folder", file=sys.stderr)
    source = folder if folder is not None else DEFAULT_TOKENIZER_DIR
    return tokenizer, (str(folder) if folder is not None else None), sha256_file(Path(source) / "tokenizer.json")
