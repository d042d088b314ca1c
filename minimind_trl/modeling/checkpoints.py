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
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from minimind_trl.fsio import DataFormatError, read_json_file, sha256_file
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


_LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError,
                SafetensorError)
"""What loading a damaged checkpoint raises (torch, safetensors, transformers): each becomes a CheckpointError."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def load_model(info: CheckpointInfo, device: str = "cpu"):
    """The model in float32 eval mode on ``device``. A damaged checkpoint (empty or truncated
    weights, a config.json that is no JSON object, an invalid config or one the weights do not fit)
    raises a one-line :class:`CheckpointError` naming the file; nothing is printed before it."""
    if info.kind == "native":
        try:
            config = get_preset(info.preset)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        try:
            model = load_native_checkpoint(info.path, config)
        except _LOAD_ERRORS as exc:
            raise CheckpointError(f"{info.path} does not fit preset {info.preset!r}: {_first_line(exc)}") from None
    else:
        config = hub_config(info.path)
        check_weights_fit(info, config)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(info.path), config=config, dtype=torch.float32,
                                                         trust_remote_code=False)
        except _LOAD_ERRORS as exc:
            raise CheckpointError(f"{info.path}: the weights do not load: {_first_line(exc)}") from None
    return model.to(device=device, dtype=torch.float32).eval()


def hub_config(folder: Path):
    """The config of a Hub-format folder (``AutoConfig``, no remote code), or a one-line
    CheckpointError naming config.json (not JSON, not an object, an unknown ``model_type``, a
    value the config class refuses)."""
    file = Path(folder) / "config.json"
    try:
        config = read_json_file(file)
    except DataFormatError as exc:
        raise CheckpointError(f"{file}: {exc.reason}") from None
    except OSError as exc:
        raise CheckpointError(f"{file}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: a config must be a JSON object, got {type(config).__name__}")
    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except _LOAD_ERRORS as exc:
        raise CheckpointError(f"{file}: {_first_line(exc)}") from None


def _stored_shapes(info: CheckpointInfo) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the headers of the folder's safetensors files (nothing is read
    beyond them); a file that is not a complete safetensors file raises a one-line CheckpointError."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name in sorted(info.weight_files):
        if not name.endswith(".safetensors"):
            continue
        try:
            with safe_open(str(info.path / name), framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except _LOAD_ERRORS as exc:
            raise CheckpointError(f"{info.path / name}: not a complete safetensors file ({_first_line(exc)})") from None
    return shapes


def check_weights_fit(info: CheckpointInfo, config) -> None:
    """Every stored tensor the model built from ``config`` also has (built on the meta device: no
    memory) must have the stored shape, else a one-line CheckpointError naming the first that does not."""
    stored = _stored_shapes(info)
    try:
        with torch.device("meta"):
            expected = AutoModelForCausalLM.from_config(config, trust_remote_code=False).state_dict()
    except _LOAD_ERRORS as exc:
        raise CheckpointError(f"{info.path / 'config.json'}: no model can be built from it: {_first_line(exc)}") \
            from None
    for key, shape in stored.items():
        if key in expected and tuple(expected[key].shape) != shape:
            raise CheckpointError(f"{info.path / 'config.json'} does not fit the weights: {key} is stored as "
                                  f"{list(shape)} but the config makes it {list(expected[key].shape)}")


def check_tokenizer_fits(model, tokenizer, path: str | os.PathLike) -> None:
    """The model's embedding must have an id for every token of its tokenizer (else the first forward
    indexes out of range): a one-line CheckpointError otherwise."""
    vocab, ids = model.config.vocab_size, len(tokenizer)
    if ids > vocab:
        raise CheckpointError(f"{path}: the model's vocab_size {vocab} is smaller than its tokenizer's {ids} ids; "
                              "use the tokenizer it was trained with (--tokenizer)")


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
