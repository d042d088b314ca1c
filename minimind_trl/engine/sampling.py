"""Sampling for the decode loop: TRL's settings, one seeded stream per row, sampled log-probs.

Every row draws its tokens from its own ``torch.Generator``, seeded from the run's seed, a stream
name (training: the rollout step and process; evaluation: ``"eval"``), the row's context ids and
the context's occurrence number in the call, or a row key the caller gives instead (training
with ``sampling_streams: global_row``: the row's place in the whole rollout, the stream then
without the process, so the same seed samples the same trajectories on any number of processes).
A trajectory then does not depend on which rows share its batch (batch size, accumulation, where
the engine cuts its ``generate`` calls). The
distribution is TRL's: the temperature / top-k / top-p warpers of transformers, in that order,
then one inverse-CDF draw (one uniform per row and token).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


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
    """A 63-bit seed for one row's turn: sha256 of (base seed, stream, occurrence, context ids)."""
    digest = hashlib.sha256(f"{base}:{stream}:{occurrence}:".encode() + array("q", context).tobytes()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def row_generators(contexts: list[list[int]], sampling: Sampling, stream: str, device: torch.device,
                   row_keys: list[int] | None = None) -> list[torch.Generator | None]:
    """One generator per context, seeded by :func:`row_seed`; all None when greedy. Its
    ``occurrence`` is ``row_keys[i]`` when given (a caller's row identity, e.g. the row's place in
    the whole rollout), else how many identical contexts came before it in ``contexts`` (so the
    samples of one prompt differ)."""
    if not sampling.do_sample:
        return [None] * len(contexts)
    if row_keys is not None and len(row_keys) != len(contexts):
        raise ValueError("row_generators: one row key per context")
    seen: dict[tuple[int, ...], int] = {}
    generators = []
    for i, context in enumerate(contexts):
        occurrence = seen.get(tuple(context), 0)
        seen[tuple(context)] = occurrence + 1
        generator = torch.Generator(device=device)
        key = occurrence if row_keys is None else row_keys[i]
        generator.manual_seed(row_seed(sampling.seed, stream, context, key))
        generators.append(generator)
    return generators


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
