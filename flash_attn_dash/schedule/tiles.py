"""The (m, n) tile grid of the backward pass, for the backward tile shape of the variant table.

The tile shape of each head dim is an entry of :mod:`flash_attn_dash.variants` (``HeadDim.bwd``); the kernels are
generated from the same entry, so the model and the kernels cannot disagree on it.

Conventions (kept identical to the kernels):

* ``M = ceil(seqlen_q / block_m)`` Q tiles, ``N = ceil(seqlen_k / block_n)`` K/V tiles per (batch, head).
* Masks are FlashAttention's, aligned bottom-right (``d = seqlen_k - seqlen_q``): with ``window = (left, right)``
  query row ``i`` sees key ``j`` iff ``i + d - left <= j <= i + d + right``, a side of -1 being unbounded.  Full is
  ``(-1, -1)``, causal ``right = 0`` (:func:`canonical_window` gives every mask one spelling).
* A tile is visible iff any (row, column) in it is.  K/V tile ``n`` is visited by the Q tiles ``m`` in ``[m_min(n),
  m_end(n))``: its columns ``[c0, c1]`` are seen by the rows ``[c0 - d - right, c1 - d + left]``, an interval (every
  row's keys are an interval of at least one column, and consecutive columns' rows overlap), so the visible Q tiles are
  contiguous and both ends are O(1) in n.  Full mask: ``[0, M)``; causal: ``m_min(n) = max(0, floor((n * block_n -
  d) / block_m))``, ``m_end = M``.  ``m_min == m_end`` means the tile has no steps but still exists, for its dK/dV
  write (a band's K/V tiles that no query reaches).
* ``m_min`` and ``m_end`` are non-decreasing in n, so the K/V tiles adding into dQ tile m are contiguous too:
  ``[n_min(m), n_end(m))``, ``K_m = n_end - n_min`` of them (0 for Q tiles of rows that see no key).  A contribution's
  rank in ascending n is ``n - n_min(m)``.
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


def _window_side(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= UNBOUNDED


def check_window_size(window_size) -> tuple[int, int]:
    """``window_size`` as a ``(left, right)`` pair of ints, each -1 (unbounded) or >= 0; ValueError otherwise."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and _window_side(window_size[0])
            and _window_side(window_size[1])):
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


