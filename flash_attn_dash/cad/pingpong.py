"""Ping-pong plans: the batch cut into two halves planned separately, so one half's all_to_all can run while
the other half computes (:func:`flash_attn_dash.cad.cad_attn_func` overlaps them when given such a plan)."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .grid import chunk_cost
from .plan import CADPlan, build_plan, check_doc_lens, check_int, check_options

__all__ = ["CADPingPongPlan", "plan_cad_pingpong"]


@dataclass(frozen=True)
class CADPingPongPlan:
    """Two CAD plans: ``halves[0]`` (ping) holds the first ``split[r]`` documents of each rank r, ``halves[1]``
    (pong) the rest; a half may leave a rank without documents."""

    halves: tuple[CADPlan, CADPlan]
    split: tuple[int, ...]
    fingerprint: str

    @property
    def world_size(self) -> int:
        return self.halves[0].world_size

    @property
    def doc_lens(self) -> tuple[tuple[int, ...], ...]:
        """The whole batch, as given to plan_cad_pingpong."""
        return tuple(a + b for a, b in zip(self.halves[0].doc_lens, self.halves[1].doc_lens))


def _split(table: tuple[tuple[int, ...], ...], causal: bool) -> tuple[int, ...]:
    """Per rank, the document count of ping: keeps the two halves' total pairs closest (ties: fewer in ping)."""
    ping = pong = 0
    split = []
    for lens in table:
        costs = [chunk_cost(0, n, n, causal) for n in lens]
        best = min(range(len(lens) + 1),
                   key=lambda j: (abs(ping + sum(costs[:j]) - pong - sum(costs[j:])), j))
        ping, pong = ping + sum(costs[:best]), pong + sum(costs[best:])
        split.append(best)
    return tuple(split)


def plan_cad_pingpong(
    doc_lens: Sequence[Sequence[int]],
    chunk_size: int = 2048,
    tolerance: float = 0.05,
    *,
    heads: int,
    heads_kv: int,
    head_dim: int,
    dtype_bytes: int = 2,
    memory_budget_bytes: int | None = None,
    causal: bool = True,
) -> CADPingPongPlan:
    """Plan a batch as two halves (arguments as :func:`flash_attn_dash.cad.plan_cad`).

    Each rank's documents are cut once, in order, where the running totals of the two halves' pairs stay
    closest. Both halves' buffers are alive together, so pong is planned in the memory ping leaves free.
    """
    table = check_doc_lens(doc_lens)
    chunk_size, tolerance, heads, heads_kv, head_dim, dtype_bytes = check_options(
        chunk_size, tolerance, heads, heads_kv, head_dim, dtype_bytes, causal)
    world = len(table)
    budget = None if memory_budget_bytes is None else check_int("memory_budget_bytes", memory_budget_bytes, 1)
    split = _split(table, causal)
    dims = (heads, heads_kv, head_dim, dtype_bytes)
    ping = build_plan(tuple(lens[:j] for lens, j in zip(table, split)), chunk_size, tolerance, causal, *dims,
                      None if budget is None else (budget,) * world)
    pong = build_plan(tuple(lens[j:] for lens, j in zip(table, split)), chunk_size, tolerance, causal, *dims,
                      None if budget is None else tuple(budget - m for m in ping.memory_bytes))
    fingerprint = hashlib.sha256(f"pingpong:{ping.fingerprint}:{pong.fingerprint}".encode()).hexdigest()
    return CADPingPongPlan((ping, pong), split, fingerprint)
