"""Tool-use math evaluation a researcher runs directly: a split loaded with `datasets`, greedy
multi-turn rollouts through the project's tool environment, scores from the local `evaluate` module.

    python eval/tool_math.py --model runs/e0_sft --data data/splits --split test [--limit 100]
        [--output-dir evals/sft_direct]  # also writes records.jsonl and metrics.json

`--model` is a run folder (its `final/`), a Hub-format folder, or a native `.pth` with `--preset`;
`--data` is a split folder (`{split}.jsonl` inside) or one JSONL file of task rows
(`{"id", "conversations": [system with tools, user, ...], "gt": [...]}`). The rollout and the
verifier are those of `minimind-trl eval` (which adds split-manifest checks, hashes and pass@k);
this script is the short path, each step visible, to adapt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import datasets
import evaluate
import torch

from minimind_trl.eval.metrics import METRIC_DIR, metric_inputs
from minimind_trl.eval.runner import EvalSettings, evaluate_tasks
from minimind_trl.fsio import write_json_atomic, write_jsonl_atomic
from minimind_trl.modeling.checkpoints import CheckpointError, load_checkpoint_tokenizer, load_model, resolve_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="run folder, Hub-format folder, or native .pth (with --preset)")
    p.add_argument("--data", required=True, help="split folder or task JSONL file")
    p.add_argument("--split", default="test", help="split name (file {split}.jsonl in a split folder)")
    p.add_argument("--preset", default=None, help="config preset of a native .pth")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn")
    p.add_argument("--max-tool-turns", type=int, default=3)
    p.add_argument("--open-thinking", action="store_true", help="generation prompt opens <think>")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--output-dir", default=None, help="write records.jsonl and metrics.json here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # 1. the split, with datasets (a folder holds train/val/test.jsonl)
    data = Path(args.data)
    data_file = data / f"{args.split}.jsonl" if data.is_dir() else data
    if not data_file.is_file():
        sys.exit(f"tool_math.py: no task file {data_file}")
    split = datasets.load_dataset("json", data_files={args.split: str(data_file)}, split=args.split)
    if args.limit is not None:
        split = split.select(range(min(args.limit, len(split))))
    tasks = [dict(row) for row in split]

    # 2. the model and its tokenizer (ours, with the chat template the model was trained on)
    model_path = Path(args.model)
    if (model_path / "final" / "config.json").is_file():  # a run folder
        model_path = model_path / "final"
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        info = resolve_checkpoint(model_path, args.preset)
        model = load_model(info, device)
        tokenizer, _, _ = load_checkpoint_tokenizer(info)
    except CheckpointError as exc:
        sys.exit(f"tool_math.py: {exc}")

    # 3. greedy rollouts: the model calls tools, observations are appended, up to max_tool_turns
    settings = EvalSettings(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                            max_tool_turns=args.max_tool_turns, open_thinking=args.open_thinking)
    records = evaluate_tasks(model, tokenizer, tasks, settings)  # one verified record per question

    # 4. scores from the local evaluate module (loaded by path, offline)
    metric = evaluate.load(str(METRIC_DIR), keep_in_memory=True)
    metrics = metric.compute(**metric_inputs(records))

    print(json.dumps({k: v for k, v in metrics.items() if not k.startswith("by_")}, indent=2))
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(out / "records.jsonl", records, sort_keys=True, compact=False)
        write_json_atomic(out / "metrics.json", metrics, sort_keys=True)
        print(f"wrote {out / 'records.jsonl'} and {out / 'metrics.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
