"""One model turn for many contexts: continuous batching over one KV cache, per-row sampling.

`generate_turns(model, contexts, budgets, ...)` is what ``rollout.engine: minimind`` runs in place
of ``GRPOTrainer._generate_single_turn`` (TRL's tool loop stays TRL's: it parses each turn, runs
the calls, appends the tool turn and asks for the next turn with the concatenated ids). Each
context decodes until its first eos (kept) or its token budget, like TRL's padded ``generate``
followed by its cut at the first eos and at ``max_completion_length``:

* contexts are encoded without repeats (`minimind_trl.envs.kv_batch.prefill`: identical contexts
  once, the prefix all share once, each cluster's prefix once) and decode ``decode_slice`` tokens
  per ``generate`` call, fewer once the rows that ended would decode pads for long (`SliceStop`);
  rows that end leave and make room for queued ones (no row waits for the longest);
* with a `TurnCache` (one per rollout), every finished row keeps its keys and values, and a later
  context that extends one (its prompt + completion + the tool turn TRL appended) feeds only the
  new ids: nothing of a trajectory is encoded twice across turns;
* sampling draws each row's tokens from its own ``torch.Generator``, seeded from the run seed,
  the rollout step, the context ids and the context's occurrence number in the call, so a
  trajectory does not depend on which rows share its batch (batch size, accumulation, engine
  slicing). The distribution is TRL's: the same temperature / top-k / top-p warpers of
  transformers, applied in that order, then one draw (inverse CDF: one uniform per row and token).
  With ``return_logprobs`` each token also comes with its log-probability under that warped
  distribution (`SampledLogps`; 0.0 when greedy).
"""

from __future__ import annotations

import copy
import hashlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minimind_trl.envs.kv_batch import (
    KVBatch,
    cache_from_tensors,
    cache_tensors,
    continue_rows,
    merge,
    prefill,
)

DECODE_SLICE = 32
"""Tokens per ``generate`` call (see `minimind_trl.envs.rollout.DECODE_SLICE`)."""
MIN_SAVED_ROW_STEPS = 32
"""A ``generate`` call ends early (`SliceStop`) once the rows that ended in it would otherwise
decode at least this many row-steps of pads by its last step. Measured on 2 CPU cores (demo
model, 32 rows): a row-step costs ~0.27 ms, ending a call (dropping rows copies the cache) ~5-10 ms."""


@dataclass(frozen=True)
class Sampling:
    """TRL's sampling settings (``GRPOConfig.temperature / top_k / top_p``) and the seed base.
    ``top_k`` 0 or None and ``top_p`` 1.0 switch those warpers off; ``do_sample`` False is greedy."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int | None = 0
    top_p: float = 1.0
    seed: int = 0


def row_seed(base: int, stream: str, context: list[int], occurrence: int) -> int:
    """A 63-bit seed for one row's turn: sha256 of (base seed, stream, occurrence, context ids);
    ``stream`` names the call (the trainer: its step and process)."""
    digest = hashlib.sha256(f"{base}:{stream}:{occurrence}:".encode() + array("q", context).tobytes()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class SampledLogps(LogitsProcessor):
    """Records ``log_softmax(scores)`` at the token each step appended (read from the next step's
    ``input_ids``; the last step's by `take`). Run last, its scores are the distribution the token
    was drawn from. One ``generate`` call at a time; `take` resets it."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []  # (B,) per step whose token is known
        self.pending: torch.Tensor | None = None  # (B, V) log-probs of the step whose token is not yet known

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.pending is not None:
            self.steps.append(self.pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def take(self, rows: list[list[int]]) -> list[list[float]]:
        """Log-probs of each row's new ids (``rows[i]``: the ids row i generated in the call, from
        its first new column, possibly cut short); empty lists if nothing was recorded."""
        steps, pending = self.steps, self.pending
        self.steps, self.pending = [], None
        if pending is not None:
            column = len(steps)
            last = torch.tensor([ids[column] if len(ids) > column else 0 for ids in rows], device=pending.device)
            steps.append(pending.gather(1, last[:, None]).squeeze(1))
        table = torch.stack(steps, 1).tolist() if steps else [[] for _ in rows]
        return [logps[:len(ids)] for logps, ids in zip(table, rows)]


class RowSampler(LogitsProcessor):
    """Samples every row from its own generator and returns scores that make greedy decoding pick
    the sampled token (0 there, -inf elsewhere). ``generators`` follow the batch's rows. With
    ``record``, ``recorder`` keeps the log-probs of the warped distribution each token was drawn from."""

    def __init__(self, sampling: Sampling, record: bool = False):
        warpers = []
        if sampling.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        self.warpers = warpers
        self.generators: list[torch.Generator] = []
        self.recorder = SampledLogps() if record else None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        if self.recorder is not None:
            self.recorder(input_ids, scores)
        cdf = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1)  # (B, V)
        # Inverse-CDF sampling: one uniform per row from the row's own generator (u < total, so a
        # zero-probability token, whose CDF step is flat, is never the first entry above u).
        u = torch.cat([torch.rand(1, generator=g, device=cdf.device) for g in self.generators])  # (B,)
        chosen = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).clamp_(max=cdf.shape[1] - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, chosen, 0.0)


