"""Check that vLLM serves a qwen3-format export as transformers runs it: greedy ids, prompt by prompt.

    minimind-trl export runs/e0_sft export/qwen3 --format qwen3
    python scripts/check_vllm.py --model export/qwen3 [--max-new-tokens 32] [--prompt "..."]...

Both sides decode greedily in float32 from the same prompt ids (our chat template, no thinking);
each continuation is cut after its first eos. Exit 0: every prompt gives the same ids; 1: some
differ (the first differing position is printed; near-tied logits can flip a greedy choice, so
look at how late it happens); 2: the check cannot run (vLLM not installed, not a qwen3 export,
head_dim < 32, which vLLM's attention backends do not support).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

try:  # vLLM is optional (an environment of its own): without it the script says so and exits 2
    from vllm import LLM, SamplingParams
except ImportError as exc:
    LLM = SamplingParams = None
    VLLM_IMPORT_ERROR: ImportError | None = exc
else:
    VLLM_IMPORT_ERROR = None

DEFAULT_PROMPTS = ("What is 12 * 7?", "先算出 9 的 4 次方,然后加上 108。", "Convert 3 km to miles.")
MIN_HEAD_DIM = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help="a qwen3 / qwen3_moe export folder (minimind-trl export --format qwen3)")
    p.add_argument("--prompt", action="append", default=None, help="user message (repeatable; default: three)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM context (bounds its KV cache)")
    return p.parse_args(argv)


def fail(message: str) -> int:
    print(f"check_vllm.py: {message}", file=sys.stderr)
    return 2


def check_export(folder: Path) -> str | None:
    """Why `folder` cannot be served by vLLM here, or None."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return f"{folder} is not a model folder (no config.json)"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("model_type") not in ("qwen3", "qwen3_moe"):
        return (f"{folder} has model_type {config.get('model_type')!r}; serve the qwen3 export "
                "(minimind-trl export CHECKPOINT OUT --format qwen3)")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim < MIN_HEAD_DIM:
        return f"head_dim {head_dim} < {MIN_HEAD_DIM}: vLLM's attention backends need head_dim >= {MIN_HEAD_DIM}"
    return None


def until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two id lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = Path(args.model)
    problem = check_export(folder)
    if problem:
        return fail(problem)
    if VLLM_IMPORT_ERROR is not None:
        return fail(f"vLLM is not installed ({VLLM_IMPORT_ERROR}); install it (`pip install vllm`, or its CPU build) "
                    "in an environment of its own and rerun this script there")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = tokenizer.eos_token_id
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             enable_thinking=False, tokenize=True, return_dict=False)
               for text in (args.prompt or DEFAULT_PROMPTS)]  # list[list[int]]

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False)
            expected.append(until_eos(out[0, len(ids):].tolist(), eos))

    llm = LLM(model=str(folder), dtype="float32", max_model_len=args.max_model_len, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    got = [until_eos(list(o.outputs[0].token_ids), eos) for o in outputs]

    differing = 0
    for text, want, have in zip(args.prompt or DEFAULT_PROMPTS, expected, got):
        at = first_difference(want, have)
        differing += at is not None
        status = "same ids" if at is None else f"DIFFER at new token {at}"
        print(f"{status:>24}  ({len(want)} vs {len(have)} tokens)  {text!r}")
        if at is not None:
            print(f"    transformers: {want}\n    vllm:         {have}")
    print(f"{len(prompts) - differing}/{len(prompts)} prompts give the same greedy ids")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
