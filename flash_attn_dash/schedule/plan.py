"""A backward schedule for one call: every CTA's ordered tasks and every dQ tile's addition order, with its invariant
checks."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .orders import SCHEDULES, Orders, build_orders
from .simulate import Deadlock, walk
from .tiles import MASKS, TileGrid


class ScheduleError(AssertionError):
    """An invariant of a plan is violated (a kernel following it would compute wrong results or hang)."""


class Plan:
    """The schedule of one backward call, as the kernel executes it.

    Tasks are ``(batch, head, n_block, m_block)``; each CTA walks its list in order.  Steps are stored flat, CTA-major:
    the steps of CTA ``g`` are ``cta_ptr[g]:cta_ptr[g+1]`` of the ``step_*`` arrays, in program order.
    """

    def __init__(self, grid: TileGrid, batch: int, heads: int, heads_kv: int, num_sms: int, schedule: str,
                 orders: Orders) -> None:
        self.grid, self.batch, self.heads, self.heads_kv = grid, batch, heads, heads_kv
        self.num_sms, self.schedule, self._orders = num_sms, schedule, orders
        self.num_ctas: int = orders.num_ctas
        self.schedule_used: str = orders.schedule_used
        self.description: str = orders.description
        self.fallback: str | None = orders.fallback
        tile = np.repeat(np.arange(orders.tile_len.size, dtype=np.int64), orders.tile_len)
        self.step_cta = orders.tile_cta[tile]
        self.step_round = orders.tile_round[tile]
        self.step_b, self.step_h, self.step_n = orders.tile_b[tile], orders.tile_h[tile], orders.tile_n[tile]
        self.step_m, self.step_rank = orders.step_m, orders.step_rank
        self.cta_ptr = np.searchsorted(self.step_cta, np.arange(self.num_ctas + 1)).astype(np.int64)

    @property
    def num_steps(self) -> int:
        return int(self.step_m.size)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, M, N)``, the shape of :meth:`trace_array`."""
        return self.batch, self.heads, self.grid.num_m, self.grid.num_n

    def _dq_tile(self) -> np.ndarray:
        return (self.step_b * self.heads + self.step_h) * self.grid.num_m + self.step_m

    @cached_property
    def cta_tiles(self) -> list[list[tuple[int, int, int]]]:
        """Per CTA, its K/V tiles ``(b, h, n)`` in order, including task-less ones (they still write dK/dV)."""
        o = self._orders
        rows = np.stack([o.tile_b, o.tile_h, o.tile_n], axis=1).tolist()
        bounds = np.searchsorted(o.tile_cta, np.arange(self.num_ctas + 1)).tolist()
        return [[tuple(x) for x in rows[bounds[g]:bounds[g + 1]]] for g in range(self.num_ctas)]

    @cached_property
    def cta_tasks(self) -> list[list[tuple[int, int, int, int]]]:
        """Per CTA, its ordered tasks ``(b, h, n_block, m_block)``."""
        rows = np.stack([self.step_b, self.step_h, self.step_n, self.step_m], axis=1).tolist()
        ptr = self.cta_ptr.tolist()
        return [[tuple(x) for x in rows[ptr[g]:ptr[g + 1]]] for g in range(self.num_ctas)]

    def trace_array(self) -> np.ndarray:
        """int32 array (B, H, M, N): ``[b, h, m, rank] = n``, -1 for unused slots (the kernel's debug-trace layout)."""
        trace = np.full(self.shape, -1, dtype=np.int32)
        trace[self.step_b, self.step_h, self.step_m, self.step_rank] = self.step_n
        return trace

    def dq_order(self, b: int, h: int, m: int) -> list[int]:
        """The K/V tiles n adding into dQ tile (b, h, m), in rank order."""
        return [int(n) for n in self._trace[b, h, m] if n >= 0]

    @cached_property
    def _trace(self) -> np.ndarray:
        return self.trace_array()

    def rank(self, b: int, h: int, n: int, m: int) -> int:
        """Rank of the contribution of K/V tile n to dQ tile (b, h, m); ValueError if n does not touch m."""
        hits = np.flatnonzero(self._trace[b, h, m] == n)
        if hits.size != 1:
            raise ValueError(f"K/V tile n={n} does not add into dQ tile (b={b}, h={h}, m={m})")
        return int(hits[0])

    def rank_predecessor(self) -> np.ndarray:
        """Per step, the index of the step with rank - 1 in the same dQ tile, or -1 for rank 0 (needs valid ranks)."""
        key = self._dq_tile() * self.grid.num_n + self.step_rank
        order = np.argsort(key, kind="stable")
        pred = np.full(self.num_steps, -1, dtype=np.int64)
        follows = np.diff(key[order]) == 1
        follows &= self.step_rank[order[1:]] > 0
        pred[order[1:][follows]] = order[:-1][follows]
        return pred

    def check(self) -> None:
        """Raise :class:`ScheduleError` unless the plan is valid.

        Checked: every K/V tile appears exactly once in the CTA lists; every visible (m, n) tile is visited exactly once
        and nothing else; the ranks of every dQ tile are exactly ``0 .. K_m - 1``; the wait-for graph of all CTAs
        co-resident is acyclic; and every rank predecessor runs in the same or an earlier persistent round.  The last
        one is what makes GQA safe: dK/dV semaphores wait on the same n of the previous query head, an earlier
        tile/chunk; within one round a path can only move to a lower (batch, head) through such a wait, so no cycle can
        close through them.  On the dynamic grid a round is one tile, so it says that every predecessor lies in an
        earlier tile, which keeps every claim order deadlock-free (:mod:`.orders`), not only the predicted one.
        """
        grid, o = self.grid, self._orders
        num_m, num_n = grid.num_m, grid.num_n
        tiles = (o.tile_b * self.heads + o.tile_h) * num_n + o.tile_n
        if tiles.size != self.batch * self.heads * num_n or np.unique(tiles).size != tiles.size:
            raise ScheduleError(f"{self.schedule}: the CTA lists do not hold every K/V tile exactly once")
        if np.any(o.tile_cta[1:] < o.tile_cta[:-1]) or o.tile_cta.size and o.tile_cta.max() >= self.num_ctas:
            raise ScheduleError(f"{self.schedule}: tiles are not laid out CTA-major within {self.num_ctas} CTAs")
        if self.num_steps and (self.step_m.min() < 0 or self.step_m.max() >= num_m):
            raise ScheduleError(f"{self.schedule}: a step visits a Q tile outside [0, {num_m})")
        masked = (self.step_m < grid.m_min()[self.step_n]) | (self.step_m >= grid.m_end()[self.step_n])
        if np.any(masked):
            bad = int(np.argmax(masked))
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} visits a fully masked tile")
        visits = self._dq_tile() * num_n + self.step_n
        expected = self.batch * self.heads * grid.num_steps_per_head()
        if np.unique(visits).size != visits.size or visits.size != expected:
            raise ScheduleError(f"{self.schedule}: {visits.size} steps ({np.unique(visits).size} distinct) for "
                                f"{expected} visible (m, n) tiles")
        k_m = grid.contributions()[self.step_m]
        if np.any(self.step_rank < 0) or np.any(self.step_rank >= k_m):
            bad = int(np.argmax((self.step_rank < 0) | (self.step_rank >= k_m)))
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} has a rank outside "
                                f"[0, K_m={int(k_m[bad])})")
        ranks = self._dq_tile() * num_n + self.step_rank
        if np.unique(ranks).size != ranks.size:
            raise ScheduleError(f"{self.schedule}: two contributions share a rank in one dQ tile")
        try:
            walk(self, 1, 1)
        except Deadlock as err:
            raise ScheduleError(f"{self.schedule}: deadlock with {self.num_ctas} co-resident CTAs: {err}") from None
        pred = self.rank_predecessor()
        has = pred >= 0
        if np.any(self.step_round[pred[has]] > self.step_round[has]):
            bad = int(np.flatnonzero(has)[np.argmax(self.step_round[pred[has]] > self.step_round[has])])
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} waits on a later persistent round")

    def describe_step(self, step: int) -> str:
        """Readable identity of step ``step`` (CTA, tile, row, rank) for error messages."""
        return (f"(cta={int(self.step_cta[step])}, b={int(self.step_b[step])}, h={int(self.step_h[step])}, "
                f"n={int(self.step_n[step])}, m={int(self.step_m[step])}, rank={int(self.step_rank[step])})")

    def __repr__(self) -> str:
        return (f"Plan({self.schedule!r} -> {self.schedule_used!r}, {self.grid.describe()}, "
                f"sq={self.grid.seqlen_q}, sk={self.grid.seqlen_k}, tiles={self.grid.block_m}x{self.grid.block_n}, "
                f"B={self.batch}, H={self.heads}, G={self.num_ctas}, steps={self.num_steps})")


