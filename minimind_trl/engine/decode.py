"""The decode loop: continuous batching over one KV cache, one model turn at a time per row.

:func:`decode` runs every :class:`DecodeRow` to its end. Up to ``batch_size`` rows decode
together; each ``generate`` call decodes at most ``decode_slice`` tokens, never past a row's turn
budget, and ends sooner when the rows whose turn ended would decode pads for long (`SliceStop`).
After each call:

* a row whose turn ended (its first eos, kept, or its budget) is handed to the caller's
  ``end_turn(row)``, which returns the ids to append before the row's next turn (a tool turn:
  the row goes on, the ids pending in the cache) or None (the row is done; with a
  :class:`TurnCache`, its keys and values are stored for a later call whose context extends it);
* a row still inside its turn goes on from its last token;
* queued rows are encoded (prompts without repeats, `kv_batch.prefill`; a context that extends a
  cached row feeds only its new ids) and join.

Nothing is encoded twice, no row waits for the batch's longest, and with per-row sampling streams
(`sampling.row_generators`) a row's tokens do not depend on its neighbours or on where the calls end.
Training (`turns.generate_turns`: one turn per context) and evaluation (`envs.rollout`: turns,
tools and tool turns until the trajectory ends) both run this loop.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from minimind_trl.engine.kv_batch import KVBatch, cache_from_tensors, cache_tensors, continue_rows, merge, prefill
from minimind_trl.engine.sampling import RowSampler, Sampling

DECODE_SLICE = 32
"""Tokens per ``generate`` call at most: between calls, rows whose turn ended leave or take their
tool turn and queued rows join, so no row waits long for the batch's longest turn."""
MIN_SAVED_ROW_STEPS = 32
"""A ``generate`` call ends early (`SliceStop`) once the rows that ended in it would otherwise
decode at least this many row-steps of pads by its last step. Measured on 2 CPU cores (demo
model, 32 rows): a row-step costs ~0.27 ms, ending a call (dropping rows copies the cache) ~5-10 ms."""


class SliceStop(StoppingCriteria):
    """Ends a ``generate`` call of ``steps`` new tokens when ``ended x left >= min_saved`` and some
    row goes on: ``ended`` rows have written an eos in this call, ``left`` steps remain.
    ``generate`` keeps an ended row in the batch, decoding pads, until every row has ended or the
    call's last step; the loop drops it instead and continues the others in its next call.

    It fires after a step's tokens are appended, so every row's last token is a real one, and the
    call returns what a call of that many steps returns. With per-row streams a row's tokens do not
    depend on where the calls end (greedy: up to float rounding, like any change of batch; tested)."""

    def __init__(self, width: int, steps: int, eos_token_ids: list[int], min_saved: int = MIN_SAVED_ROW_STEPS):
        self.width, self.steps, self.min_saved = width, steps, min_saved  # width: the call's input columns
        self.eos = torch.tensor(eos_token_ids)
        self.ended: torch.Tensor | None = None  # (B,) bool

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        rows = input_ids.shape[0]
        self.eos = self.eos.to(input_ids.device)  # moved once
        ended = torch.isin(input_ids[:, -1], self.eos)  # (B,); pads follow an eos
        self.ended = ended if self.ended is None else self.ended | ended
        count = self.ended.sum()
        left = self.steps - (input_ids.shape[1] - self.width)
        return ((count * left >= self.min_saved) & (count < rows)).expand(rows)  # no sync: a tensor


@dataclass
class DecodeRow:
    """One row of the loop: a trajectory being decoded.

    ``owner``: the caller's handle (an index, a trajectory); ``context``: the ids the current turn
    continues (prompt, earlier turns and tool turns); ``budget``: new tokens allowed per turn;
    ``generator``: the row's sampling stream (None: greedy); ``turn_ids`` / ``turn_logps``: the
    current turn so far and each id's sampling log-prob (with ``record_logprobs``); ``resume``: a
    cached row the context extends, its new ids pending (set by :meth:`TurnCache.resume`)."""

    owner: Any
    context: list[int]
    budget: int
    generator: torch.Generator | None = None
    turn_ids: list[int] = field(default_factory=list)
    turn_logps: list[float] = field(default_factory=list)
    resume: KVBatch | None = None