class SliceStop(StoppingCriteria):
    """Ends a ``generate`` call of ``steps`` new tokens when ``ended x left >= min_saved`` and some
    row goes on: ``ended`` rows have written an eos in this call, ``left`` steps remain.
    ``generate`` keeps an ended row in the batch, decoding pads, until every row has ended or the
    call's last step; the engines drop it instead and continue the others in their next call.

    It fires after a step's tokens are appended, so every row's last token is a real one, and the
    call returns what a call of that many steps returns. With `generate_turns`' per-row streams a
    row's tokens do not depend on where the calls end (greedy: up to float rounding, like any
    change of batch; tested). The evaluation rollout samples from one stream for the whole batch,
    so there, as with any change of batching, other (equally valid, reproducible) samples come out."""

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
class _Row:
    index: int  # position in the caller's list
    budget: int
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)  # sampling log-prob of each id
    resume: KVBatch | None = None  # a stored row this context extends, with its new ids pending


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


def _join(model: Any, rows: list[_Row], contexts: list[list[int]], pad: int) -> KVBatch:
    """The joining rows as one batch: fresh contexts prefilled together, resumed ones merged in."""
    fresh = [row for row in rows if row.resume is None]
    parts = [prefill(model, [contexts[row.index] for row in fresh], pad)] if fresh else []
    parts += [row.resume for row in rows if row.resume is not None]
    order = fresh + [row for row in rows if row.resume is not None]
    batch = parts[0] if len(parts) == 1 else merge(model, parts, pad)
    rows[:] = order  # rows follow the batch's order
    for row in rows:
        row.resume = None
    return batch


