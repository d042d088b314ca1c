"""Rows of token ids decoded together over one KV cache: encode prompts, add rows, drop rows.

Layout of a :class:`KVBatch` (B rows, W columns)::

    ids, mask     [B, W]            every column the rows have seen (mask 0 on pads)
    cache         [B, H, W - P, D]  keys / values of the first W - P columns, per layer
    pending = P                     the last P columns, fed by the next forward

``model.generate(input_ids=ids, attention_mask=mask, cache=cache)`` feeds exactly the pending
columns. Rows of different lengths are aligned by pads *inside* the sequence (wherever a row is
shorter, not only at its start); positions come from the mask (``cumsum - 1``), so every real
token sits at the position it would have without pads, and the pads' cache entries are zeros
that the mask hides.

Encoding (:func:`prefill`) does no redundant work: identical prompts (the samples of one task)
are encoded once, the prefix every prompt shares once, the prefix a cluster of prompts shares
(the same system turn and tool list, different questions) once per cluster, and the rest in
length-sorted groups with little padding; each row's cache is then assembled from those pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

MAX_PAD_FRACTION = 0.125
"""A prefill group takes the next (shorter) prompt only while pads stay under this share of its
tokens: pads cost as much compute as real tokens."""
MAX_GROUP_TOKENS = 16384
"""Tokens (pads included) per prefill forward, to bound activation memory."""
MIN_CLUSTER_PREFIX = 32
"""Prompts that share this many tokens past the prefix common to all (the same system turn and
tool list, say) have their shared part encoded once."""


@dataclass
class KVBatch:
    """See the module docstring. ``cache`` is None only when no column is cached yet."""

    ids: torch.Tensor  # (B, W)
    mask: torch.Tensor  # (B, W)
    cache: DynamicCache | None
    pending: int

    @property
    def cached(self) -> int:
        return self.ids.shape[1] - self.pending


def left_padded(rows: list[list[int]], pad: int, masks: list[list[int]] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, max len] with each row right-aligned; mask 0 on the pads before it (and
    wherever ``masks`` gives 0 inside a row)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = torch.tensor(masks[i]) if masks is not None else 1
    return ids, mask


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving at least one token of each prompt uncached."""
    first, length = prompts[0], min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        length = next((i for i in range(length) if prompt[i] != first[i]), length)
    return max(length, 0)


