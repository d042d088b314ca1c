"""Stratified split sizes: how many rows of each stratum go to each split.

Guarantee: with ``N`` rows in all, ``N_h`` in stratum ``h`` and ``n_s`` rows wanted in split
``s`` (the splits' sizes add up to ``N``; rows not used form an extra ``unused`` part), the count
``c[h][s]`` satisfies ``|c[h][s] - N_h * n_s / N| < 1`` -- every entry is the floor or the ceiling
of its expected share -- while every row total equals ``N_h`` and every column total equals
``n_s`` exactly.

Method (controlled rounding): start from the floors; the leftover 0/1 units form a transportation
problem whose fractional remainders are a feasible fractional solution, so an integral one exists
(the constraint matrix is totally unimodular). A small max-flow finds it, trying larger
remainders first.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction


def largest_remainder(total: int, fractions: list[float]) -> list[int]:
    """Integer sizes adding up to ``total`` in proportion to ``fractions`` (Hamilton's method)."""
    weight = sum(Fraction(str(f)) for f in fractions)
    exact = [Fraction(str(f)) / weight * total for f in fractions]
    sizes = [int(share) for share in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for index in order[: total - sum(sizes)]:
        sizes[index] += 1
    return sizes


def _max_flow(capacity: dict[int, dict[int, int]], source: int, sink: int) -> dict[int, dict[int, int]]:
    """Edmonds-Karp on a small dict-of-dicts graph; returns the flow on every edge."""
    flow = {u: {v: 0 for v in edges} for u, edges in capacity.items()}
    for u, edges in capacity.items():
        for v in edges:
            flow.setdefault(v, {}).setdefault(u, 0)

    def residual(u: int, v: int) -> int:
        return capacity.get(u, {}).get(v, 0) - flow[u][v]

    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v in flow[u]:
                if v not in parent and residual(u, v) > 0:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow
        v = sink
        while v != source:
            u = parent[v]
            flow[u][v] += 1
            flow[v][u] -= 1
            v = u


def allocate(stratum_sizes: list[int], split_sizes: list[int]) -> list[list[int]]:
    """Counts ``c[h][s]`` for strata ``h`` and splits ``s`` (see the module guarantee).

    ``sum(split_sizes)`` must equal ``sum(stratum_sizes)``; pass the unused remainder as a split.
    """
    total = sum(stratum_sizes)
    if sum(split_sizes) != total:
        raise ValueError(f"split sizes add up to {sum(split_sizes)}, strata to {total}")
    if total == 0:
        return [[0] * len(split_sizes) for _ in stratum_sizes]
    expected = [[Fraction(n_h * n_s, total) for n_s in split_sizes] for n_h in stratum_sizes]
    counts = [[int(e) for e in row] for row in expected]
    n_strata, n_splits = len(stratum_sizes), len(split_sizes)
    source, sink = 0, 1 + n_strata + n_splits
    capacity: dict[int, dict[int, int]] = {source: {}}
    for h in range(n_strata):
        capacity[source][1 + h] = stratum_sizes[h] - sum(counts[h])
        candidates = [s for s in range(n_splits) if expected[h][s] != counts[h][s]]
        candidates.sort(key=lambda s: (-(expected[h][s] - counts[h][s]), s))
        capacity[1 + h] = {1 + n_strata + s: 1 for s in candidates}
    for s in range(n_splits):
        capacity[1 + n_strata + s] = {sink: split_sizes[s] - sum(counts[h][s] for h in range(n_strata))}
    flow = _max_flow(capacity, source, sink)
    for h in range(n_strata):
        for s in range(n_splits):
            counts[h][s] += max(0, flow[1 + h].get(1 + n_strata + s, 0))
    if [sum(row) for row in counts] != list(stratum_sizes) or [
        sum(counts[h][s] for h in range(n_strata)) for s in range(n_splits)
    ] != list(split_sizes):
        raise AssertionError("controlled rounding failed to meet the margins")  # cannot happen (TU matrix)
    return counts