def _ranges(length: int, block: int, count: int, other_len: int, other_block: int, other_count: int,
            below: int | None, above: int | None) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``count`` tiles of ``block`` positions (the last one cut at ``length``), the tiles of the other axis
    it sees: ``[lo, end)``, both clamped to ``[0, other_count]`` and ``end >= lo``.  Position ``p`` sees the other
    axis's positions ``[p - below, p + above]`` (None: unbounded), clipped to ``[0, other_len)``."""
    first = np.arange(count, dtype=np.int64) * block
    last = np.minimum(first + block, length) - 1
    lo_pos = np.zeros_like(first) if below is None else np.maximum(first - below, 0)
    hi_pos = np.full_like(last, other_len - 1) if above is None else np.minimum(last + above, other_len - 1)
    # numpy's floor division rounds towards -inf: a negative position lands on tile -1 and clamps below.
    lo = np.clip(lo_pos // other_block, 0, other_count)
    end = np.maximum(np.clip(hi_pos // other_block + 1, 0, other_count), lo)
    return lo, end


@dataclass(frozen=True)
class TileGrid:
    """The per-(batch, head) tile grid of one backward call: which (m, n) tiles carry work.

    ``window`` is FlashAttention's ``window_size``; the grid stores the canonical form (:func:`canonical_window`): a
    causal mask has ``window == (-1, 0)``, and a full mask with ``window=(-1, 0)`` becomes the causal mask.
    """

    mask: str
    seqlen_q: int
    seqlen_k: int
    block_m: int
    block_n: int
    window: tuple[int, int] = (UNBOUNDED, UNBOUNDED)

    def __post_init__(self) -> None:
        _check_mask(self.mask)
        for name in ("seqlen_q", "seqlen_k", "block_m", "block_n"):
            _positive(name, getattr(self, name))
        window = canonical_window(self.mask == "causal", self.window, self.seqlen_q, self.seqlen_k)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "mask", "causal" if window[1] == 0 else "full")

    @property
    def causal(self) -> bool:
        """Whether keys after the diagonal are masked (the causal mask, or a band with ``right == 0``)."""
        return self.mask == "causal"

    @property
    def banded(self) -> bool:
        """Whether the window removes a tile that the mask alone (``mask`` without the window) visits.  If not, every
        schedule runs as for the mask alone (the kernels still mask the elements the window hides).

        O(1): a tile's distance from the diagonal grows towards the corners, so the left side removes a tile iff it
        removes the lower-left one ``(M-1, 0)`` (which both masks visit), and a right side other than causal's
        removes one iff it removes the upper-right one ``(0, N-1)``."""
        left, right = self._bounds()
        d = self.seqlen_k - self.seqlen_q
        # Key j of row i is hidden on the left iff j < i + d - left, on the right iff j > i + d + right.
        lower_left = (left is not None
                      and min(self.block_n, self.seqlen_k) - 1 < (self.num_m - 1) * self.block_m + d - left)
        upper_right = (right is not None and right > 0
                       and (self.num_n - 1) * self.block_n > min(self.block_m, self.seqlen_q) - 1 + d + right)
        return lower_left or upper_right

    def describe(self) -> str:
        """``"full"``, ``"causal"``, ``"window (128, 0)"``, or e.g. ``"window (1000, 0), no tile outside causal"``."""
        if self.window in ((UNBOUNDED, UNBOUNDED), (UNBOUNDED, 0)):
            return self.mask
        return f"window {self.window}" + ("" if self.banded else f", no tile outside {self.mask}")

    @property
    def num_m(self) -> int:
        """M, the number of Q tiles."""
        return -(-self.seqlen_q // self.block_m)

    @property
    def num_n(self) -> int:
        """N, the number of K/V tiles."""
        return -(-self.seqlen_k // self.block_n)

    def _bounds(self) -> tuple[int | None, int | None]:
        """``(left, right)`` with None for an unbounded side."""
        return tuple(None if w == UNBOUNDED else w for w in self.window)

    def _tile_rows(self) -> tuple[np.ndarray, np.ndarray]:
        left, right = self._bounds()
        d = self.seqlen_k - self.seqlen_q
        # Key j is seen by the rows [j - d - right, j - d + left]: shift by d, then the window's sides.
        return _ranges(self.seqlen_k, self.block_n, self.num_n, self.seqlen_q, self.block_m, self.num_m,
                       None if right is None else d + right, None if left is None else left - d)

    def m_min(self) -> np.ndarray:
        """``m_min(n)`` for every K/V tile n (int64, length N): its first visible Q tile, in [0, M]."""
        return self._tile_rows()[0]

    def m_end(self) -> np.ndarray:
        """``m_end(n)`` for every K/V tile n (int64, length N): one past its last visible Q tile, >= ``m_min(n)``."""
        return self._tile_rows()[1]

    def tile_lengths(self) -> np.ndarray:
        """Steps (visible Q tiles) of every K/V tile (int64, length N)."""
        lo, end = self._tile_rows()
        return end - lo

    def _row_tiles(self) -> tuple[np.ndarray, np.ndarray]:
        left, right = self._bounds()
        d = self.seqlen_k - self.seqlen_q
        # Row i sees the keys [i + d - left, i + d + right].
        return _ranges(self.seqlen_q, self.block_m, self.num_m, self.seqlen_k, self.block_n, self.num_n,
                       None if left is None else left - d, None if right is None else d + right)

    def n_min(self) -> np.ndarray:
        """``n_min(m)`` for every Q tile m (int64, length M): the first K/V tile adding into dQ tile m."""
        return self._row_tiles()[0]

    def contributions(self) -> np.ndarray:
        """``K_m`` for every Q tile m (int64, length M): how many K/V tiles add into dQ tile m."""
        lo, end = self._row_tiles()
        return end - lo

    def band_steps(self) -> int | None:
        """An O(1) bound on the steps (visible Q tiles) of any K/V tile when the window bounds both sides (None when a
        side is unbounded, the full and causal masks included): the rows that see a K/V tile's keys span
        ``block_n + left + right`` positions, which touch at most ``(span - 1) // block_m + 2`` Q tiles."""
        return band_steps(self.window, self.block_m, self.block_n)

    def num_steps_per_head(self) -> int:
        """Number of visited (m, n) tiles of one (batch, head)."""
        return int(self.tile_lengths().sum())


def band_steps(window: tuple[int, int], block_m: int, block_n: int) -> int | None:
    """:meth:`TileGrid.band_steps` from the window and the tile sizes alone (None when a side is unbounded)."""
    left, right = window
    if left == UNBOUNDED or right == UNBOUNDED:
        return None
    return (block_n + left + right - 1) // block_m + 2
