"""``minimind-trl data``: generate agent-math tasks, write gold SFT trajectories, prepare splits.

    minimind-trl data generate --num-tasks N --seed S --output FILE [--gold-sft FILE]
    minimind-trl data gold --input TASKS --output FILE
    minimind-trl data prepare --input FILE [--input FILE ...] --output-dir DIR --seed 42
                              [--sizes 17894,994,994 | --fractions 0.9,0.05,0.05] [--skip-invalid]
    minimind-trl data verify DIR

A data problem (malformed row, non-empty output folder, an output that is an input or a run,
split, eval, sweep or demo record: :mod:`minimind_trl.targets`, ...) prints one line
``minimind-trl data: error: ...`` on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_file_rows, gold_trajectory
from minimind_trl.data.manifest import verify_manifest
from minimind_trl.data.splits import prepare_splits
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import DataError, FolderLockError, write_jsonl_atomic
from minimind_trl.targets import check_output_file, writing

PREFIX = "minimind-trl data"


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PREFIX, description="Agent-math data: tasks, gold SFT, audited splits.")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate agent-math task rows (JSONL)")
    generate.add_argument("--num-tasks", type=int, required=True)
    generate.add_argument("--seed", type=int, required=True)
    generate.add_argument("--output", required=True, help="task JSONL to write")
    generate.add_argument("--gold-sft", help="also write a gold SFT trajectory per task to this JSONL")
    generate.add_argument("--max-distractors", type=int, default=2, help="extra, unneeded tools offered (0..N)")

    gold = commands.add_parser("gold", help="gold SFT trajectories for a generated task file (e.g. train.jsonl)")
    gold.add_argument("--input", required=True)
    gold.add_argument("--output", required=True)

    prepare = commands.add_parser("prepare", help="normalise, de-duplicate and split into train/val/test")
    prepare.add_argument("--input", action="append", required=True, help="task JSONL (repeatable)")
    prepare.add_argument("--output-dir", required=True, help="new or empty folder")
    prepare.add_argument("--seed", type=int, default=42)
    sizes = prepare.add_mutually_exclusive_group()
    sizes.add_argument("--sizes", type=_int_list, help="train,val,test row counts")
    sizes.add_argument("--fractions", type=_float_list, help="train,val,test fractions (default 0.9,0.05,0.05)")
    prepare.add_argument("--skip-invalid", action="store_true",
                         help="drop malformed rows, counting them per kind in the manifest (the first 1000 listed)")

    verify = commands.add_parser("verify", help="check a split folder's files against its manifest")
    verify.add_argument("folder")
    return parser


def _check_targets(args: argparse.Namespace) -> None:
    """Every output file through the one target rule (:mod:`minimind_trl.targets`), before anything is
    computed: never an input or a run, split, eval, sweep or demo record (``prepare``'s folder is
    checked and locked where it is written)."""
    if args.command == "generate":
        check_output_file(args.output)
        if args.gold_sft:
            check_output_file(args.gold_sft)
            if Path(args.gold_sft).resolve() == Path(args.output).resolve():
                raise DataError(f"--output and --gold-sft name the same file ({args.output}); give two files")
    elif args.command == "gold":
        check_output_file(args.output, sources=[args.input])


def _run(args: argparse.Namespace) -> None:
    _check_targets(args)
    if args.command == "generate":
        registry = default_registry()
        tasks = generate_tasks(args.num_tasks, args.seed, registry=registry, max_distractors=args.max_distractors)
        gold_rows = [gold_trajectory(task, registry) for task in tasks] if args.gold_sft else None
        write_jsonl_atomic(args.output, tasks)
        print(f"wrote {len(tasks)} tasks to {args.output}")
        if gold_rows is not None:
            write_jsonl_atomic(args.gold_sft, gold_rows)
            print(f"wrote {len(gold_rows)} gold SFT trajectories to {args.gold_sft}")
    elif args.command == "gold":
        rows = gold_file_rows(args.input, default_registry())
        write_jsonl_atomic(args.output, rows)
        print(f"wrote {len(rows)} gold SFT trajectories to {args.output}")
    elif args.command == "prepare":
        with writing(args.output_dir, "minimind-trl data prepare", sources=args.input):  # checked, then locked
            manifest = prepare_splits(args.input, args.output_dir, seed=args.seed, sizes=args.sizes,
                                      fractions=args.fractions, skip_invalid=args.skip_invalid)
        rows, sizes = manifest["rows"], manifest["split_sizes"]
        print(f"{args.output_dir}: train {sizes['train']}, val {sizes['val']}, test {sizes['test']} "
              f"(unused {sizes['unused']}); read {rows['read']}, invalid skipped {rows['invalid_skipped']}, "
              f"duplicates dropped {rows['duplicates_dropped']}; {len(manifest['strata'])} strata")
    else:
        manifest = verify_manifest(Path(args.folder))
        print(f"{args.folder}: {len(manifest['outputs'])} files match manifest.json")


def main(argv: list[str] | None = None) -> int:
    """Entry point used by ``minimind-trl data``; returns the exit status."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _run(args)
    except (DataError, ValueError, OSError, FolderLockError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            message = f"{exc.filename}: {exc.strerror}"
        else:
            message = " ".join(str(exc).split())
        print(f"{PREFIX}: error: {message}", file=sys.stderr)
        return 2
    return 0