def generate_turns(model: Any, contexts: list[list[int]], budgets: list[int], eos_token_ids: list[int],
                   pad_token_id: int, sampling: Sampling, stream: str = "", batch_size: int = 64,
                   decode_slice: int = DECODE_SLICE, cache: TurnCache | None = None,
                   min_saved_row_steps: int = MIN_SAVED_ROW_STEPS, return_logprobs: bool = False):
    """Generated ids of each context: up to and including its first eos, at most its budget.

    Args:
        model: a causal LM with ``generate`` (eval mode, no grad: the caller's job).
        contexts: token ids the model continues (a prompt, or prompt + completion + tool turn).
        budgets: new tokens allowed per context (0: nothing is generated).
        eos_token_ids: ids that end a turn.
        sampling: `Sampling`; ``stream`` enters the per-row seeds (`row_seed`).
        cache: finished rows are stored there and contexts that extend a stored row resume it.
        min_saved_row_steps: a ``generate`` call ends early when its ended rows would waste that
            many row-steps (`SliceStop`); the ids do not change.
        return_logprobs: also return, per context, each id's log-probability under the warped
            distribution it was drawn from (0.0 when greedy): ``(ids, logprobs)``.
    """
    if len(contexts) != len(budgets):
        raise ValueError("generate_turns: one budget per context")
    if min(batch_size, decode_slice) < 1:
        raise ValueError("generate_turns: batch_size and decode_slice must be >= 1")
    device = next(model.parameters()).device
    seen: dict[tuple[int, ...], int] = {}
    queue: deque[_Row] = deque()
    for i, (context, budget) in enumerate(zip(contexts, budgets)):
        if not context:
            raise ValueError(f"generate_turns: context {i} is empty")
        occurrence = seen.get(tuple(context), 0)
        seen[tuple(context)] = occurrence + 1
        generator = None
        if sampling.do_sample:
            generator = torch.Generator(device=device)
            generator.manual_seed(row_seed(sampling.seed, stream, context, occurrence))
        if budget > 0:
            queue.append(_Row(i, budget, generator, resume=cache.resume(model, context) if cache else None))
    sampler = RowSampler(sampling, record=return_logprobs) if sampling.do_sample else None
    processors = LogitsProcessorList([sampler] if sampler is not None else [])
    eos = set(eos_token_ids)
    base = GenerationConfig(do_sample=False, eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id,
                            use_cache=True, return_dict_in_generate=True)
    configs: dict[int, GenerationConfig] = {}
    results: list[list[int]] = [[] for _ in contexts]
    result_logps: list[list[float]] = [[] for _ in contexts]
    rows: list[_Row] = []
    batch: KVBatch | None = None
    while queue or rows:
        if queue and len(rows) < batch_size:
            joining = [queue.popleft() for _ in range(min(batch_size - len(rows), len(queue)))]
            part = _join(model, joining, contexts, pad_token_id)
            batch = part if batch is None else merge(model, [batch, part], pad_token_id)
            rows += joining
        steps = min(decode_slice, min(row.budget - len(row.ids) for row in rows))
        if steps not in configs:
            configs[steps] = copy.deepcopy(base)
            configs[steps].max_new_tokens = steps
        if sampler is not None:
            sampler.generators = [row.generator for row in rows]
        width = batch.ids.shape[1]
        stop = StoppingCriteriaList([SliceStop(width, steps, eos_token_ids, min_saved_row_steps)])
        output = model.generate(input_ids=batch.ids, attention_mask=batch.mask, cache=batch.cache,
                                generation_config=configs[steps], logits_processor=processors,
                                stopping_criteria=stop)
        generated = output.sequences[:, width:].tolist()  # (B, n <= steps), pads after an eos
        logps = [[0.0] * len(new) for new in generated]  # greedy, or not asked for
        if sampler is not None and sampler.recorder is not None:
            logps = sampler.recorder.take(generated)
        keep, last = [], []
        for i, (row, new) in enumerate(zip(rows, generated)):
            end = next((j for j, token in enumerate(new) if token in eos), None)
            kept = new if end is None else new[:end + 1]
            row.ids += kept
            row.logps += logps[i][:len(kept)]
            if end is not None or len(row.ids) >= row.budget:
                results[row.index] = row.ids
                result_logps[row.index] = row.logps
                if cache is not None and output.cache is not None:  # all but the row's last token is cached
                    width_i = width + len(kept) - 1
                    cache.store(contexts[row.index] + row.ids[:-1], _Stored(
                        output.sequences[i:i + 1, :width_i],
                        torch.cat([batch.mask[i:i + 1], batch.mask.new_ones((1, len(kept) - 1))], 1),
                        [(k[i:i + 1, :, :width_i].clone(), v[i:i + 1, :, :width_i].clone())
                         for k, v in cache_tensors(output.cache)]))
                continue
            keep.append(i)
            last.append(new[-1])  # not in the cache yet: the row's next input
        rows = [rows[i] for i in keep]
        if not rows:
            batch = None
            continue
        generated_mask = torch.ones((len(generated), len(generated[0])), dtype=batch.mask.dtype)  # no eos yet
        batch = continue_rows(batch, output, keep, generated_mask, [[t] for t in last], [[1]] * len(last),
                              pad_token_id)
    return (results, result_logps) if return_logprobs else results