@dataclass
class _Stored:
    ids: torch.Tensor  # (1, W) the row's columns (pads inside), all in the cache
    mask: torch.Tensor  # (1, W)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (1, H, W, D)


class TurnCache:
    """Keys and values of finished rows, by the real token ids they hold (all but the row's last
    token, which was never fed), for the next turns of one rollout. At most ``max_rows`` entries
    are kept (oldest dropped); an entry is used once, and rows that hold the same ids (two samples
    of a prompt that wrote the same turn) each keep their own, so their next turns both resume.
    ``hits`` counts contexts that were resumed."""

    def __init__(self, max_rows: int = 1024):
        self.max_rows = max_rows
        self.rows: dict[tuple[int, ...], list[_Stored]] = {}
        self.size = 0
        self.hits = 0

    def store(self, real: list[int], stored: _Stored) -> None:
        self.rows.setdefault(tuple(real), []).append(stored)
        self.size += 1
        while self.size > self.max_rows:
            self._take(next(iter(self.rows)))

    def _take(self, key: tuple[int, ...]) -> _Stored:
        entries = self.rows[key]
        stored = entries.pop(0)
        if not entries:
            del self.rows[key]
        self.size -= 1
        return stored

    def resume(self, model: Any, context: list[int]) -> KVBatch | None:
        """A one-row batch holding the longest stored prefix of ``context``, the rest pending."""
        best = max((key for key in self.rows if len(key) < len(context) and tuple(context[:len(key)]) == key),
                   key=len, default=None)
        if best is None:
            return None
        stored = self._take(best)
        self.hits += 1
        new = torch.tensor([context[len(best):]], device=stored.ids.device)
        return KVBatch(torch.cat([stored.ids, new], 1), torch.cat([stored.mask, torch.ones_like(new)], 1),
                       cache_from_tensors(model, stored.kv), new.shape[1])


def _join(model: Any, rows: list[DecodeRow], pad: int) -> KVBatch:
    """The joining rows as one batch: fresh contexts prefilled together, resumed ones merged in;
    ``rows`` is reordered to follow the batch."""
    fresh = [row for row in rows if row.resume is None]
    parts = [prefill(model, [row.context for row in fresh], pad)] if fresh else []
    parts += [row.resume for row in rows if row.resume is not None]
    order = fresh + [row for row in rows if row.resume is not None]
    batch = parts[0] if len(parts) == 1 else merge(model, parts, pad)
    rows[:] = order
    for row in rows:
        row.resume = None
    return batch


def _store(cache: TurnCache, row: DecodeRow, i: int, output: Any, batch: KVBatch, width: int, kept: int) -> None:
    """Row ``i``'s keys and values after its last turn: every column but its last token (never fed)."""
    end = width + kept - 1
    cache.store(row.context + row.turn_ids[:-1], _Stored(
        output.sequences[i:i + 1, :end],
        torch.cat([batch.mask[i:i + 1], batch.mask.new_ones((1, kept - 1))], 1),
        [(k[i:i + 1, :, :end].clone(), v[i:i + 1, :, :end].clone()) for k, v in cache_tensors(output.cache)]))


