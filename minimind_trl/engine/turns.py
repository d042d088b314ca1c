"""One model turn for many contexts: what ``rollout.engine: minimind`` runs in training.

:func:`generate_turns` replaces ``GRPOTrainer._generate_single_turn`` (TRL's tool loop stays
TRL's: it parses each turn, runs the calls, appends the tool turn and asks for the next turn with
the concatenated ids). Each context decodes until its first eos (kept) or its token budget, like
TRL's padded ``generate`` followed by its cut at the first eos and at ``max_completion_length``.
With a :class:`~minimind_trl.engine.decode.TurnCache` (one per rollout) a later context that
extends a finished row (its prompt + completion + the tool turn TRL appended) feeds only the new
ids. Sampling: one stream per context (`sampling.row_generators`, seeded by the run seed, the
``stream`` and the context); with ``return_logprobs`` each token comes with its log-probability
under the warped distribution it was drawn from (0.0 when greedy).
"""

from __future__ import annotations

from typing import Any

from minimind_trl.engine.decode import DECODE_SLICE, MIN_SAVED_ROW_STEPS, DecodeRow, TurnCache, decode
from minimind_trl.engine.sampling import Sampling, row_generators


def generate_turns(model: Any, contexts: list[list[int]], budgets: list[int], eos_token_ids: list[int],
                   pad_token_id: int, sampling: Sampling, stream: str = "", batch_size: int = 64,
                   decode_slice: int = DECODE_SLICE, cache: TurnCache | None = None,
                   min_saved_row_steps: int = MIN_SAVED_ROW_STEPS, return_logprobs: bool = False,
                   row_keys: list[int] | None = None):
    """Generated ids of each context: up to and including its first eos, at most its budget
    (0: nothing). ``stream`` and ``row_keys`` (`sampling.row_generators`) enter the per-row seeds;
    ``return_logprobs`` returns ``(ids, logprobs)``."""
    if len(contexts) != len(budgets):
        raise ValueError("generate_turns: one budget per context")
    for i, context in enumerate(contexts):
        if not context:
            raise ValueError(f"generate_turns: context {i} is empty")
    device = next(model.parameters()).device
    generators = row_generators(contexts, sampling, stream, device, row_keys)
    rows = [DecodeRow(i, list(context), budget, generator,
                      resume=cache.resume(model, context) if cache is not None else None)
            for i, (context, budget, generator) in enumerate(zip(contexts, budgets, generators)) if budget > 0]
    results: list[list[int]] = [[] for _ in contexts]
    result_logps: list[list[float]] = [[] for _ in contexts]

    def end_turn(row: DecodeRow) -> None:  # one turn per context
        results[row.owner], result_logps[row.owner] = row.turn_ids, row.turn_logps

    decode(model, rows, end_turn, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, sampling=sampling,
           batch_size=batch_size, decode_slice=decode_slice, min_saved_row_steps=min_saved_row_steps,
           cache=cache, record_logprobs=return_logprobs)
    return (results, result_logps) if return_logprobs else results
