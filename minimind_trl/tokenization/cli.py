"""``minimind-trl tokenizer``: build a tokenizer from corpus files, or inspect one.

    minimind-trl tokenizer build --corpus FILE [FILE ...] --output-dir DIR
                                 [--vocab-size N] [--seed S] [--max-documents N]
    minimind-trl tokenizer inspect [--path DIR] [--text TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys

from minimind_trl.tokenization.builder import build_tokenizer
from minimind_trl.tokenization.loading import DEFAULT_TOKENIZER_DIR, load_tokenizer
from minimind_trl.tokenization.vocab import ADDED_TOKENS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minimind-trl tokenizer", description="Build a MiniMind tokenizer from corpus files, or inspect one."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="train a byte-level BPE tokenizer into an empty folder")
    build.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                       help="corpus files: .jsonl rows with 'text' or 'conversations', or plain text")
    build.add_argument("--output-dir", required=True, metavar="DIR", help="new or empty folder to write")
    build.add_argument("--vocab-size", type=int, default=6400, metavar="N", help="vocabulary size (default 6400)")
    build.add_argument("--seed", type=int, default=42, metavar="S", help="sampling seed (default 42)")
    build.add_argument("--max-documents", type=int, default=None, metavar="N",
                       help="train on a seeded random sample of N documents")

    inspect = commands.add_parser("inspect", help="show a tokenizer's layout, optionally tokenize a text")
    inspect.add_argument("--path", default=None, metavar="DIR", help="tokenizer folder (default: the shipped one)")
    inspect.add_argument("--text", default=None, help="text to tokenize")
    return parser


def _build(args: argparse.Namespace) -> int:
    tokenizer = build_tokenizer(
        args.corpus, args.output_dir, vocab_size=args.vocab_size, seed=args.seed, max_documents=args.max_documents
    )
    print(f"wrote {args.output_dir}: {len(tokenizer)} tokens")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.path)
    summary = {
        "path": str(args.path or DEFAULT_TOKENIZER_DIR),
        "vocab_size": len(tokenizer),
        "pad/bos/eos ids": [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id],
        "added tokens": {t: tokenizer.convert_tokens_to_ids(t) for t in ADDED_TOKENS},
    }
    if args.text is not None:
        ids = tokenizer(args.text, add_special_tokens=False)["input_ids"]
        summary["ids"] = ids
        summary["tokens"] = [tokenizer.decode([i]) for i in ids]
    print(json.dumps(summary, ensure_ascii=False, indent=2))
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return _build(args) if args.command == "build" else _inspect(args)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError) as exc:
        print(f"minimind-trl tokenizer {args.command}: error: {exc}", file=sys.stderr)
        return 1
