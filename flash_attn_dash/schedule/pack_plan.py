"""A backward plan of a varlen pack: the orders of :mod:`.pack_orders` with the checks of :class:`.plan.Plan`,
which see the pack's tile space through its flat ids (:mod:`.packs`)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .orders import Orders
from .pack_orders import build_pack_orders, grid_kind, sequence_portable, sequence_schedules
from .packs import PackTiles
from .plan import Plan, check_plan_args


class PackPlan(Plan):
    """The schedule of one varlen backward: steps as in :class:`.plan.Plan`, with ``b`` the sequence's index in the
    pack.  :meth:`check` proves coverage of every sequence's visible tiles, ranks ``0 .. K_m - 1`` per dQ tile and
    deadlock freedom on the shared persistent grid.

    ``sequence_schedules``: the order each sequence runs (None: no work); ``sequence_portable``: whether its bits equal
    its dense batch-1 call's whatever it is packed with (None: no work); ``grid_kind``: ``"dynamic"``, ``"static"``
    or ``"pair"`` (:mod:`.pack_orders`).
    """

    def __init__(self, pack: PackTiles, heads: int, heads_kv: int, num_sms: int, schedule: str,
                 orders: Orders) -> None:
        super().__init__(None, pack.num_sequences, heads, heads_kv, num_sms, schedule, orders)
        self.pack = pack
        self.sequence_schedules: tuple[str | None, ...] = sequence_schedules(pack, schedule)
        self.sequence_portable: tuple[bool | None, ...] = sequence_portable(pack, schedule)
        self.grid_kind: str = grid_kind(pack, schedule)

    @property
    def portable(self) -> bool:
        """Whether every sequence with work is portable (:func:`.pack_orders.sequence_portable`)."""
        return all(p is not False for p in self.sequence_portable)

    def kv_tile_ids(self, b: np.ndarray, h: np.ndarray, n: np.ndarray) -> np.ndarray:
        return self.pack.n_offset[b] * self.heads + h * self.pack.num_n[b] + n

    def _num_kv_tiles(self) -> int:
        return int(self.pack.n_offset[-1]) * self.heads

    def _dq_tile(self) -> np.ndarray:
        b = self.step_b
        return self.pack.m_offset[b] * self.heads + self.step_h * self.pack.num_m[b] + self.step_m

    def _num_n(self, b: np.ndarray) -> np.ndarray:
        return self.pack.num_n[b]

    def _num_m(self, b: np.ndarray) -> np.ndarray:
        return self.pack.num_m[b]

    def _m_range(self, b: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.pack.m_range(b, n)

    def _contributions(self, b: np.ndarray, m: np.ndarray) -> np.ndarray:
        return self.pack.rows(b, m)[1]

    def _num_visible(self) -> int:
        return int(self.pack.steps.sum()) * self.heads

    @property
    def shape(self):
        raise TypeError("a pack has no (B, H, M, N) shape: its sequences' traces are sequence_trace(b)")

    def trace_array(self) -> np.ndarray:
        raise TypeError("a pack has no (B, H, M, N) trace: use sequence_trace(b) per sequence")

    def sequence_trace(self, b: int) -> np.ndarray:
        """int32 (H, M_b, N_b): ``[h, m, rank] = n`` for sequence b, -1 for unused slots (the dense trace layout)."""
        return self._traces[b]

    @cached_property
    def _traces(self) -> list[np.ndarray]:
        out = [np.full((self.heads, int(m), int(n)), -1, dtype=np.int32)
               for m, n in zip(self.pack.num_m, self.pack.num_n)]
        for b in np.unique(self.step_b).tolist():
            mine = self.step_b == b
            out[b][self.step_h[mine], self.step_m[mine], self.step_rank[mine]] = self.step_n[mine]
        return out

    def dq_order(self, b: int, h: int, m: int) -> list[int]:
        return [int(n) for n in self._traces[b][h, m] if n >= 0]

    def rank(self, b: int, h: int, n: int, m: int) -> int:
        hits = np.flatnonzero(self._traces[b][h, m] == n)
        if hits.size != 1:
            raise ValueError(f"K/V tile n={n} of sequence {b} does not add into its dQ tile (h={h}, m={m})")
        return int(hits[0])

    def __repr__(self) -> str:
        return (f"PackPlan({self.schedule!r} -> {self.schedule_used!r}, {self.pack.describe()}, "
                f"tiles={self.pack.block_m}x{self.pack.block_n}, H={self.heads}, G={self.num_ctas}, "
                f"steps={self.num_steps}, {self.grid_kind} grid)")


def build_pack_plan(mask: str, seqlens_q, seqlens_k, block_m: int, block_n: int, heads: int, num_sms: int,
                    schedule: str, heads_kv: int | None = None, costs: tuple[float, float] | None = None,
                    claim_heads: int | None = None, window: tuple[int, int] = (-1, -1)) -> PackPlan:
    """The plan of ``schedule`` for the backward of a pack of sequences with lengths ``seqlens_q[b]`` /
    ``seqlens_k[b]`` (``seqlens_k`` None: the same), the other arguments as for :func:`.plan.build_plan` (the pack is
    the batch).  A pure function of the arguments."""
    check_plan_args(mask, schedule, heads, num_sms, heads_kv, claim_heads)
    pack = PackTiles(mask, seqlens_q, seqlens_k, block_m, block_n, window)
    heads_kv = heads if heads_kv is None else heads_kv
    orders = build_pack_orders(pack, int(heads), int(num_sms), schedule, costs, claim_heads, int(heads_kv))
    return PackPlan(pack, int(heads), int(heads_kv), int(num_sms), schedule, orders)
