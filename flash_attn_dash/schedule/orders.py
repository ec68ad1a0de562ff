"""The dQ accumulation orders: which CTA runs which K/V tile, the order of its Q tiles, and each step's rank, on
the full and causal masks and on sliding-window bands.

Every formula here is written so that a CUDA kernel can evaluate it per tile from ``(t or chunk, G, B, H, M, N)`` alone;
the kernels mirror this file.  Notation: ``q = b * H + h`` is the linear (batch, head) index, ``G`` the persistent grid
size, ``rank`` the position of a contribution in the addition order of its dQ tile ``(b, h, m)``.

Linear tiles
    ``T = B * H * N`` tiles, linear index ``t = q * N + n`` (n fastest); ``G = min(num_sms, T)`` co-resident CTAs.
Static persistent grid (``shift``)
    CTA ``g`` runs ``t = g, g + G, g + 2G, ...``.  Round (wave) ``j`` is ``t in [j*G, (j+1)*G)``: all G CTAs are
    co-resident, so the tiles of one round really run concurrently.
Dynamic persistent grid (``ascending``, ``descending``, ``split``, ``diagonal``, ``shift`` on a band)
    Tiles are claimed in the order ``p = 0, 1, ...``: n-major within groups of ``Hg`` heads (:func:`claim_group`),
    i.e. group ``p // (Hg N)``, then the head's claim position (``n`` itself, but for ``split``, ``diagonal`` and
    ``shift`` on a band: :func:`claimed_n`), then the head within the group.  CTA ``g`` starts with claim ``p = g``;
    every later claim goes to whichever CTA frees up first (the kernel's producer warp takes it from a global counter
    when the CTA's MMAs are done with its tile).  Which CTA runs a tile therefore depends on timing, but the ranks do
    not: they follow from the tile alone.  The model's CTA lists are the claims of a greedy simulation under the cost
    model (:func:`claim_tiles`), its prediction of the run.  Deadlock freedom holds for every claim order: each rank
    predecessor (of the same head, the tile claimed last before it among those touching m) has a smaller ``p``, claims
    are taken in increasing ``p`` and each CTA runs its tiles in that order, so the unfinished tile with the smallest
    ``p`` always progresses.  ``tile_round`` is ``p`` itself (tiles are claimed one at a time), which
    :meth:`Plan.check`'s round rule then turns into exactly that condition.

Bands (``TileGrid.banded``: a sliding window that removes tiles the mask alone visits)
    Every order is defined on a band.  Tile n visits its Q tiles ``[m_min(n), m_end(n))`` and dQ tile m receives from
    ``[n_min(m), n_end(m))`` (:mod:`.tiles`), so ranks count visible contributions only; in ascending n the rank is
    ``n - n_min(m)``, which is ``n`` for the full and causal masks.  Tiles no query sees have no steps but still run
    (their dK/dV are zero).

``ascending``
    m from ``m_min(n)`` up to ``m_end(n) - 1``; ``rank = n - n_min(m)``.  (The rank is the number of tiles ``n' < n``
    that touch m; the ``n'`` touching m are contiguous.)  On a band this is the queue FlashAttention-3's
    deterministic sliding window is known for: tile n starts on row ``m_min(n)``, which tile n - 1 reaches only
    ``m_min(n) - m_min(n-1)`` steps later, and every tile of the head inherits the delay.
``descending``
    m from ``m_end(n) - 1`` down to ``m_min(n)``; ``rank = n - n_min(m)``.  On a band tile n starts on its own top row,
    which tile n - 1 does not reach, and reaches every row after tile n - 1: nothing waits except where tiles share
    their top row (the last Q tile clamps the band's tail, all those tiles start there and queue once).
``shift`` on a band (dynamic grid)
    The band's diagonal staggers the tiles by itself, so the order needs no rounds: walking up from ``m_min(n)`` tile
    n reaches row m at step ``m - m_min(n)`` (larger n first), walking down at ``m_end(n) - 1 - m`` (smaller n first);
    ranking the tiles in that order lets nothing wait in lock-step except tiles that start on the same row.  ``shift``
    walks up, with a head's tiles claimed and ranked in descending n (``rank = n_end(m) - 1 - n``), when fewer of its
    tiles tie at the lower edge than at the upper one (:func:`band_walks_up`; a causal band with ``seqlen_q <=
    seqlen_k`` has no ties there), and is ``descending`` otherwise.  Deadlock freedom is the dynamic grid's argument
    with n mirrored: the rank predecessor ``(n+1, m)`` is claimed earlier.  The ranks follow from the tile alone, so
    the bits do not depend on the grid; on the static grid the band's unequal tiles (clamped ends, empty tiles) left
    10-40% of the SM time idle in the model, on the dynamic one the price of the up walk is its claim order, which
    leaves a head's longest tiles for last.
``split`` (causal)
    A head's long half first, as ``descending``: tiles ``n < P = N // 2`` are claimed in ascending n and walk down
    from ``M - 1``; then its short half from the shortest tile: ``n = N - 1`` down to ``P`` are claimed in that order
    and walk up from ``m_min(n)``.  Ranks follow the claim order of the tiles touching m: ``rank = n`` for ``n < P``,
    ``P + n_end(m) - 1 - n`` for ``n >= P``.  A rank is a function of (n, m, N, M) alone, so the bits do not depend
    on the grid (portable, ``docs/portable-orders.md``).  Why: in descending a head's tiles reach row m in claim order
    only as far apart as their claims (a few heads' worth), so the reduce hand-offs queue when claims come close; a
    short tile walking up reaches row m ``s = block_n / block_m`` steps after the shorter tile claimed before it, and
    the long half keeps the longest tiles first for balance.  Deadlock freedom is the dynamic grid's argument (ranks
    follow the claim order).  Defined on the causal mask (any ``seqlen_q``, ``seqlen_k``: every tile's Q tiles contain
    the next tile's); on a band it falls back to ``descending``.
``diagonal`` (causal)
    ``split`` with ``P = 0``: a head's tiles are claimed from ``n = N - 1`` down and every tile walks up from
    ``m_min(n)``; ``rank = n_end(m) - 1 - n``.  Every rank predecessor ``(n + 1, m)`` is one step shallower (Lemma 1
    with strict inequality), so when a head's tiles start together no store waits, where ``descending`` queues them
    one store apart on the head's last Q tile; the price is that a head's longest tile is claimed last, a tail that
    only shorter work claimed after it (a pack's shorter sequences) fills.  Portable; on a band it falls back to
    ``descending``.
``shift`` (full mask)
    Per head and round: ``R`` = number of the head's tiles in round j, ``F = max(0, j*G - q*N)`` = its tiles in earlier
    rounds, slot ``k = n - F`` in ``[0, R)``.  If ``R <= M``: the tile visits ``m_i = (k + i) mod M`` for ``i = 0..M-1``
    and ``rank = F + ((min(m, R-1) - k) mod R)``; in a lock-step round the R slots then write R distinct rows and every
    rank predecessor ran one step earlier, so nothing waits.  **Fallback** if ``R > M`` (more tiles of the head in
    flight than Q tiles): that (head, round) group is ordered exactly like ``descending`` (``m = M-1-i``,
    ``rank = F + k = n``).  Earlier rounds always rank first, so groups with different rules compose without deadlock.
``symmetric_shift`` (causal)
    Assumptions: ``seqlen_q == seqlen_k``, ``block_n % block_m == 0`` (``s = block_n / block_m``) and N even.  ``M`` may
    be smaller than ``N * s`` (a partial last K/V tile).  Pairs ``(n, N-1-n)`` then have complementary tile counts,
    ``2M - (N-1)s`` steps per pair.  Only the causal triangle's tiles have them (the middle of a band has equal
    counts), and under the other assumptions every band differs from the triangle, so on a band it falls back.
    **Fallback** when an assumption fails: the whole call uses ``descending`` (``Plan.schedule_used`` says so).

    Pair grid: ``P = N / 2`` pairs per head, chunk ``c = q * P + p`` pairs tiles ``p`` (long) and ``N - 1 - p`` (short).
    ``G = min(num_sms, B * H * P)``; CTA ``g`` runs chunks ``g, g + G, ...``, each chunk its long tile then its short
    tile.  Round ``j`` is ``c in [j*G, (j+1)*G)``; ``R``, ``F``, ``k = p - F`` as above but counted in pairs.  With
    ``Rs = (F + R - 1) * s`` (``m_min`` of the group's last long tile) and ``L = M - Rs``:

    * long tile ``n = F + k``: ``L`` steps over the shared rectangle ``m = Rs + ((k + i) mod L)``, then its own triangle
      ``m = n*s, ..., Rs - 1`` ascending; rank ``E(m) + ((min(m - Rs, R-1) - k) mod R)`` in the rectangle and
      ``E(m) + (m // s - n)`` in the triangle;
    * short tile ``n' = N - 1 - F - k``: ``m = M-1`` down to ``n' * s``; rank ``E(m) + R + (R - 1 - k)``;
    * ``E(m) = F + max(0, m // s + 1 - N + F)`` = contributions of the head's earlier rounds (F long tiles and the short
      tiles ``n' >= N - F`` that reach row m).

    Every CTA does ``2M - (N-1)s`` steps per chunk (``M + s`` when ``M = N s``).

GQA sibling fold (:func:`fold_siblings`, ``build_orders(..., fold=True)``)
    Every order above on a grid of ``B * Hk`` heads (the K/V heads), each tile ``(b, hk, n)`` walking its steps once
    per query head sharing ``hk`` (``h = hk * G + s``, ``s = 0 .. G-1``) with the Q tiles and ranks of the unfolded
    walk; dK/dV stay in the tile (no dK/dV order).  Deadlock freedom: ``hopper/schedule/policies.hpp``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import heapq

import numpy as np

from .. import variants
from .costs import default_costs
from .tiles import TileGrid

SCHEDULES = variants.SCHEDULE_NAMES


def applicable(schedule: str, mask: str, banded: bool = False) -> bool:
    """Whether ``schedule`` may be requested for ``mask`` (the masks of its entry in ``variants.SCHEDULES``); every
    schedule is defined on a band (``banded``)."""
    return banded or mask in variants.schedule(schedule).masks


def check_applicable(schedule: str, mask: str, banded: bool) -> None:
    """ValueError unless ``schedule`` may be requested for ``mask`` (:func:`applicable`)."""
    if not applicable(schedule, mask, banded):
        raise ValueError(f"schedule {schedule!r} needs a {' or '.join(variants.schedule(schedule).masks)} mask, "
                         f"got mask {mask!r}")


@dataclass(frozen=True)
class Orders:
    """Tiles and steps in CTA-major execution order (CTA 0's work first, each CTA's work in program order)."""

    num_ctas: int
    tile_cta: np.ndarray  # (T,) CTA running the tile
    tile_round: np.ndarray  # (T,) persistent round (wave) of the tile
    tile_b: np.ndarray
    tile_h: np.ndarray
    tile_n: np.ndarray
    tile_len: np.ndarray  # (T,) number of steps (0 for a task-less tile)
    step_m: np.ndarray  # (S,) Q tile of each step
    step_rank: np.ndarray  # (S,) rank of each step in its dQ tile
    schedule_used: str
    description: str
    fallback: str | None = None  # why the requested schedule could not run, when schedule_used differs from it
    fold: int = 1  # GQA sibling fold: query heads per tile (tile_h is then the K/V head, step_h each step's head)
    step_h: np.ndarray | None = None  # (S,) query head of each step; None: the tile's head


def waves(unit: np.ndarray, per_head, num_ctas: int,
          head_start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Wave model of linear unit indices (tiles or pairs) on a static grid of ``num_ctas``: ``(R, F, k)`` per unit,
    the units of its head running in its round, those of its head in earlier rounds, and its slot in the round.
    ``per_head`` units per head, starting at ``head_start`` (default: heads back to back from unit 0; a pack's heads
    start where its sequences do)."""
    if head_start is None:
        head_start = (unit // per_head) * per_head
    wave_start = (unit // num_ctas) * num_ctas
    finished = np.maximum(0, wave_start - head_start)
    running = np.minimum(head_start + per_head, wave_start + num_ctas) - np.maximum(head_start, wave_start)
    slot = unit - head_start - finished
    return running, finished, slot


def slot_heads(slot: np.ndarray, heads: int, heads_kv: int) -> np.ndarray:
    """The query head of each head slot in ``[0, heads)`` (every grid lays its tiles out by slot): sibling-major,
    slot ``s * Hk + hk`` is sibling ``s`` of K/V head ``hk``, head ``hk * (H / Hk) + s``; the identity without GQA.
    Siblings add into one dK/dV tile in ascending head order, each behind the previous one: ``Hk`` slots apart
    they fall in different claim groups and rounds instead of queueing together, and each one's predecessor keeps
    the smaller slot (:meth:`.plan.Plan.check`'s dK/dV round rule).  The kernels: ``slot_head`` in
    ``hopper/schedule/policies.hpp``."""
    return (slot % heads_kv) * (heads // heads_kv) + slot // heads_kv


def expand(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For tiles with ``lengths`` steps laid out back to back: (tile index, step index within tile) of every step."""
    tile = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    return tile, np.arange(tile.size, dtype=np.int64) - starts[tile]


def claimed_tiles(claim: np.ndarray, num_n, group_heads, heads) -> tuple[np.ndarray, np.ndarray]:
    """``(head, n)`` of each claim of ``heads`` heads with ``num_n`` K/V tiles each, claimed n-major within groups of
    ``group_heads`` heads (the last group may be smaller).  Arguments broadcast: a pack passes its sequences' values
    per claim."""
    group = claim // (group_heads * num_n)
    first = group * group_heads
    size = np.minimum(group_heads, heads - first)
    in_group = claim - group * group_heads * num_n
    n = in_group // size
    return first + in_group - n * size, n


def walk_steps(m_min: np.ndarray, m_end: np.ndarray, walk_up) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tile, i, Q tile)`` of every step (the i-th of its tile) of tiles that visit ``[m_min, m_end)`` from the
    bottom (``walk_up``, one bool or one per tile) or from the top."""
    tile, i = expand(m_end - m_min)
    up = np.broadcast_to(walk_up, m_min.shape)[tile]
    return tile, i, np.where(up, m_min[tile] + i, m_end[tile] - 1 - i)


def claimed_n(position: np.ndarray, num_n, split) -> np.ndarray:
    """K/V tile of the ``position``-th claim of a head whose tiles ``n < split`` are claimed in ascending n, then
    ``n = N - 1`` down to ``split`` (``split = N``: ascending n, 0: descending n)."""
    return np.where(position < split, position, num_n - 1 - (position - split))


def claimed_ranks(step_n: np.ndarray, n_min: np.ndarray, contributions: np.ndarray, split) -> np.ndarray:
    """Rank of contribution ``(n, m)`` when dQ tile m (K/V tiles ``[n_min, n_end)``, ``n_end = n_min +
    contributions``) adds in the order :func:`claimed_n` claims its tiles: ``n - n_min(m)`` for ``n < split``, else
    the tiles ``[n_min, split)`` and then those above n: ``max(0, split - n_min) + n_end - 1 - n``."""
    return np.where(step_n < split, step_n - n_min,
                    np.maximum(0, split - n_min) + n_min + contributions - 1 - step_n)


def rank_predecessors(dq_tile: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per step, the index of the step with ``rank - 1`` in the same dQ tile (``dq_tile``: any id per dQ tile), -1 for
    rank 0 and where that step is missing."""
    order = np.lexsort((rank, dq_tile))
    pred = np.full(rank.size, -1, dtype=np.int64)
    follows = (dq_tile[order[1:]] == dq_tile[order[:-1]]) & (rank[order[1:]] == rank[order[:-1]] + 1)
    pred[order[1:][follows]] = order[:-1][follows]
    return pred


def claim_group(num_m: int, batch_heads: int, num_ctas: int) -> int:
    """Heads per claim group of the dynamic grid: the largest power of two ``<= 4 G / M``, at least 1 and at most
    ``B * H``.  Consecutive tiles of a head are then ``Hg`` claims apart, about 4 waves' worth of Q-tile steps, which
    the H200 needed (with fewer heads per group the rank chains of a head advance only at the claim rate, which this
    model, claiming instantly, does not see)."""
    want = min(4 * num_ctas // max(num_m, 1), batch_heads)
    return 1 << (int(want).bit_length() - 1) if want >= 1 else 1


def num_ctas(schedule: str, grid: TileGrid, batch_heads: int, num_sms: int) -> int:
    """Persistent CTAs of ``schedule`` (the order that runs, not a fallen-back request): one per work unit at most
    (a tile, or a pair of tiles on symmetric_shift's pair grid), and at most ``num_sms``."""
    return grid_size(batch_heads * (grid.num_n // 2 if variants.schedule(schedule).grid == "pair" else grid.num_n),
                     num_sms)


def grid_size(units: int, num_sms: int) -> int:
    """Persistent CTAs for ``units`` work units: one per unit at most, at most ``num_sms``, at least 1."""
    return max(1, min(num_sms, units))


def claim_tiles(lengths: np.ndarray, pred: np.ndarray, num_ctas: int, c: float, r: float) -> np.ndarray:
    """CTA of every tile on the dynamic grid: tiles in increasing index go to the CTA that frees up first (ties: lower
    CTA), the first ``num_ctas`` to CTAs ``0..num_ctas-1``.

    ``lengths``: steps per tile (tiles back to back in index order); ``pred``: per step, the index of its rank
    predecessor (-1 for rank 0), which must lie in a lower tile.  Step times follow the cost model of
    :mod:`.simulate`: ``end_i = max(end_{i-1} + c, end[pred_i]) + r``, i.e. with ``d = c + r`` and ``a_i = end[pred_i] +
    r``, ``end_i = i d + max(start + d, max_{j <= i} (a_j - j d))``.
    """
    starts = np.cumsum(lengths) - lengths
    end = np.zeros(int(lengths.sum()), dtype=np.float64)
    d = float(c) + float(r)
    free = [(0.0, g) for g in range(num_ctas)]
    cta = np.empty(lengths.size, dtype=np.int64)
    longest = int(lengths.max(initial=0))
    jd = np.arange(longest, dtype=np.float64) * d
    for tile in range(lengths.size):
        t0, g = heapq.heappop(free)
        cta[tile] = g
        lo, k = int(starts[tile]), int(lengths[tile])
        if k:
            p = pred[lo:lo + k]
            a = np.where(p >= 0, end[np.maximum(p, 0)] + float(r), -np.inf)
            e = jd[:k] + np.maximum(t0 + d, np.maximum.accumulate(a - jd[:k]))
            end[lo:lo + k] = e
            t0 = float(e[-1])
        heapq.heappush(free, (t0, g))
    return cta


@dataclass(frozen=True)
class Claims:
    """The tiles of a dynamic grid in claim order (index = claim ``p``): who they are, the Q tiles they visit, their
    walk, their head's claim order (:func:`claimed_n`) and their dQ tiles' ranges.  ``dq_base + m`` is a step's dQ tile
    id (any id unique per dQ tile); ``rows(tile, m)`` gives ``(n_min(m), K_m)`` of the dQ tile of each step ``(tile,
    m)``."""

    b: np.ndarray
    h: np.ndarray
    n: np.ndarray
    m_min: np.ndarray
    m_end: np.ndarray
    walk_up: np.ndarray | bool
    split: np.ndarray | int  # the head's tiles n < split are claimed in ascending n, then the others descending
    dq_base: np.ndarray
    rows: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def claimed_orders(claims: Claims, ctas: int, costs: tuple[float, float], schedule: str, description: str) -> Orders:
    """Orders of a dynamic grid: every tile walks its Q tiles in its direction, ranks follow the claim order, and the
    CTA of each claim is predicted by :func:`claim_tiles` (timing decides it on the GPU; ranks do not depend on it)."""
    tile, _, step_m = walk_steps(claims.m_min, claims.m_end, claims.walk_up)
    step_n = claims.n[tile]
    split = np.broadcast_to(claims.split, claims.n.shape)[tile]
    step_rank = claimed_ranks(step_n, *claims.rows(tile, step_m), split)
    pred = rank_predecessors(claims.dq_base[tile] + step_m, step_rank)
    lengths = claims.m_end - claims.m_min
    cta = claim_tiles(lengths, pred, ctas, *costs)
    order = np.argsort(cta, kind="stable")  # CTA-major; each CTA's tiles stay in claim order
    steps = np.argsort(cta[tile], kind="stable")  # the same for the steps, each tile's steps in order
    claim = np.arange(lengths.size, dtype=np.int64)
    return Orders(ctas, cta[order], claim[order], claims.b[order], claims.h[order], claims.n[order], lengths[order],
                  step_m[steps], step_rank[steps], schedule, description)


def dynamic_walk(schedule: str, grid: TileGrid) -> tuple[bool, int]:
    """``(walk_up, split)`` of ``schedule`` on the dynamic grid for ``grid``: a head's tiles ``n < split`` are claimed
    first, in ascending n, and walk up (``walk_up``) or down; the others are claimed from ``n = N - 1`` down and walk
    up.  Ascending and descending claim every tile in ascending n (``split = N``), ``split`` its long half
    (``N // 2``), ``diagonal`` none (``split = 0``); ``shift`` on a band claims descending n and walks up (``split = 0``) where :func:`band_walks_up`
    says so, else it is descending."""
    num_n = grid.num_n
    if schedule == "shift":
        up = band_walks_up(grid)
        return up, 0 if up else num_n
    if schedule == "split":
        return False, num_n // 2
    if schedule == "diagonal":
        return True, 0
    return schedule == "ascending", num_n


def _dynamic(grid: TileGrid, batch: int, heads: int, num_sms: int, schedule: str, costs: tuple[float, float],
             claim_heads: int | None, heads_kv: int) -> Orders:
    """A walk over the dynamic grid (:func:`dynamic_walk`): claims n-major within groups of heads (flat ``b * H +
    h``), each head's tiles in the order :func:`claimed_n` gives, and ranked in that order."""
    num_m, num_n = grid.num_m, grid.num_n
    bh = batch * heads
    ctas = num_ctas(schedule, grid, bh, num_sms)
    group_heads = claim_group(num_m, bh, ctas) if claim_heads is None else min(claim_heads, bh)
    walk_up, split = dynamic_walk(schedule, grid)
    q, position = claimed_tiles(np.arange(bh * num_n, dtype=np.int64), num_n, group_heads, bh)
    n = claimed_n(position, num_n, split)
    n_min, k_m = grid.n_min(), grid.contributions()
    claims = Claims(q // heads, slot_heads(q % heads, heads, heads_kv), n, grid.m_min()[n], grid.m_end()[n],
                    walk_up | (n >= split), split, q * num_m, lambda tile, m: (n_min[m], k_m[m]))
    if schedule == "split":
        walk = f"n < {split} ascending walking down, then n descending walking up; "
    elif schedule == "diagonal":
        walk = "n descending walking up; "
    elif grid.banded:
        walk = f"walks {'up' if walk_up else 'down'} the band, n {'de' if split == 0 else 'a'}scending; "
    else:
        walk = ""
    return claimed_orders(claims, ctas, costs, schedule,
                          f"{schedule} over a dynamic persistent grid of {ctas} CTAs ({walk}claims n-major in groups "
                          f"of {group_heads} head(s))")


def band_walks_up(grid: TileGrid) -> bool:
    """Whether ``shift`` on the band ``grid`` walks up from ``m_min`` (else it is ``descending``): where fewer of its
    non-empty tiles start on the same Q tile as the previous one at the lower edge than at the upper edge.  Tiles that
    start together queue on their first Q tile; the band's diagonal staggers the other starts."""
    lo, end = grid.m_min(), grid.m_end()
    both = (end > lo)[1:] & (end > lo)[:-1]
    return int((both & (lo[1:] == lo[:-1])).sum()) < int((both & (end[1:] == end[:-1])).sum())


def shift_steps(num_m, step_n: np.ndarray, running: np.ndarray, finished: np.ndarray, slot: np.ndarray,
                i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Q tile, rank)`` of step ``i`` of a full-mask tile on the static grid (module docstring, ``shift``): its
    ``(R, F, k)`` from :func:`waves`; a (head, round) group with ``R > M`` walks and ranks as ``descending``."""
    fits = running <= num_m
    step_m = np.where(fits, (slot + i) % np.maximum(num_m, 1), num_m - 1 - i)
    shifted = finished + (np.minimum(step_m, running - 1) - slot) % running
    return step_m, np.where(fits, shifted, step_n)


def over_note(head: np.ndarray, rnd: np.ndarray, over: np.ndarray, m_label: str) -> str:
    """The description's note on shift's (head, round) groups with ``R > M`` (``over``, per tile), or ""."""
    if not over.any():
        return ""
    groups = np.unique(head[over] * (int(rnd.max()) + 1) + rnd[over]).size
    return f"; {groups} (head, round) group(s) have R > {m_label} and use the descending order"


def _static(grid: TileGrid, batch: int, heads: int, num_sms: int, heads_kv: int) -> Orders:
    """``shift`` on the static persistent grid (module docstring)."""
    num_m, num_n = grid.num_m, grid.num_n
    total = batch * heads * num_n
    ctas = num_ctas("shift", grid, batch * heads, num_sms)
    t = np.arange(total, dtype=np.int64)
    t = t[np.argsort(t % ctas, kind="stable")]  # CTA-major, rounds ascending within a CTA
    n, q = t % num_n, t // num_n
    lengths = num_m - grid.m_min()[n]
    tile, i = expand(lengths)
    running, finished, slot = waves(t, num_n, ctas)
    step_m, step_rank = shift_steps(num_m, n[tile], running[tile], finished[tile], slot[tile], i)
    note = over_note(q, t // ctas, running > num_m, f"M={num_m}")
    return Orders(ctas, t % ctas, t // ctas, q // heads, slot_heads(q % heads, heads, heads_kv), n, lengths, step_m,
                  step_rank, "shift", f"shift over a static persistent grid of {ctas} CTAs{note}")


def symmetric_shift_fallback(grid: TileGrid) -> str | None:
    """Why ``symmetric_shift`` cannot run on ``grid`` (then ``descending`` is used), or None if its assumptions hold."""
    if grid.mask != "causal" and not grid.banded:
        return "symmetric_shift needs the causal mask"
    if grid.seqlen_q != grid.seqlen_k:
        return f"symmetric_shift needs seqlen_q == seqlen_k (got {grid.seqlen_q} != {grid.seqlen_k})"
    if grid.block_n % grid.block_m:
        return f"symmetric_shift needs block_n % block_m == 0 (got {grid.block_m}x{grid.block_n} tiles)"
    if grid.num_n % 2:
        return f"symmetric_shift needs an even number of K/V tiles (got N={grid.num_n})"
    return _band_pairs_problem(grid) if grid.banded else None


def _band_pairs_problem(grid: TileGrid) -> str:
    """Why the band's pairs ``(n, N-1-n)`` cannot share a CTA: with the other assumptions (seqlen_q == seqlen_k,
    block_n a multiple of block_m) a band always differs from the causal triangle, whose pairs alone have
    complementary tile counts."""
    triangle = TileGrid("causal", grid.seqlen_q, grid.seqlen_k, grid.block_m, grid.block_n).tile_lengths()
    pairs = (grid.tile_lengths() + grid.tile_lengths()[::-1])[:grid.num_n // 2]
    return (f"symmetric_shift pairs K/V tiles (n, N-1-n) for their complementary tile counts, which only the causal "
            f"triangle's tiles have ({int(triangle[0] + triangle[-1])} steps per pair); on {grid.describe()} the "
            f"pairs take {int(pairs.min())}-{int(pairs.max())} steps")


def fallback_reason(schedule: str, grid: TileGrid) -> str | None:
    """Why ``schedule`` cannot run on ``grid`` as a whole (then its ``variants`` fallback runs), or None: the
    assumptions of symmetric_shift, and split's causal triangle (a band breaks the nesting of its tiles' Q tiles
    that its up walks rely on); shift falls back per (head, round) group inside its own order."""
    if schedule == "symmetric_shift":
        return symmetric_shift_fallback(grid)
    if schedule in ("split", "diagonal") and grid.banded:
        return f"{schedule} needs the causal mask, got {grid.describe()}"
    return None


def pair_steps(num_m, num_n, s: int, stage: np.ndarray, n: np.ndarray, running: np.ndarray, finished: np.ndarray,
               slot: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Q tile, rank)`` of step ``i`` of a tile of symmetric_shift's pair grid (module docstring): the long tile
    (``stage`` 0) or the short one (1) of its chunk, whose ``(R, F, k)`` come from :func:`waves` in pairs."""
    rect_start = (finished + running - 1) * s
    rect_len = num_m - rect_start
    in_rect = i < rect_len
    m_long = np.where(in_rect, rect_start + (slot + i) % np.maximum(rect_len, 1), n * s + (i - rect_len))
    step_m = np.where(stage == 0, m_long, num_m - 1 - i)
    earlier = finished + np.maximum(0, step_m // s + 1 - num_n + finished)
    rank_long = np.where(in_rect, (np.minimum(step_m - rect_start, running - 1) - slot) % running, step_m // s - n)
    return step_m, earlier + np.where(stage == 0, rank_long, running + (running - 1 - slot))


def _symmetric(grid: TileGrid, batch: int, heads: int, num_sms: int, heads_kv: int) -> Orders:
    num_m, num_n, s = grid.num_m, grid.num_n, grid.block_n // grid.block_m
    pairs = num_n // 2
    total = batch * heads * pairs
    ctas = num_ctas("symmetric_shift", grid, batch * heads, num_sms)
    c = np.arange(total, dtype=np.int64)
    c = c[np.argsort(c % ctas, kind="stable")]
    running, finished, slot = waves(c, pairs, ctas)
    # Two tiles per chunk, long (stage 0) then short (stage 1).
    c2, run2, fin2, slot2 = (np.repeat(a, 2) for a in (c, running, finished, slot))
    stage = np.tile(np.array([0, 1], dtype=np.int64), total)
    p = c2 % pairs
    n = np.where(stage == 0, p, num_n - 1 - p)
    q = c2 // pairs
    lengths = num_m - n * s
    tile, i = expand(lengths)
    step_m, step_rank = pair_steps(num_m, num_n, s, stage[tile], n[tile], run2[tile], fin2[tile], slot2[tile], i)
    return Orders(ctas, c2 % ctas, c2 // ctas, q // heads, slot_heads(q % heads, heads, heads_kv), n, lengths,
                  step_m, step_rank, "symmetric_shift", f"symmetric_shift over a pair grid of {ctas} CTAs (s={s})")


def fold_siblings(orders: Orders, group: int) -> Orders:
    """The GQA sibling fold of ``orders``, the orders of a grid whose heads are the K/V heads: every tile (b, hk, n)
    walks its steps once per sibling ``s = 0 .. group - 1`` (query head ``hk * group + s``) with the same Q tiles and
    ranks (``hopper/schedule/sibling_walk.hpp``; the deadlock-freedom argument is in ``policies.hpp``)."""
    lengths = orders.tile_len
    starts = np.cumsum(lengths) - lengths
    tile, j = expand(lengths * group)
    sibling, i = np.divmod(j, np.maximum(lengths[tile], 1))
    src = starts[tile] + i
    return replace(orders, tile_len=lengths * group, step_m=orders.step_m[src], step_rank=orders.step_rank[src],
                   step_h=orders.tile_h[tile] * group + sibling, fold=group,
                   description=f"{orders.description}, GQA-folded ({group} query heads per tile)")


def build_orders(grid: TileGrid, batch: int, heads: int, num_sms: int, schedule: str,
                 costs: tuple[float, float] | None = None, claim_heads: int | None = None,
                 heads_kv: int | None = None, fold: bool = False) -> Orders:
    """Orders of ``schedule`` on ``grid`` for ``batch`` x ``heads`` query heads (``heads_kv`` K/V heads, default
    ``heads``: it places the heads on the grid's slots, :func:`slot_heads`) and a persistent grid of ``num_sms``
    CTAs.  ``costs`` = ``(c, r)`` per step drive the dynamic grid's predicted claims (default: :mod:`.costs` for the
    tile shape; only their ratio matters); ``claim_heads`` overrides its claim group (default: the kernel's
    :func:`claim_group`; 1 = head-major claims, the setting of :mod:`.closed_forms`).  ``fold``: the GQA sibling fold
    (:func:`fold_siblings`): the orders of a grid of ``heads_kv`` heads, each tile run for its query heads."""
    if fold:
        if heads_kv is None or heads_kv == heads:
            raise ValueError(f"fold needs heads_kv < heads (GQA), got heads={heads}, heads_kv={heads_kv}")
        return fold_siblings(build_orders(grid, batch, heads_kv, num_sms, schedule, costs, claim_heads, heads_kv),
                             heads // heads_kv)
    if costs is None:
        costs = default_costs(64, grid.block_m, grid.block_n)
    check_applicable(schedule, grid.mask, grid.banded)
    reason = fallback_reason(schedule, grid)
    if reason is not None:
        used = variants.schedule(schedule).fallback
        orders = build_orders(grid, batch, heads, num_sms, used, costs, claim_heads, heads_kv)
        return replace(orders, description=f"{orders.description} (fallback: {reason})", fallback=reason)
    heads_kv = heads if heads_kv is None else heads_kv
    if schedule == "symmetric_shift":
        return _symmetric(grid, batch, heads, num_sms, heads_kv)
    if schedule == "shift" and not grid.banded:
        return _static(grid, batch, heads, num_sms, heads_kv)
    return _dynamic(grid, batch, heads, num_sms, schedule, costs, claim_heads, heads_kv)
