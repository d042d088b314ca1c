#!/usr/bin/env python
"""Rebuild the tokenizer shipped in ``minimind_trl/tokenization/default/``, deterministically.

Corpus (see ``minimind_trl.data.tokenizer_corpus``): rendered gold trajectories of generated
agent-math tasks plus the project's general English/Chinese text. The corpus is written to a JSONL
file (kept with ``--keep-corpus``) and its hash lands in ``default/build_info.json``; running the
script twice gives byte-identical files.

    .venv/bin/python scripts/build_default_tokenizer.py [--num-tasks N] [--task-seed S]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from minimind_trl.data.tokenizer_corpus import default_corpus
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR, build_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tasks", type=int, default=4000, help="generated tasks in the corpus")
    parser.add_argument("--task-seed", type=int, default=20240601, help="task generator seed")
    parser.add_argument("--general-repeats", type=int, default=20, help="weight of the general text")
    parser.add_argument("--vocab-size", type=int, default=6400)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_TOKENIZER_DIR)
    parser.add_argument("--keep-corpus", type=Path, default=None, help="also write the corpus JSONL here")
    args = parser.parse_args(argv)

    documents = default_corpus(args.num_tasks, args.task_seed, args.general_repeats)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(args.keep_corpus or Path(tmp) / "default_tokenizer_corpus.jsonl")
        with corpus.open("w", encoding="utf-8") as handle:
            for doc in documents:
                handle.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
        provenance = {
            "recipe": "scripts/build_default_tokenizer.py",
            "num_tasks": args.num_tasks,
            "task_seed": args.task_seed,
            "general_repeats": args.general_repeats,
        }
        tokenizer = build_tokenizer(
            [str(corpus)], str(args.output_dir), vocab_size=args.vocab_size, overwrite=True, provenance=provenance
        )
    print(f"wrote {args.output_dir}: {len(tokenizer)} tokens from {len(documents)} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
