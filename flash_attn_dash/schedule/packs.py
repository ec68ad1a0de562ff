"""The backward's tile space of a varlen pack: each sequence's (m, n) tiles, the sequences in claim order (longest
first) and the prefix sums that take a persistent CTA's claim to its sequence.

A pack is ``B`` sequences with lengths ``(seqlen_q[b], seqlen_k[b])`` (``cu_seqlens`` differences, or ``seqused``),
sharing heads, head dim, mask and window.  Sequence b has its own dense tile grid (:class:`.tiles.TileGrid`:
``M_b x N_b`` tiles, causal aligned bottom-right on *its* lengths, the window canonicalised on them), so every
formula of :mod:`.tiles` and :mod:`.orders` applies per sequence unchanged.  A sequence with ``seqlen_k = 0`` has no
K/V tiles (its ``M_b`` dQ tiles receive nothing and must be written as zeros); one with ``seqlen_q = 0`` has ``N_b``
K/V tiles without steps (they still run, to write zero dK/dV, like a band's unreachable tiles).

Claim order: the persistent grid hands out units (K/V tiles, or symmetric_shift's pairs) sequence by sequence in
:attr:`PackTiles.order`, the varlen kernels' table order (``hopper/common/varlen.hpp``): chunks of
:data:`ORDER_CHUNK` sequences in pack order, each sorted longest first by one K/V tile's work (the sequence's query
length; sequences without work last), ties in the pack's order, so the short sequences fill the tail of the run
(longest processing time first).  Inside a sequence the units are head by head (or in
claim groups of heads, :mod:`.pack_orders`).  With ``U_b`` units per head, sequence ``order[i]`` owns the claims
``[P_i, P_{i+1})`` where ``P`` is the prefix sum of ``heads * U_b`` in that order (:meth:`PackTiles.claim_offsets`);
a claim ``p`` finds its sequence by binary search over ``P`` (:meth:`PackTiles.locate`, O(log B)), or in O(1)
amortised from the CTA's previous claim, since each CTA's claims increase.  The order moves no bits of a portable
schedule (:mod:`.pack_orders`), only the balance.

Flat ids: the K/V tiles of the pack are numbered ``n_offset[b] * H + h * N_b + n`` and its dQ tiles ``m_offset[b] * H
+ h * M_b + m`` (``*_offset`` are prefix sums in the pack's own order), the layout of a varlen kernel's per-tile
workspace (semaphores, dQ accumulators).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tiles import TileGrid, _check_mask, _positive, canonical_window, check_window_size


ORDER_CHUNK = 1024  # sequences the varlen prepare CTA sorts at once (kVarlenPrepareThreads)


def _lengths(name: str, value) -> tuple[int, ...]:
    ok = (isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, str) and len(value) > 0
          and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in value))
    if not ok:
        raise ValueError(f"{name} must be a non-empty sequence of ints >= 0 (one length per sequence), got {value!r}")
    return tuple(int(x) for x in value)


def check_seqlens(seqlens_q, seqlens_k=None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The pack's ``(seqlens_q, seqlens_k)`` as tuples of ints (``seqlens_k`` defaults to ``seqlens_q``); ValueError
    unless they are ints >= 0, one key length per query length, and some sequence has both (something to compute)."""
    lens_q = _lengths("seqlens_q", seqlens_q)
    lens_k = lens_q if seqlens_k is None else _lengths("seqlens_k", seqlens_k)
    if len(lens_k) != len(lens_q):
        raise ValueError(f"seqlens_k must have one length per sequence ({len(lens_q)} in seqlens_q), got "
                         f"{len(lens_k)}")
    if not any(q and k for q, k in zip(lens_q, lens_k)):
        raise ValueError(f"a pack needs a sequence with seqlen_q > 0 and seqlen_k > 0 (nothing to compute "
                         f"otherwise), got seqlens_q={list(lens_q)}, seqlens_k={list(lens_k)}")
    return lens_q, lens_k