def build_plan(mask: str, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, batch: int, heads: int,
               num_sms: int, schedule: str, heads_kv: int | None = None,
               costs: tuple[float, float] | None = None, claim_heads: int | None = None,
               window: tuple[int, int] = (-1, -1)) -> Plan:
    """Build the plan of ``schedule`` for one backward call.

    ``heads`` are query heads; ``heads_kv`` (default ``heads``) must divide it.  GQA changes nothing for dQ (dQ tiles
    are per query head); it only adds dK/dV semaphores, which :meth:`Plan.check` shows cannot deadlock.  ``num_sms`` is
    the persistent grid size the kernel launches with (SM count minus ``sm_margin``); the grid is ``min(num_sms,
    #tiles)``.  ``costs`` = ``(c, r)`` only shape the dynamic grid's predicted claims (ascending/descending; see
    :mod:`.orders`) and ``claim_heads`` overrides its claim group (default: the kernel's rule).  ``window`` is
    FlashAttention's ``window_size`` (:class:`.tiles.TileGrid`); on a band every schedule is defined.  The result is a
    pure function of the arguments.
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    grid = TileGrid(mask, seqlen_q, seqlen_k, block_m, block_n, window)
    for name, value in (("batch", batch), ("heads", heads), ("num_sms", num_sms)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    heads_kv = heads if heads_kv is None else heads_kv
    if isinstance(heads_kv, bool) or not isinstance(heads_kv, (int, np.integer)) or heads_kv < 1 or heads % heads_kv:
        raise ValueError(f"heads_kv must be a positive divisor of heads={heads}, got {heads_kv!r}")
    if claim_heads is not None and (isinstance(claim_heads, bool) or not isinstance(claim_heads, (int, np.integer))
                                    or claim_heads < 1):
        raise ValueError(f"claim_heads must be a positive integer or None, got {claim_heads!r}")
    orders = build_orders(grid, int(batch), int(heads), int(num_sms), schedule, costs, claim_heads)
    return Plan(grid, int(batch), int(heads), int(heads_kv), int(num_sms), schedule, orders)
