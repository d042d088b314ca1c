"""``minimind-trl eval | summarize | plot`` (routed here by :mod:`minimind_trl.cli`).

Bad input (:class:`~minimind_trl.eval.errors.EvalError`), a refused output target or a held lock
(:mod:`minimind_trl.targets`) prints one line on stderr and returns 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from minimind_trl.eval import stats
from minimind_trl.eval.errors import EvalError
from minimind_trl.eval.plots import is_figures_folder, plot_runs, plot_summary
from minimind_trl.eval.report import write_summary
from minimind_trl.eval.runner import EVAL_BATCH_SIZE, EvalSettings, run_evaluation
from minimind_trl.eval.summarize import parse_condition_spec, summarize
from minimind_trl.fsio import FolderLockError, build_directory
from minimind_trl.modeling.checkpoints import CheckpointError
from minimind_trl.targets import OutputTargetError, writing


def _guard(command: str, body: Callable[[], int]) -> int:
    try:
        return body()
    except (EvalError, CheckpointError, FolderLockError) as exc:
        print(f"minimind-trl {command}: error: {exc}", file=sys.stderr)
        return 2


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _cells(text: str) -> dict[str, str]:
    cells = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected CELL=CONDITION pairs, got {part!r}")
        cells[key.strip()] = value.strip()
    return cells


def eval_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        prog="minimind-trl eval",
        description="Frozen greedy evaluation of a checkpoint on a split (records.jsonl, metrics.json, "
                    "eval_manifest.json). Optional sampled pass@k.",
    )
    parser.add_argument("--checkpoint", required=True, help="Hub-format folder, or a native .pth (needs --preset)")
    parser.add_argument("--preset", default=None, help="config preset for a native .pth (e.g. minimind-3, tiny)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder (default: the checkpoint folder's own, else the packaged one); one "
                             "that differs from the checkpoint folder's is refused")
    parser.add_argument("--allow-tokenizer-mismatch", action="store_true",
                        help="use --tokenizer even when it differs from the checkpoint folder's own")
    parser.add_argument("--split-dir", required=True, help="split folder with train/val/test.jsonl and manifest.json")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"), help="which split to evaluate")
    parser.add_argument("--output-dir", required=True, help="must not exist or be empty")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N questions")
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH_SIZE,
                        help="rows decoded together; greedy results do not depend on it (up to float rounding)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn")
    parser.add_argument("--max-tool-turns", type=int, default=3, help="tool turns per question")
    parser.add_argument("--open-thinking", action="store_true", help="open a think block in the generation prompt")
    parser.add_argument("--pass-k", type=_int_list, default=None,
                        help="e.g. 1,5: also sample --num-samples per question")
    parser.add_argument("--num-samples", type=int, default=8, help="samples per question for --pass-k")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature for --pass-k")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the --pass-k samples")
    parser.add_argument("--tools", action="append", default=[], metavar="PLUGIN",
                        help="tool plugin beyond the built-ins (repeatable; default: the run's rollout.tools when "
                             "the checkpoint is in a run folder)")
    parser.add_argument("--tool-names", default=None,
                        help="comma-separated tools to offer (default: the run's rollout.tool_names, else all)")
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (cuda when this torch has a usable GPU, else cpu), cpu, cuda, cuda:1, "
                             "mps")
    args = parser.parse_args(argv)

    def body() -> int:
        settings = EvalSettings(
            batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, max_tool_turns=args.max_tool_turns,
            open_thinking=args.open_thinking, pass_k=tuple(args.pass_k or ()), num_samples=args.num_samples,
            temperature=args.temperature, sample_seed=args.sample_seed, limit=args.limit, tools=tuple(args.tools),
            tool_names=None if args.tool_names is None else tuple(n for n in args.tool_names.split(",") if n),
        )
        out = run_evaluation(
            checkpoint=args.checkpoint, split_dir=args.split_dir, output_dir=args.output_dir, split=args.split,
            preset=args.preset, tokenizer_path=args.tokenizer, settings=settings, device=args.device,
            allow_tokenizer_mismatch=args.allow_tokenizer_mismatch,
        )
        print(f"wrote {out}")
        return 0

    return _guard("eval", body)


def summarize_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        prog="minimind-trl summarize",
        description="Tables per metric against a baseline with question-level paired bootstrap CIs "
                    f"(percentile, {stats.DEFAULT_RESAMPLES:,} resamples, seed {stats.DEFAULT_SEED} by default), "
                    "the 2x2 interaction and two-level (seed, question) CIs for multi-seed conditions.",
    )
    parser.add_argument("conditions", nargs="+",
                        help="eval folders: PATH (name = folder name) or NAME=PATH; NAME@SEED groups seeds")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--baseline", default="sft", help="condition every other one is compared with")
    parser.add_argument("--interaction", type=_cells, default=None,
                        help="zscore_seqmean=A,zscore_fixedL=B,center_seqmean=C,center_fixedL=D; reports (D-C)-(B-A)")
    parser.add_argument("--n-resamples", type=int, default=stats.DEFAULT_RESAMPLES, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=stats.DEFAULT_SEED, help="bootstrap seed")
    parser.add_argument("--confidence", type=float, default=stats.DEFAULT_CONFIDENCE, help="CI level")
    parser.add_argument("--num-failures", type=int, default=5, help="wrong answers sampled per condition and seed")
    parser.add_argument("--assumed-discordance", type=float, default=stats.DEFAULT_ASSUMED_DISCORDANCE,
                        help="floor of the resolution on binary metrics: the share of questions two runs disagree "
                             "on when a policy moves (0: the observed discordance only)")
    parser.add_argument("--allow-unhashed", action="store_true",
                        help="summarise eval folders whose manifest records no SHA-256 of its records (or no record "
                             "count), with a warning, marked unverified in the summary (default: refused)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier summary in --output-dir (a folder holding only summary files)")
    args = parser.parse_args(argv)

    def body() -> int:
        try:
            summary, failures = summarize(
                args.conditions, baseline=args.baseline, interaction=args.interaction,
                n_resamples=args.n_resamples, seed=args.seed, confidence=args.confidence,
                num_failures=args.num_failures, allow_unhashed=args.allow_unhashed,
                assumed_discordance=args.assumed_discordance,
            )
        except ValueError as exc:  # bad statistics settings
            raise EvalError(str(exc)) from None
        sources = [parse_condition_spec(spec)[2] for spec in args.conditions]
        out = write_summary(args.output_dir, summary, failures, overwrite=args.overwrite, sources=sources)
        print(f"wrote {out / 'summary.md'}")
        return 0

    return _guard("summarize", body)


def plot_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        prog="minimind-trl plot",
        description="PNG training curves from run folders' metrics.jsonl and eval bars with CI whiskers from a "
                    "summary.json.",
    )
    parser.add_argument("--runs", nargs="*", default=[], help="run folders (or metrics.jsonl files)")
    parser.add_argument("--summary", default=None, help="summary.json (or its folder) from `minimind-trl summarize`")
    parser.add_argument("--output-dir", required=True,
                        help="figures folder, written whole and swapped in atomically (replaces only an earlier "
                             "figures folder: PNG files only)")
    args = parser.parse_args(argv)

    def body() -> int:
        if not args.runs and not args.summary:
            raise EvalError("nothing to plot: give --runs and/or --summary")
        written = []
        sources = [*args.runs, *([args.summary] if args.summary else [])]
        try:
            target = writing(args.output_dir, "minimind-trl plot", sources=sources, reuse=is_figures_folder,
                             expect="an earlier figures folder (PNG files only)")
            with target, build_directory(args.output_dir) as folder:  # the figures folder is replaced as a whole
                if args.runs:
                    written += plot_runs(args.runs, folder)
                if args.summary:
                    written += plot_summary(args.summary, folder)
        except OutputTargetError as exc:
            raise EvalError(str(exc)) from None
        print(f"wrote {len(written)} figures to {args.output_dir}")
        return 0

    return _guard("plot", body)
