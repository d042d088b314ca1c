"""``minimind-trl train`` with the two ranks forced apart, for test_deepspeed_ranks.py (issue 25 A).

Launched by ``accelerate launch``. The real engine still runs every decode call; around it, rank 1
caps each turn at 5 new tokens (fewer ``generate`` calls than rank 0) and rank 0 answers every first
turn with a calculator call (a second model turn that rank 1 never runs). Under ZeRO-3 a collective
inside generation (``synced_gpus``, a per-turn gather) would then wait forever.
"""

from __future__ import annotations

import os
import sys

from minimind_trl.envs import rollout
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.trainer import cli

RANK = int(os.environ.get("RANK", "0"))
CALL = ('<think>\n\n</think>\n\n<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "2+3"}}'
        '\n</tool_call>')
_real_generate_turns = rollout.generate_turns
_tokenizer = load_tokenizer(os.environ.get("DIVERGE_TOKENIZER") or None)
_call_ids = _tokenizer(CALL, add_special_tokens=False)["input_ids"]


def _has_call(context: list[int]) -> bool:  # the prompt's tool list shows the format, not this call
    n = len(_call_ids)
    return any(context[i:i + n] == _call_ids for i in range(len(context) - n + 1))


def diverging_generate_turns(model, contexts, budgets, eos_token_ids, *args, **kwargs):
    if RANK == 1:
        budgets = [min(budget, 5) for budget in budgets]
    ids, logps = _real_generate_turns(model, contexts, budgets, eos_token_ids, *args, **kwargs)
    if RANK == 0:
        call = _call_ids + [eos_token_ids[0]]
        for i, context in enumerate(contexts):
            if not _has_call(context) and budgets[i] >= len(call):
                ids[i], logps[i] = list(call), [0.0] * len(call)
    return ids, logps


rollout.generate_turns = diverging_generate_turns  # what the training driver's rounds call

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
