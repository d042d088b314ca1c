"""`minimind-trl` command line: a thin dispatcher to the per-area command modules.

Each command lives next to the code it drives and exposes ``main(argv: list[str]) -> int``;
modules are imported only when their command runs, so ``minimind-trl --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

from minimind_trl import __version__

# command -> (module path, function name, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "tokenizer": ("minimind_trl.tokenization.cli", "main", "build / inspect the byte-level BPE tokenizer"),
    "data": ("minimind_trl.data.cli", "main", "generate agent-math tasks, prepare audited splits"),
    "train": ("minimind_trl.trainer.cli", "main", "train a recipe (SFT or RL) into a run folder"),
    "eval": ("minimind_trl.eval.cli", "eval_main", "frozen greedy evaluation of a checkpoint"),
    "summarize": ("minimind_trl.eval.cli", "summarize_main", "paired-bootstrap summary over eval folders"),
    "plot": ("minimind_trl.eval.cli", "plot_main", "PNG figures from metrics.jsonl / eval folders"),
    "export": ("minimind_trl.modeling.cli", "main",
               "write a checkpoint as a Hub folder (minimind / qwen3) or a GGUF file"),
    "push": ("minimind_trl.push", "main", "upload a model folder (or a run's final/) to the Hugging Face Hub"),
    "sweep": ("minimind_trl.sweep", "main", "run a protocol (e1, e2, ...) condition by condition"),
    "demo": ("minimind_trl.demo", "main", "the CPU demo: tokenizer, data, SFT, four objectives, eval, summary"),
}


def _usage() -> str:
    lines = ["usage: minimind-trl <command> [options]", "", "commands:"]
    for name, (_, _, text) in COMMANDS.items():
        lines.append(f"  {name:<10} {text}")
    lines.append("")
    lines.append("Run `minimind-trl <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"minimind-trl: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_path, func_name, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name and module_path.startswith(exc.name):
            print(f"minimind-trl {name}: this command is not available in this version yet", file=sys.stderr)
            return 2
        raise
    return int(getattr(module, func_name)(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
