"""One model turn for many contexts: what a training rollout's round of turns runs.

The training driver (`minimind_trl.envs.rollout.drive`, schedule ``turn_by_turn``) asks for one
model turn of every row still going, round by round, as TRL 1.16's tool loop does.
:func:`generate_turns` (``rollout.engine: minimind``) decodes each context until its first eos
(kept) or its token budget, like TRL's padded ``generate`` followed by its cut at the first eos
and at ``max_completion_length``; :func:`padded_generate_turns` (``rollout.engine: trl``) is that
padded ``generate``.
With a :class:`~minimind_trl.engine.decode.TurnCache` (one per rollout) a later context that
extends a finished row (its prompt + completion + the tool turn TRL appended) feeds only the new
ids. Sampling: one stream per context (`sampling.row_generators`, seeded by the run seed, the
``stream`` and the context); with ``return_logprobs`` each token comes with its log-probability
under the warped distribution it was drawn from (0.0 when greedy).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

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


def padded_generate_turns(model: Any, contexts: list[list[int]], budgets: list[int], eos_token_ids: list[int],
                          pad_token_id: int, generation_config: Any) -> tuple[list[list[int]], list[list[float]]]:
    """One model turn of every context by transformers' padded ``generate``, as TRL 1.16 calls it
    (``rollout.engine: trl``): the contexts left-padded into one batch, ``generation_config`` as
    TRL builds it (its ``max_new_tokens`` is ``max_completion_length``), sampling from the global
    random stream (a row's draws depend on its batch). Each row is cut after its first eos and at
    its budget, as TRL's loop cuts it. Returns ``(ids, logprobs)``: each id's log-prob under the
    processed distribution ``generate`` drew it from (its ``scores``; 0.0 when greedy)."""
    if not contexts or max(budgets) < 1:
        return [[] for _ in contexts], [[] for _ in contexts]
    device = next(model.parameters()).device
    width = max(len(context) for context in contexts)
    input_ids = torch.full((len(contexts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, context in enumerate(contexts):
        input_ids[i, width - len(context):] = torch.tensor(context)
        attention_mask[i, width - len(context):] = 1
    config = copy.deepcopy(generation_config)
    config.return_dict_in_generate = True
    config.output_scores = bool(config.do_sample)
    output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                            generation_config=config)
    new = output.sequences[:, width:]  # (B, T)
    if config.do_sample:
        scores = torch.stack([step.float().log_softmax(-1) for step in output.scores], 1)  # (B, T, V)
        logps = scores.gather(2, new.unsqueeze(2)).squeeze(2).tolist()
    else:
        logps = [[0.0] * new.shape[1] for _ in contexts]
    eos = set(eos_token_ids)
    ids, logprobs = [], []
    for row, row_logps, budget in zip(new.tolist(), logps, budgets):
        end = next((j + 1 for j, token in enumerate(row) if token in eos), len(row))
        end = min(end, budget)
        ids.append(row[:end])
        logprobs.append(row_logps[:end])
    return ids, logprobs
