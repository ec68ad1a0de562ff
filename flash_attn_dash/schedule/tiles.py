"""Tile shapes and the (m, n) tile grid of the backward pass.

This module is the single source of truth for the backward tile shape: the CUDA kernels, the host-side buffer sizing and
the schedule model all read :func:`bwd_tile_shape`.

Conventions (kept identical to the kernels):

* ``M = ceil(seqlen_q / block_m)`` Q tiles, ``N = ceil(seqlen_k / block_n)`` K/V tiles per (batch, head).
* Causal masks are aligned bottom-right: query row ``i`` sees key ``j`` iff ``j <= i + (seqlen_k - seqlen_q)``.
* K/V tile ``n`` is visited by the Q tiles ``m`` in ``[m_min(n), M)``.  Full mask: ``m_min(n) = 0``.  Causal: ``m_min(n)
  = max(0, floor((n * block_n - (seqlen_k - seqlen_q)) / block_m))``, clamped to ``M`` (``m_min == M`` means the tile
  has no steps but still exists, for its dK/dV write).
* ``K_m`` (the number of K/V tiles adding into dQ tile ``m``) is the number of ``n`` with ``m_min(n) <= m``.  Because
  ``m_min`` is non-decreasing in ``n`` those tiles are always ``n = 0 .. K_m - 1``; Q tiles made only of fully masked
  rows (causal with ``seqlen_q > seqlen_k``) get ``K_m = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASKS = ("full", "causal")

# head_dim -> (block_m, block_n) of the deterministic backward, identical for both masks.  FlashAttention-3 uses 80x128
# for
# hdim 128 full; we use 64x128 for both masks so one kernel instance serves both.  96, 192 and 256 are not built yet.
_BWD_TILES = {64: (128, 128), 128: (64, 128)}
_FWD_TILES = {64: (128, 128), 128: (128, 128)}


def _check_mask(mask: str) -> None:
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")


def bwd_tile_shape(head_dim: int, causal: bool) -> tuple[int, int]:
    """Return ``(block_m, block_n)`` of the backward kernel for ``head_dim``.

    Built: 64 -> (128, 128); 128 -> (64, 128), for both masks (``causal`` is accepted so that a future per-mask shape
    does not change callers).  Head dims 96, 192 and 256 are not built yet.
    """
    del causal  # Same shape for both masks today.
    if head_dim not in _BWD_TILES:
        raise ValueError(f"head_dim must be one of {sorted(_BWD_TILES)} (96/192/256 are not built yet), "
                         f"got {head_dim!r}")
    return _BWD_TILES[head_dim]


def fwd_tile_shape(head_dim: int) -> tuple[int, int]:
    """Return ``(block_m, block_n)`` of the forward kernel for ``head_dim`` (used for reporting only)."""
    if head_dim not in _FWD_TILES:
        raise ValueError(f"head_dim must be one of {sorted(_FWD_TILES)}, got {head_dim!r}")
    return _FWD_TILES[head_dim]


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class TileGrid:
    """The per-(batch, head) tile grid of one backward call: which (m, n) tiles carry work."""

    mask: str
    seqlen_q: int
    seqlen_k: int
    block_m: int
    block_n: int

    def __post_init__(self) -> None:
        _check_mask(self.mask)
        for name in ("seqlen_q", "seqlen_k", "block_m", "block_n"):
            _positive(name, getattr(self, name))

    @property
    def causal(self) -> bool:
        return self.mask == "causal"

    @property
    def num_m(self) -> int:
        """M, the number of Q tiles."""
        return -(-self.seqlen_q // self.block_m)

    @property
    def num_n(self) -> int:
        """N, the number of K/V tiles."""
        return -(-self.seqlen_k // self.block_n)

    def m_min(self) -> np.ndarray:
        """``m_min(n)`` for every K/V tile n (int64, length N), clamped to [0, M]."""
        n = np.arange(self.num_n, dtype=np.int64)
        if not self.causal:
            return np.zeros_like(n)
        # Python/numpy floor division rounds towards -inf, which is the floor the formula needs for negative numerators.
        first = (n * self.block_n - (self.seqlen_k - self.seqlen_q)) // self.block_m
        return np.clip(first, 0, self.num_m)

    def contributions(self) -> np.ndarray:
        """``K_m`` for every Q tile m (int64, length M): how many K/V tiles add into dQ tile m."""
        m = np.arange(self.num_m, dtype=np.int64)
        return np.searchsorted(self.m_min(), m, side="right").astype(np.int64)

    def num_steps_per_head(self) -> int:
        """Number of visited (m, n) tiles of one (batch, head)."""
        return int((self.num_m - self.m_min()).sum())