def length_groups(lengths: list[int], max_pad_fraction: float = MAX_PAD_FRACTION,
                  max_tokens: int = MAX_GROUP_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` in groups, longest first, each padded to its longest member with
    pads < ``max_pad_fraction`` of its tokens and at most ``max_tokens`` tokens (one row alone
    may exceed it)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if groups:
            group = groups[-1]
            longest, size = lengths[group[0]], len(group) + 1
            pads = size * longest - sum(lengths[j] for j in group) - lengths[i]
            if pads <= max_pad_fraction * size * longest and size * longest <= max_tokens:
                group.append(i)
                continue
        groups.append([i])
    return groups


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers with room to spare along the
    sequence: an update writes the new positions in place (the buffers grow by a quarter plus
    128 positions when full) where ``DynamicLayer`` concatenates, i.e. copies the whole cache, at
    every decode step. ``keys`` / ``values`` are views of the filled part."""

    def __init__(self, **kwargs):
        self._keys = self._values = None
        self._length = 0
        super().__init__(**kwargs)

    def _filled(self, buffer: torch.Tensor | None) -> torch.Tensor | None:
        """The filled part of a buffer (None, or the empty 1-D placeholder, as they are)."""
        return buffer if buffer is None or buffer.dim() != 4 else buffer[:, :, :self._length]

    @property
    def keys(self) -> torch.Tensor | None:
        return self._filled(self._keys)

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:  # whole-cache edits (select rows, crop)
        self._keys = tensor
        self._length = tensor.shape[-2] if tensor is not None and tensor.dim() == 4 else 0

    @property
    def values(self) -> torch.Tensor | None:
        return self._filled(self._values)

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values = tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, new = self._length, key_states.shape[-2]
        if self._keys is None or self._keys.dim() != 4 or start + new > self._keys.shape[-2]:
            capacity = start + new + max(128, start // 4)
            grown = [t.new_empty(t.shape[:2] + (capacity, t.shape[-1])) for t in (key_states, value_states)]
            if start:
                grown[0][:, :, :start] = self._keys[:, :, :start]
                grown[1][:, :, :start] = self._values[:, :, :start]
            self._keys, self._values = grown
        self._keys[:, :, start:start + new] = key_states
        self._values[:, :, start:start + new] = value_states
        self._length = start + new
        return self.keys, self.values


def cache_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) [B, H, T, D] per layer."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(model, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A ``DynamicCache`` of :class:`GrowingLayer` holding ``tensors``."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() for _ in cache.layers]
    for layer, (keys, values) in enumerate(tensors):
        cache.update(keys, values, layer)
    return cache


def prefix_clusters(prompts: list[list[int]], start: int, min_shared: int = MIN_CLUSTER_PREFIX
                    ) -> list[tuple[list[int], int]]:
    """(members, prefix length) of prompts that share at least ``start + min_shared`` leading
    tokens: runs of the lexicographically sorted prompts, each run's shared prefix (leaving one
    token of each member) to be encoded once. The prompts that share less with every other one
    come last, together, with the prefix ``start``."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    runs: list[tuple[list[int], int]] = []
    for i in order:
        if runs:
            members, shared = runs[-1]
            common = min(shared, shared_prefix_length([prompts[members[-1]], prompts[i]]))
            if common >= start + min_shared:
                runs[-1] = (members + [i], common)
                continue
        runs.append(([i], len(prompts[i]) - 1))
    clusters = [run for run in runs if len(run[0]) > 1]
    loose = [run[0][0] for run in runs if len(run[0]) == 1]
    return clusters + ([(loose, start)] if loose else [])


def _encode(model, ids: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys / values [B, H, past + T, D] after feeding ``ids`` [B, T] over ``past`` (one row,
    repeated over the batch; positions continue from it, and from ``mask`` [B, T] when given)."""
    rows, before = ids.shape[0], past[0][0].shape[2] if past else 0
    cache = cache_from_tensors(model, [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                                       for k, v in past]) if past else None
    attention = positions = None
    if mask is not None:
        attention = torch.cat([mask.new_ones((rows, before)), mask], 1)
        positions = (before + mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True,
                logits_to_keep=1)
    return cache_tensors(out.cache)


def prefill(model, prompts: list[list[int]], pad: int) -> KVBatch:
    """Encode all but the last token of each prompt; the batch's one pending column is each
    prompt's last token. Rows are left-padded; nothing is encoded twice: identical prompts once,
    the prefix all prompts share once, each cluster's prefix (`prefix_clusters`: e.g. the same
    system turn and tool list) once, the rest of each prompt in length-sorted groups."""
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    unique = [list(p) for p in distinct]
    ids, mask = (t.to(device) for t in left_padded(unique, pad))
    n, cached = len(unique), ids.shape[1] - 1
    if cached == 0:  # one-token prompts: nothing to cache
        return KVBatch(ids[rows], mask[rows], None, ids.shape[1])

    layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def place(row: int, start: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy kv [1, H, T, D] (prompt positions start .. start + T) into row's columns."""
        nonlocal layers
        if layers is None:
            layers = [tuple(t.new_zeros((n, t.shape[1], cached, t.shape[3])) for t in pair) for pair in kv]
        column = cached - (len(unique[row]) - 1) + start
        for (keys, values), (k, v) in zip(layers, kv):
            keys[row, :, column:column + k.shape[2]] = k[0]
            values[row, :, column:column + v.shape[2]] = v[0]

    shared = shared_prefix_length(unique)
    common = _encode(model, torch.tensor([unique[0][:shared]], device=device), [], None) if shared else []
    for members, prefix in prefix_clusters(unique, shared):
        head = unique[members[0]]
        past = common
        if prefix > shared:
            past = _encode(model, torch.tensor([head[shared:prefix]], device=device), common, None)
        for row in members:
            if past:
                place(row, 0, past)
        tails = [unique[row][prefix:-1] for row in members]  # may be empty
        for group in length_groups([len(t) for t in tails]):
            longest = len(tails[group[0]])
            if longest == 0:
                continue
            g_ids, g_mask = (t.to(device) for t in left_padded([tails[j] for j in group], pad))
            encoded = _encode(model, g_ids, past, g_mask)
            for r, j in enumerate(group):  # the row's real tail positions, not the group's pads
                start = prefix + longest - len(tails[j])
                place(members[j], prefix, [(k[r:r + 1, :, start:], v[r:r + 1, :, start:]) for k, v in encoded])
    select = torch.tensor(rows, device=device)  # repeats identical prompts; pads' entries stay zero
    tensors = [(keys[select], values[select]) for keys, values in layers]
    return KVBatch(ids[select], mask[select], cache_from_tensors(model, tensors), 1)


def continue_rows(batch: KVBatch, output: Any, keep: list[int], generated_mask: torch.Tensor,
                  pending: list[list[int]], pending_mask: list[list[int]], pad: int) -> KVBatch:
    """The batch after a ``generate`` call on ``batch``: only rows ``keep``; their generated columns
    but the last (the last sampled token was never fed: it leads ``pending``), masked by
    ``generated_mask`` (B, columns); then each kept row's ``pending`` ids (its last token, then
    anything appended: a tool turn), left-padded. Compacted (see `compact`)."""
    index = torch.tensor(keep, device=batch.ids.device)
    if output.cache is not None:
        output.cache.batch_select_indices(index)
    new_ids, new_mask = left_padded(pending, pad, pending_mask)
    generated_mask = generated_mask[keep, :-1].to(index.device)
    ids = torch.cat([output.sequences[index, :-1], new_ids.to(index.device)], 1)
    mask = torch.cat([batch.mask[index], generated_mask, new_mask.to(index.device)], 1)
    return compact(KVBatch(ids, mask, output.cache, new_ids.shape[1]))


def compact(batch: KVBatch, slack: float = 0.25) -> KVBatch:
    """Drop the pads inside the cached columns once the cache is wider than ``1 + slack`` times
    the longest row's real cached tokens (rows that stay inside a turn get a pad for every
    tool-turn position another row appends). Each row's cached tokens keep their order, moved
    right against the pending columns; positions come from the mask, so they do not change."""
    cached = batch.cached
    if batch.cache is None or cached == 0:
        return batch
    real = batch.mask[:, :cached].bool()  # (B, C)
    width = int(real.sum(1).max())
    if cached <= (1 + slack) * width:
        return batch
    # Stable sort of pads (0) before real tokens (1): the last `width` columns right-align each row.
    source = torch.sort(real.to(torch.int8), dim=1, stable=True).indices[:, cached - width:]  # (B, width)
    ids = torch.cat([batch.ids[:, :cached].gather(1, source), batch.ids[:, cached:]], 1)
    mask = torch.cat([batch.mask[:, :cached].gather(1, source), batch.mask[:, cached:]], 1)
    hide = mask[:, None, :width, None] == 0
    for layer in batch.cache.layers:
        keys, values = layer.keys, layer.values
        index = source[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        layer.keys = keys.gather(2, index).masked_fill_(hide, 0.0)
        layer.values = values.gather(2, index).masked_fill_(hide, 0.0)
    return KVBatch(ids, mask, batch.cache, batch.pending)


def merge(model, batches: list[KVBatch], pad: int) -> KVBatch:
    """The rows of ``batches``, in order, as one batch: each batch's cached and pending columns are
    widened on their left with pads (cache entries zero) to the widest. One copy of every row
    however many batches join (merging them two at a time would copy the first rows once per join),
    and the same result as merging them two at a time."""
    if not batches:
        raise ValueError("merge: no batches")
    cached = max(batch.cached for batch in batches)
    pending = max(batch.pending for batch in batches)
    ids, masks, caches = [], [], []
    for batch in batches:
        grow_cached, grow_pending = cached - batch.cached, pending - batch.pending
        rows = batch.ids.shape[0]

        def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
            def pads(k: int) -> torch.Tensor:
                return t.new_full((rows, k), fill)
            return torch.cat([pads(grow_cached), t[:, :batch.cached], pads(grow_pending), t[:, batch.cached:]], 1)

        ids.append(widen(batch.ids, pad))
        masks.append(widen(batch.mask, 0))
        caches.append([(F.pad(k, (0, 0, grow_cached, 0)), F.pad(v, (0, 0, grow_cached, 0)))
                       for k, v in cache_tensors(batch.cache)] if batch.cache is not None else None)
    like = next((kv for kv in caches if kv is not None), None)
    if like is None:
        return KVBatch(torch.cat(ids), torch.cat(masks), None, pending)
    for i, kv in enumerate(caches):  # a batch with nothing cached yet: zeros
        if kv is None:
            caches[i] = [tuple(t.new_zeros((ids[i].shape[0],) + t.shape[1:]) for t in pair) for pair in like]
    tensors = [(torch.cat([kv[layer][0] for kv in caches]), torch.cat([kv[layer][1] for kv in caches]))
               for layer in range(len(like))]
    return KVBatch(torch.cat(ids), torch.cat(masks), cache_from_tensors(model, tensors), pending)
