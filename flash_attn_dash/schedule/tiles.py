"""The (m, n) tile grid of the backward pass, for the backward tile shape of the variant table.

The tile shape of each head dim is an entry of :mod:`flash_attn_dash.variants` (``HeadDim.bwd``); the kernels are
generated from the same entry, so the model and the kernels cannot disagree on it.

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

from .. import variants

MASKS = variants.MASKS
UNBOUNDED = -1


def _check_mask(mask: str) -> None:
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")


def check_window_size(window_size) -> tuple[int, int]:
    """``window_size`` as a ``(left, right)`` pair of ints, each -1 (unbounded) or >= 0; ValueError otherwise."""
    ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= UNBOUNDED for x in window_size)
    if not ok:
        raise ValueError(f"window_size must be a pair (left, right) of ints >= -1 (-1 = unbounded), got "
                         f"{window_size!r}")
    return int(window_size[0]), int(window_size[1])


def canonical_window(causal: bool, window_size, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """The one spelling of a mask, FlashAttention-3's rule: a side that clips no (row, key) of the shape is unbounded
    (``left >= seqlen_k - 1``, ``right >= seqlen_q - 1``), then ``causal`` sets ``right = 0``.  The result is ``(-1,
    -1)`` for the full mask, ``(-1, 0)`` for the causal one and a band otherwise.  The keys each row sees do not
    change, so every window spelling of the full or causal mask plans (and later launches) as that mask."""
    left, right = check_window_size(window_size)
    if left >= seqlen_k - 1:
        left = UNBOUNDED
    if right >= seqlen_q - 1:
        right = UNBOUNDED
    if causal:
        right = 0
    return left, right


def bwd_tile_shape(head_dim: int, causal: bool) -> tuple[int, int]:
    """``(block_m, block_n)`` of the backward kernel for ``head_dim`` (``variants.HEAD_DIMS``); ``causal`` is accepted
    so that a per-mask shape would not change callers (both masks share one today)."""
    del causal
    return variants.bwd_tile(head_dim)


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
