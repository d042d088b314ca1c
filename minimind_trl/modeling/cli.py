"""`minimind-trl export`: write a checkpoint as a Hub folder (minimind / qwen3) or a GGUF file.

    minimind-trl export runs/e0_sft export/qwen3 --format qwen3
    minimind-trl export runs/e0_sft export/minimind.gguf --format gguf [--outtype f16]

The checkpoint is a run folder (its `final/` is exported and its manifest describes the run in the
model card), a Hub-format folder, or a native `.pth` with `--preset`. The tokenizer is the
checkpoint's own when it has one, else `--tokenizer`, else the packaged default. The output must be
new or empty, or an earlier export of the same kind (a Hub folder of either format; a GGUF file);
the checkpoint, a folder above it, a run, eval, sweep or demo folder, the root and home folders are
refused, and the target is locked while it is written (:mod:`minimind_trl.targets`). Errors
(missing checkpoint, a config GGUF cannot represent, a refused target) exit 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from minimind_trl.fsio import FolderLockError
from minimind_trl.modeling.checkpoints import (
    CheckpointError,
    check_tokenizer_fits,
    load_checkpoint_tokenizer,
    load_model,
    resolve_checkpoint,
)
from minimind_trl.modeling.gguf_export import is_gguf_file, save_gguf
from minimind_trl.modeling.hub import EARLIER_EXPORT, is_hub_export, save_for_hub
from minimind_trl.targets import writing

FORMATS = ("minimind", "qwen3", "gguf")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minimind-trl export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="run folder, Hub-format folder, or native .pth (with --preset)")
    p.add_argument("out", help="output folder (minimind, qwen3) or .gguf file (gguf)")
    p.add_argument("--format", choices=FORMATS, default="minimind")
    p.add_argument("--outtype", choices=("f32", "f16", "bf16"), default=None,
                   help="weight type: gguf matrices (default f16; norms stay f32), Hub folders (default f32)")
    p.add_argument("--preset", default=None, help="config preset of a native .pth checkpoint")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder (default: the checkpoint's own, else packaged); one that differs from the "
                        "checkpoint's own is refused")
    p.add_argument("--allow-tokenizer-mismatch", action="store_true",
                   help="use --tokenizer even when it differs from the checkpoint folder's own")
    p.add_argument("--gguf-pre", default=None,
                   help="llama.cpp pre-tokenizer name to declare (default: derived from the tokenizer)")
    p.add_argument("--name", default="MiniMind", help="gguf general.name")
    return p


def _target(args: argparse.Namespace, source: Path):
    """The output check and lock of ``args.out`` (the rule of :mod:`minimind_trl.targets`): a Hub
    folder may replace only an earlier Hub export, a GGUF file only a GGUF file; never the source,
    a folder above it, or a run, eval, sweep or demo folder."""
    if args.format == "gguf":
        return writing(args.out, "minimind-trl export", folder=False, sources=[source], reuse=is_gguf_file,
                       expect="a GGUF file")
    return writing(args.out, "minimind-trl export", sources=[source], reuse=is_hub_export, expect=EARLIER_EXPORT)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    source = Path(args.checkpoint)
    manifest = None
    if source.is_dir() and (source / "final" / "config.json").is_file():  # a run folder
        manifest = source / "manifest.json" if (source / "manifest.json").is_file() else None
        source = source / "final"
    try:
        with _target(args, source):
            path = _export(args, source, manifest)
    except (CheckpointError, ValueError, OSError, FolderLockError) as exc:
        print(f"minimind-trl export: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {args.format} export of {source} to {path}")
    return 0


def _export(args: argparse.Namespace, source: Path, manifest: Path | None) -> Path:
    """Load the checkpoint and its tokenizer and write the export (the target is checked and locked)."""
    info = resolve_checkpoint(source, args.preset)
    model = load_model(info)
    tokenizer, _, _ = load_checkpoint_tokenizer(info, args.tokenizer, args.allow_tokenizer_mismatch)
    check_tokenizer_fits(model, tokenizer, info.path)
    if args.format == "gguf":
        return save_gguf(model, tokenizer, args.out, args.outtype or "f16", pre=args.gguf_pre, name=args.name)
    dtype = {None: torch.float32, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    return save_for_hub(model.to(dtype[args.outtype]), tokenizer, args.out, format=args.format, manifest=manifest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
