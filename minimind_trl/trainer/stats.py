"""Per-optimizer-step figures, accumulated over micro-batches and reduced over processes.

Every process must add the same names in each step (they all run the same code path on the
same number of micro-batches); :meth:`StepAccumulator.reduce` is then one collective sum plus
one gather, whatever the number of figures.
"""

from __future__ import annotations

from collections import defaultdict

import torch

Number = float | int | torch.Tensor


def _as_tensor(value: Number) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).reshape(())
    return torch.tensor(float(value), dtype=torch.float64)


class StepAccumulator:
    """Sums, weighted means, minima and maxima of named figures for one optimizer step."""

    def __init__(self) -> None:
        self._sums: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._means: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
        self._mins: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._maxs: dict[str, list[torch.Tensor]] = defaultdict(list)

    def add_sum(self, name: str, value: Number) -> None:
        self._sums[name].append(_as_tensor(value))

    def add_mean(self, name: str, value: Number, weight: Number) -> None:
        """Weighted mean over micro-batches and processes (weight e.g. the number of action tokens)."""
        self._means[name].append((_as_tensor(value), _as_tensor(weight)))

    def add_min(self, name: str, value: Number) -> None:
        self._mins[name].append(_as_tensor(value))

    def add_max(self, name: str, value: Number) -> None:
        self._maxs[name].append(_as_tensor(value))

    def __bool__(self) -> bool:
        return bool(self._sums or self._means or self._mins or self._maxs)

    def reduce(self, accelerator=None) -> dict[str, float]:
        """The step's figures over all micro-batches and (with ``accelerator``) all processes.

        A mean whose total weight is 0 reports NaN-free 0.0.
        """
        device = accelerator.device if accelerator is not None else torch.device("cpu")
        sum_names, mean_names = sorted(self._sums), sorted(self._means)
        min_names, max_names = sorted(self._mins), sorted(self._maxs)
        sum_parts = [torch.stack(self._sums[n]).sum() for n in sum_names]
        for name in mean_names:
            values, weights = zip(*self._means[name])
            values, weights = torch.stack(values), torch.stack(weights)
            sum_parts += [(values * weights).sum(), weights.sum()]
        extreme = [torch.stack(self._mins[n]).min() for n in min_names]
        extreme += [-torch.stack(self._maxs[n]).max() for n in max_names]  # max = -min(-x)
        sums = torch.stack(sum_parts).to(device) if sum_parts else torch.zeros(0, dtype=torch.float64, device=device)
        lows = torch.stack(extreme).to(device) if extreme else torch.zeros(0, dtype=torch.float64, device=device)
        if accelerator is not None and accelerator.num_processes > 1:
            sums = accelerator.reduce(sums, reduction="sum")
            lows = accelerator.gather(lows.unsqueeze(0)).amin(dim=0)
        sums, lows = sums.tolist(), lows.tolist()
        out: dict[str, float] = {}
        for i, name in enumerate(sum_names):
            out[name] = sums[i]
        offset = len(sum_names)
        for j, name in enumerate(mean_names):
            numerator, weight = sums[offset + 2 * j], sums[offset + 2 * j + 1]
            out[name] = numerator / weight if weight else 0.0
        for i, name in enumerate(min_names):
            out[name] = lows[i]
        for i, name in enumerate(max_names):
            out[name] = -lows[len(min_names) + i]
        return out
