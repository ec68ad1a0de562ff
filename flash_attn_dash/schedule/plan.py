"""A backward schedule for one call: every CTA's ordered tasks and every dQ tile's addition order, with its invariant
checks."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .orders import SCHEDULES, Orders, build_orders, rank_predecessors
from .simulate import Deadlock, walk
from .tiles import MASKS, TileGrid


class ScheduleError(AssertionError):
    """An invariant of a plan is violated (a kernel following it would compute wrong results or hang)."""


class Plan:
    """The schedule of one backward call, as the kernel executes it.

    Tasks are ``(batch, head, n_block, m_block)``; each CTA walks its list in order.  Steps are stored flat, CTA-major:
    the steps of CTA ``g`` are ``cta_ptr[g]:cta_ptr[g+1]`` of the ``step_*`` arrays, in program order.  ``grid`` is
    the call's tile grid; a varlen pack (:class:`.pack_plan.PackPlan`) has none, its ``batch`` is the number of
    sequences and its tile space is its :class:`.packs.PackTiles`.  ``fold`` > 1: the GQA sibling fold, whose K/V tiles
    are ``(batch, K/V head, n)`` and run ``fold`` query heads each (:func:`.orders.fold_siblings`).
    """

    def __init__(self, grid: TileGrid | None, batch: int, heads: int, heads_kv: int, num_sms: int, schedule: str,
                 orders: Orders) -> None:
        self.grid, self.batch, self.heads, self.heads_kv = grid, batch, heads, heads_kv
        self.num_sms, self.schedule, self._orders = num_sms, schedule, orders
        self.num_ctas: int = orders.num_ctas
        self.fold: int = orders.fold
        self.schedule_used: str = orders.schedule_used
        self.description: str = orders.description
        self.fallback: str | None = orders.fallback
        tile = np.repeat(np.arange(orders.tile_len.size, dtype=np.int64), orders.tile_len)
        self.step_cta = orders.tile_cta[tile]
        self.step_round = orders.tile_round[tile]
        self.step_b, self.step_n = orders.tile_b[tile], orders.tile_n[tile]
        self.step_h = orders.tile_h[tile] if orders.step_h is None else orders.step_h
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
        """Per CTA, its K/V tiles ``(b, h, n)`` in order, including task-less ones (they still write dK/dV); ``h`` is the
        K/V head when folded."""
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
        return rank_predecessors(self._dq_tile(), self.step_rank)

    # The tile space as the checks see it: flat ids and per-step bounds (a pack overrides these, PackPlan).
    def _tile_heads(self) -> int:
        """Heads of the tile space: the query heads, or the K/V heads when folded."""
        return self.heads_kv if self.fold > 1 else self.heads

    def kv_tile_ids(self, b: np.ndarray, h: np.ndarray, n: np.ndarray) -> np.ndarray:
        """A unique id per K/V tile ``(b, h, n)`` (arrays broadcast), in ``[0, _num_kv_tiles())``: the layout of the
        kernel's per-tile workspace."""
        return (b * self._tile_heads() + h) * self.grid.num_n + n

    def _num_kv_tiles(self) -> int:
        return self.batch * self._tile_heads() * self.grid.num_n

    def _num_n(self, b: np.ndarray):
        """N of the sequence of each tile (one number for a dense call)."""
        return self.grid.num_n

    def _num_m(self, b: np.ndarray):
        """M of the sequence of each step (one number for a dense call)."""
        return self.grid.num_m

    def _m_range(self, b: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(m_min, m_end)`` of K/V tile n of sequence b."""
        return self.grid.m_min()[n], self.grid.m_end()[n]

    def _contributions(self, b: np.ndarray, m: np.ndarray) -> np.ndarray:
        """``K_m`` of dQ tile m of sequence b."""
        return self.grid.contributions()[m]

    def _num_visible(self) -> int:
        """Visible (m, n) tiles over all sequences and heads."""
        return self.batch * self.heads * self.grid.num_steps_per_head()

    def check(self) -> None:
        """Raise :class:`ScheduleError` unless the plan is valid.

        Checked: every K/V tile appears exactly once in the CTA lists; every visible (m, n) tile is visited exactly once
        and nothing else; the ranks of every dQ tile are exactly ``0 .. K_m - 1``; the wait-for graph of all CTAs
        co-resident is acyclic; and every rank predecessor, and with GQA every dK/dV predecessor (the previous query
        head of the same K/V head, sequence and n: the kernel's ``dkv_sem`` order; none when folded), runs in the same
        or an earlier persistent round.  The round rule is what makes GQA safe: within one round a path can only move to a lower
        (batch, head) through a dK/dV wait, so no cycle can close through them.  On the dynamic grid a round is one
        tile, so it says that every predecessor lies in an earlier tile, which keeps every claim order deadlock-free
        (:mod:`.orders`), not only the predicted one.
        """
        o = self._orders
        outside = (o.tile_b < 0) | (o.tile_b >= self.batch) | (o.tile_h < 0) | (o.tile_h >= self._tile_heads())
        if not np.any(outside):
            outside = (o.tile_n < 0) | (o.tile_n >= self._num_n(o.tile_b))
        if np.any(outside):
            bad = int(np.argmax(outside))
            raise ScheduleError(f"{self.schedule}: K/V tile (b={int(o.tile_b[bad])}, h={int(o.tile_h[bad])}, "
                                f"n={int(o.tile_n[bad])}) lies outside the tile space")
        tiles = self.kv_tile_ids(o.tile_b, o.tile_h, o.tile_n)
        if tiles.size != self._num_kv_tiles() or np.unique(tiles).size != tiles.size:
            raise ScheduleError(f"{self.schedule}: the CTA lists do not hold every K/V tile exactly once")
        if np.any(o.tile_cta[1:] < o.tile_cta[:-1]) or o.tile_cta.size and o.tile_cta.max() >= self.num_ctas:
            raise ScheduleError(f"{self.schedule}: tiles are not laid out CTA-major within {self.num_ctas} CTAs")
        num_m = np.broadcast_to(self._num_m(self.step_b), self.step_m.shape)
        outside = (self.step_m < 0) | (self.step_m >= num_m)
        if np.any(outside):
            bad = int(np.argmax(outside))
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} visits a Q tile outside "
                                f"[0, {int(num_m[bad])})")
        m_min, m_end = self._m_range(self.step_b, self.step_n)
        masked = (self.step_m < m_min) | (self.step_m >= m_end)
        if np.any(masked):
            bad = int(np.argmax(masked))
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} visits a fully masked tile")
        stride = self._num_kv_tiles() + 1  # more than any n or rank
        visits = self._dq_tile() * stride + self.step_n
        expected = self._num_visible()
        if np.unique(visits).size != visits.size or visits.size != expected:
            raise ScheduleError(f"{self.schedule}: {visits.size} steps ({np.unique(visits).size} distinct) for "
                                f"{expected} visible (m, n) tiles")
        k_m = self._contributions(self.step_b, self.step_m)
        if np.any(self.step_rank < 0) or np.any(self.step_rank >= k_m):
            bad = int(np.argmax((self.step_rank < 0) | (self.step_rank >= k_m)))
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} has a rank outside "
                                f"[0, K_m={int(k_m[bad])})")
        ranks = self._dq_tile() * stride + self.step_rank
        if np.unique(ranks).size != ranks.size:
            raise ScheduleError(f"{self.schedule}: two contributions share a rank in one dQ tile")
        self._check_dkv_rounds(tiles)
        try:
            walk(self, 1, 1)
        except Deadlock as err:
            raise ScheduleError(f"{self.schedule}: deadlock with {self.num_ctas} co-resident CTAs: {err}") from None
        pred = self.rank_predecessor()
        has = pred >= 0
        if np.any(self.step_round[pred[has]] > self.step_round[has]):
            bad = int(np.flatnonzero(has)[np.argmax(self.step_round[pred[has]] > self.step_round[has])])
            raise ScheduleError(f"{self.schedule}: step {self.describe_step(bad)} waits on a later persistent round")

    def _check_dkv_rounds(self, tiles: np.ndarray) -> None:
        """GQA: query heads of one K/V head add their dK/dV in ascending h; each waits on head h-1's same tile.  Folded
        tiles hold every sibling's dK/dV and store it once: no waits."""
        if self.fold > 1:
            return
        o, group = self._orders, self.heads // self.heads_kv
        rnd = np.empty(tiles.size, dtype=np.int64)
        rnd[tiles] = o.tile_round
        waits = o.tile_h % group > 0
        before = rnd[self.kv_tile_ids(o.tile_b, o.tile_h - 1, o.tile_n)[waits]]
        late = before > o.tile_round[waits]
        if np.any(late):
            i = int(np.flatnonzero(waits)[np.argmax(late)])
            raise ScheduleError(f"{self.schedule}: K/V tile (b={int(o.tile_b[i])}, h={int(o.tile_h[i])}, "
                                f"n={int(o.tile_n[i])}) waits for the dK/dV of head {int(o.tile_h[i]) - 1} in a "
                                f"later persistent round")

    def describe_step(self, step: int) -> str:
        """Readable identity of step ``step`` (CTA, tile, row, rank) for error messages."""
        return (f"(cta={int(self.step_cta[step])}, b={int(self.step_b[step])}, h={int(self.step_h[step])}, "
                f"n={int(self.step_n[step])}, m={int(self.step_m[step])}, rank={int(self.step_rank[step])})")

    def __repr__(self) -> str:
        fold = f", folded over Hk={self.heads_kv}" if self.fold > 1 else ""
        return (f"Plan({self.schedule!r} -> {self.schedule_used!r}, {self.grid.describe()}, "
                f"sq={self.grid.seqlen_q}, sk={self.grid.seqlen_k}, tiles={self.grid.block_m}x{self.grid.block_n}, "
                f"B={self.batch}, H={self.heads}{fold}, G={self.num_ctas}, steps={self.num_steps})")


def _count(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 1


def check_plan_args(mask: str, schedule: str, heads: int, num_sms: int, heads_kv: int | None,
                    claim_heads: int | None, batch: int = 1) -> None:
    """ValueError naming the first argument of a plan that is not accepted (the shape's own checks aside)."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value in (("batch", batch), ("heads", heads), ("num_sms", num_sms)):
        if not _count(value):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if heads_kv is not None and not (_count(heads_kv) and heads % heads_kv == 0):
        raise ValueError(f"heads_kv must be a positive divisor of heads={heads}, got {heads_kv!r}")
    if claim_heads is not None and not _count(claim_heads):
        raise ValueError(f"claim_heads must be a positive integer or None, got {claim_heads!r}")


def build_plan(mask: str, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, batch: int, heads: int,
               num_sms: int, schedule: str, heads_kv: int | None = None,
               costs: tuple[float, float] | None = None, claim_heads: int | None = None,
               window: tuple[int, int] = (-1, -1), fold: bool = False) -> Plan:
    """Build the plan of ``schedule`` for one backward call.

    ``heads`` are query heads; ``heads_kv`` (default ``heads``) must divide it.  GQA changes nothing for dQ (dQ tiles
    are per query head); it places the heads on the grid's slots sibling-major (:func:`.orders.slot_heads`) and adds
    dK/dV semaphores, which :meth:`Plan.check` shows cannot deadlock.  ``num_sms`` is
    the persistent grid size the kernel launches with (SM count minus ``sm_margin``); the grid is ``min(num_sms,
    #tiles)``.  ``costs`` = ``(c, r)`` only shape the dynamic grid's predicted claims (ascending/descending; see
    :mod:`.orders`) and ``claim_heads`` overrides its claim group (default: the kernel's rule).  ``window`` is
    FlashAttention's ``window_size`` (:class:`.tiles.TileGrid`); on a band every schedule is defined.  ``fold``: the
    GQA sibling fold (needs ``heads_kv < heads``): the grid runs one tile per (batch, K/V head, n), which walks its
    steps once per query head sharing the K/V head (:func:`.orders.fold_siblings`; no dK/dV waits).  The result is a
    pure function of the arguments.
    """
    check_plan_args(mask, schedule, heads, num_sms, heads_kv, claim_heads, batch)
    grid = TileGrid(mask, seqlen_q, seqlen_k, block_m, block_n, window)
    heads_kv = heads if heads_kv is None else heads_kv
    if not isinstance(fold, bool):
        raise ValueError(f"fold must be a bool, got {fold!r}")
    if fold and heads_kv == heads:
        raise ValueError(f"fold needs GQA (heads_kv < heads), got heads={heads}, heads_kv={heads_kv}")
    orders = build_orders(grid, int(batch), int(heads), int(num_sms), schedule, costs, claim_heads, int(heads_kv),
                          fold)
    return Plan(grid, int(batch), int(heads), int(heads_kv), int(num_sms), schedule, orders)