class PackTiles:
    """The tile space of one pack (module docstring); read-only after construction.

    ``grids[b]`` is sequence b's :class:`.TileGrid`, or None when it has no work (a length is 0).  ``mask`` is the
    pack's canonical mask at its longest lengths (what the varlen API decides the kernels' mask on) and ``banded``
    whether the window removes a tile of any sequence.
    """

    def __init__(self, mask: str, seqlens_q, seqlens_k, block_m: int, block_n: int,
                 window: tuple[int, int] = (-1, -1)) -> None:
        _check_mask(mask)
        self.seqlens_q, self.seqlens_k = check_seqlens(seqlens_q, seqlens_k)
        self.block_m, self.block_n = _positive("block_m", block_m), _positive("block_n", block_n)
        self.window = check_window_size(window)
        causal = mask == "causal"
        longest = canonical_window(causal, self.window, max(self.seqlens_q), max(self.seqlens_k))
        self.mask = "causal" if longest[1] == 0 else "full"
        self.grids: tuple[TileGrid | None, ...] = tuple(
            TileGrid(mask, q, k, self.block_m, self.block_n, self.window) if q and k else None
            for q, k in zip(self.seqlens_q, self.seqlens_k))
        self.banded = any(g is not None and g.banded for g in self.grids)
        lens_q, lens_k = np.array(self.seqlens_q, dtype=np.int64), np.array(self.seqlens_k, dtype=np.int64)
        self.num_m = -(-lens_q // self.block_m)
        self.num_n = -(-lens_k // self.block_n)
        self.m_offset = np.concatenate([[0], np.cumsum(self.num_m)])
        self.n_offset = np.concatenate([[0], np.cumsum(self.num_n)])
        # Per-tile ranges, concatenated in the pack's order: a sequence without work visits nothing.
        self._m_min = self._per_tile(self.num_n, TileGrid.m_min)
        self._m_end = self._per_tile(self.num_n, TileGrid.m_end)
        self._n_min = self._per_tile(self.num_m, TileGrid.n_min)
        self._k_m = self._per_tile(self.num_m, TileGrid.contributions)
        self.steps = np.array([0 if g is None else g.num_steps_per_head() for g in self.grids], dtype=np.int64)
        # Longest first within chunks (the kernels' prepare CTA sorts its 1024 threads' sequences); ties keep the
        # pack's order.
        chunk = np.arange(lens_q.size) // ORDER_CHUNK
        cost = np.where((lens_q > 0) & (lens_k > 0), lens_q, -1)  # sequences without work (no claims) last
        self.order = np.lexsort((-cost, chunk))

    def _per_tile(self, counts: np.ndarray, of_grid) -> np.ndarray:
        parts = [np.zeros(int(c), dtype=np.int64) if g is None else of_grid(g) for g, c in zip(self.grids, counts)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @property
    def num_sequences(self) -> int:
        """B, the sequences of the pack (those without work included)."""
        return len(self.seqlens_q)

    def m_range(self, b: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(m_min, m_end)`` of K/V tile n of sequence b (arrays broadcast)."""
        flat = self.n_offset[b] + n
        return self._m_min[flat], self._m_end[flat]

    def rows(self, b: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(n_min, K_m)`` of dQ tile m of sequence b: the K/V tiles ``[n_min, n_min + K_m)`` add into it."""
        flat = self.m_offset[b] + m
        return self._n_min[flat], self._k_m[flat]

    def claim_offsets(self, units_per_head: np.ndarray, heads: int) -> np.ndarray:
        """``P`` (length B + 1): sequence ``order[i]`` owns the claims ``[P[i], P[i+1])``, ``heads * units_per_head``
        of them (``units_per_head`` per sequence, in the pack's order)."""
        return np.concatenate([[0], np.cumsum(heads * np.asarray(units_per_head, dtype=np.int64)[self.order])])

    @staticmethod
    def locate(offsets: np.ndarray, claim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each claim, ``(i, j)``: it is claim j of sequence ``order[i]`` (binary search over the prefix sums;
        sequences without units own no claim); ValueError for a claim outside ``[0, offsets[-1])``."""
        claim = np.asarray(claim, dtype=np.int64)
        if claim.size and (claim.min() < 0 or claim.max() >= offsets[-1]):
            bad = int(claim.min() if claim.min() < 0 else claim.max())
            raise ValueError(f"claim must lie in [0, {int(offsets[-1])}) (the pack's claims), got {bad}")
        i = np.searchsorted(offsets, claim, side="right") - 1
        return i, claim - offsets[i]

    def describe(self) -> str:
        """E.g. ``"causal pack of 9 sequences (2 without work)"``, ``"... , window (128, 0) (3 banded)"``."""
        idle = sum(g is None for g in self.grids)
        text = f"{self.mask} pack of {self.num_sequences} sequence{'s' if self.num_sequences != 1 else ''}"
        text += f" ({idle} without work)" if idle else ""
        if self.window not in ((-1, -1), (-1, 0)):
            text += f", window {self.window} ({sum(g is not None and g.banded for g in self.grids)} banded)"
        return text