def decode(model: Any, rows: Iterable[DecodeRow], end_turn: Callable[[DecodeRow], list[int] | None], *,
           eos_token_ids: list[int], pad_token_id: int, sampling: Sampling, batch_size: int,
           decode_slice: int = DECODE_SLICE, min_saved_row_steps: int = MIN_SAVED_ROW_STEPS,
           cache: TurnCache | None = None, record_logprobs: bool = False) -> None:
    """Decode every row until ``end_turn`` says it is done (module docstring).

    Args:
        model: a causal LM with ``generate`` and whole weights (eval mode, no grad, a ZeRO-3
            gather: the caller's job). ``generate`` runs with ``synced_gpus`` off: each process
            makes as many calls as its own rows need, with no collective between them.
        rows: the rows, in queue order (each ``budget >= 1``).
        end_turn: called with a row whose turn just ended (``row.turn_ids`` ends with an eos, or
            filled the budget), its ``context`` still the turn's; returns the ids to append before
            the next turn (``[]`` is allowed) or None when the row is done.
        sampling: ``do_sample`` samples each row from ``row.generator`` (`RowSampler`), else greedy.
        cache: rows that are done store their keys and values there (see :class:`TurnCache`).
        record_logprobs: fill ``row.turn_logps`` with each sampled id's log-prob under the warped
            distribution it was drawn from (greedy: zeros).
    """
    if min(batch_size, decode_slice) < 1:
        raise ValueError("decode: batch_size and decode_slice must be >= 1")
    queue = deque(rows)
    sampler = RowSampler(sampling, record=record_logprobs) if sampling.do_sample else None
    recorder = sampler.recorder if sampler is not None else None
    # greedy: no processor list at all, so a caller's wrapper of `generate` may pass its own
    extra = {"logits_processor": LogitsProcessorList([sampler])} if sampler is not None else {}
    eos = set(eos_token_ids)
    base = GenerationConfig(do_sample=False, eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id,
                            use_cache=True, return_dict_in_generate=True)
    configs: dict[int, GenerationConfig] = {}  # max_new_tokens -> config
    active: list[DecodeRow] = []
    batch: KVBatch | None = None
    while queue or active:
        if queue and len(active) < batch_size:
            joining = [queue.popleft() for _ in range(min(batch_size - len(active), len(queue)))]
            part = _join(model, joining, pad_token_id)
            batch = part if batch is None else merge(model, [batch, part], pad_token_id)
            active += joining
        steps = min(decode_slice, min(row.budget - len(row.turn_ids) for row in active))
        if steps not in configs:
            configs[steps] = copy.deepcopy(base)
            configs[steps].max_new_tokens = steps
        if sampler is not None:
            sampler.generators = [row.generator for row in active]
        width = batch.ids.shape[1]
        stop = StoppingCriteriaList([SliceStop(width, steps, eos_token_ids, min_saved_row_steps)])
        output = model.generate(input_ids=batch.ids, attention_mask=batch.mask, cache=batch.cache,
                                generation_config=configs[steps], stopping_criteria=stop, synced_gpus=False, **extra)
        generated = output.sequences[:, width:].tolist()  # (B, columns <= steps), pads after an eos
        columns = len(generated[0])
        logps = recorder.take(generated) if recorder is not None else [[0.0] * len(new) for new in generated]
        generated_mask = torch.zeros((len(active), columns), dtype=batch.mask.dtype)
        keep, pending, pending_mask = [], [], []
        for i, (row, new) in enumerate(zip(active, generated)):
            end = next((j for j, token in enumerate(new) if token in eos), None)
            kept = new if end is None else new[:end + 1]
            generated_mask[i, :len(kept)] = 1
            row.turn_ids += kept
            row.turn_logps += logps[i][:len(kept)]
            # The last column is not in the cache yet: it leads the row's next input (a pad when
            # the row's eos came earlier).
            last_token, last_mask = (kept[-1], 1) if len(kept) == columns else (pad_token_id, 0)
            if end is None and len(row.turn_ids) < row.budget:  # inside its turn: go on
                follow: list[int] | None = []
            else:
                follow = end_turn(row)
                if follow is None:
                    if cache is not None and output.cache is not None:
                        _store(cache, row, i, output, batch, width, len(kept))
                    continue
                row.context = row.context + row.turn_ids + follow
                row.turn_ids, row.turn_logps = [], []
            keep.append(i)
            pending.append([last_token] + follow)
            pending_mask.append([last_mask] + [1] * len(follow))
        active = [active[i] for i in keep]
        if not active:
            batch = None
            continue
        batch = continue_rows(batch, output, keep, generated_mask, pending, pending_mask, pad_token_id)
