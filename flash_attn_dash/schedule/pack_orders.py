"""The schedules on a varlen pack (:class:`.packs.PackTiles`): every sequence runs its dense order, and all of
them share one persistent grid.

Each sequence walks and ranks as its dense batch-1 call does (the formulas of :mod:`.orders`, evaluated with the
sequence's own ``M_b``, ``N_b`` and tile ranges; the same fallbacks).  What the pack adds is the grid, and whether a
sequence's order depends on it.  A sequence is **portable** (:func:`sequence_portable`) when its walks and ranks,
hence its bits, equal its dense batch-1 call's whatever it is packed with: its neighbours, its position, the number
of sequences and the grid.

Dynamic grid (ascending, descending, split; shift on a pack with a band; symmetric_shift when no sequence can pair)
    Claims go sequence by sequence in claim order (longest first, :mod:`.packs`); inside sequence b, n-major within
    groups of ``claim_group(M_b, H, G)`` heads, the claims of its dense call.  A rank is the contribution's place in
    the claim order of its dQ tile (``n - n_min(m)``, ``n_end(m) - 1 - n`` for shift walking up a band, split's
    two halves: :func:`.orders.claimed_ranks`) and every tile walks its own Q-tile range in its own direction
    (:func:`.orders.dynamic_walk`), so a sequence's walks and ranks are functions of (sequence, m, n) alone.
    Ascending, descending, split and diagonal (descending on a banded sequence, as their dense call) are portable.
    So is shift on a banded sequence (its dense call runs the same band walk); shift's other sequences in a banded pack
    walk as :func:`.orders.band_walks_up` says for their triangle or rectangle, an order their dense call (static
    shift, or no shift at all on a causal triangle) does not run, and which they run only because a neighbour is
    banded: not portable.  Deadlock freedom is the dense argument: the rank predecessor of a contribution belongs to
    the same (sequence, head) and was claimed earlier; sequences never wait on each other.
Static grid (shift on a pack without a band: every sequence full)
    Units are the K/V tiles in claim order (sequence, head, n fastest), CTA g runs units ``g, g + G, ...``, and each
    (sequence, head) is a head of dense shift whose units start at ``P_i + h N_b`` (:func:`.orders.waves` with that
    start).  Its ``(R, F, k)``, hence its stagger and ranks, follow where the head falls on the pack's rounds: they
    change with the sequences claimed before it and with G.  **Not portable.**
Pair grid (symmetric_shift, when some sequence meets its assumptions)
    Per head, a sequence that meets them (:func:`.orders.symmetric_shift_fallback`) has ``N_b / 2`` pair units run
    as dense symmetric_shift with ``(R, F, k)`` from the pack's rounds (**not portable**); one that does not has
    ``N_b`` single units that walk and rank as descending, the order its dense call falls back to, so it keeps that
    call's bits (portable).  Rank predecessors of a single are earlier units of its head, so the dense round argument
    holds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import variants
from .costs import default_costs
from .orders import (Claims, Orders, check_applicable, claim_group, claimed_n, claimed_orders, claimed_ranks,
                     claimed_tiles, dynamic_walk, expand, fallback_reason, grid_size, over_note, pair_steps,
                     shift_steps, symmetric_shift_fallback, slot_heads, walk_steps, waves)
from .packs import PackTiles


def sequence_schedules(pack: PackTiles, schedule: str) -> tuple[str | None, ...]:
    """The order each sequence runs when the pack requests ``schedule`` (None: no work), as its dense call decides:
    symmetric_shift and split fall back to descending per sequence."""
    def runs(grid) -> str:
        return variants.schedule(schedule).fallback if fallback_reason(schedule, grid) else schedule

    return tuple(None if g is None else runs(g) for g in pack.grids)


def grid_kind(pack: PackTiles, schedule: str) -> str:
    """``"dynamic"``, ``"static"`` or ``"pair"``: the persistent grid ``schedule`` runs on for ``pack`` (module
    docstring)."""
    if schedule == "shift" and not pack.banded:
        return "static"
    if schedule == "symmetric_shift" and schedule in sequence_schedules(pack, schedule):
        return "pair"
    return "dynamic"


def sequence_portable(pack: PackTiles, schedule: str) -> tuple[bool | None, ...]:
    """Per sequence (None: no work), whether its walks and ranks equal its dense batch-1 call's for ``schedule``
    whatever it is packed with (module docstring): it runs ascending or descending (the fallbacks
    included), split, or shift on its own band."""
    def portable(grid, runs: str) -> bool:
        return variants.schedule(runs).portable or (runs == "shift" and grid.banded)

    runs = sequence_schedules(pack, schedule)
    return tuple(None if g is None else portable(g, r) for g, r in zip(pack.grids, runs))


def _dynamic(pack: PackTiles, heads: int, num_sms: int, schedule: str, costs: tuple[float, float],
             claim_heads: int | None, heads_kv: int) -> Orders:
    """The dynamic grid (module docstring): claims via :meth:`.PackTiles.locate`, each sequence's walk from
    :func:`.orders.dynamic_walk`, orders from :func:`.orders.claimed_orders` as for a dense call."""
    num_m, num_n = pack.num_m, pack.num_n
    offsets = pack.claim_offsets(num_n, heads)
    ctas = grid_size(int(offsets[-1]), num_sms)
    i, j = pack.locate(offsets, np.arange(offsets[-1], dtype=np.int64))
    b = pack.order[i]
    group = np.array([claim_group(int(m), heads, ctas) if claim_heads is None else min(claim_heads, heads)
                      for m in num_m], dtype=np.int64)
    # Each sequence walks the order its dense call runs; one without work claims nothing, so its walk is never read.
    walks = np.array([(False, 0) if g is None else dynamic_walk(runs, g)
                      for g, runs in zip(pack.grids, sequence_schedules(pack, schedule))], dtype=np.int64)
    up, split = walks[b, 0].astype(bool), walks[b, 1]
    h, position = claimed_tiles(j, num_n[b], group[b], heads)
    n = claimed_n(position, num_n[b], split)
    m_min, m_end = pack.m_range(b, n)
    claims = Claims(b, slot_heads(h, heads, heads_kv), n, m_min, m_end, up | (n >= split), split,
                    pack.m_offset[b] * heads + h * num_m[b],
                    lambda tile, m: pack.rows(b[tile], m))
    return claimed_orders(claims, ctas, costs, schedule,
                          f"{schedule} over a dynamic persistent grid of {ctas} CTAs shared by the pack (claims the "
                          f"longest sequence first, n-major in groups of up to {int(group.max())} head(s))")


def _static(pack: PackTiles, heads: int, num_sms: int, heads_kv: int) -> Orders:
    """shift: the units of every (sequence, head) are a head of dense shift placed on the pack's rounds."""
    num_m, num_n = pack.num_m, pack.num_n
    offsets = pack.claim_offsets(num_n, heads)
    ctas = grid_size(int(offsets[-1]), num_sms)
    t = np.arange(offsets[-1], dtype=np.int64)
    t = t[np.argsort(t % ctas, kind="stable")]  # CTA-major, rounds ascending within a CTA
    i, j = pack.locate(offsets, t)
    b = pack.order[i]
    h, n = j // num_n[b], j % num_n[b]
    lengths = num_m[b] - pack.m_range(b, n)[0]
    tile, step = expand(lengths)
    running, finished, slot = waves(t, num_n[b], ctas, offsets[i] + h * num_n[b])
    step_m, step_rank = shift_steps(num_m[b][tile], n[tile], running[tile], finished[tile], slot[tile], step)
    note = over_note(b * heads + h, t // ctas, (running > num_m[b]) & (lengths > 0), "M")
    return Orders(ctas, t % ctas, t // ctas, b, slot_heads(h, heads, heads_kv), n, lengths, step_m, step_rank,
                  "shift",
                  f"shift over a static persistent grid of {ctas} CTAs shared by the pack (the longest "
                  f"sequence first){note}")


def _pairs(pack: PackTiles, heads: int, num_sms: int, heads_kv: int) -> Orders:
    """symmetric_shift: pair units for the sequences that meet its assumptions, single descending units for the
    others, on one static grid."""
    runs = sequence_schedules(pack, "symmetric_shift")
    paired = np.array([s == "symmetric_shift" for s in runs], dtype=bool)
    num_m, num_n, s = pack.num_m, pack.num_n, pack.block_n // pack.block_m
    units = np.where(paired, num_n // 2, num_n)
    offsets = pack.claim_offsets(units, heads)
    ctas = grid_size(int(offsets[-1]), num_sms)
    u = np.arange(offsets[-1], dtype=np.int64)
    u = u[np.argsort(u % ctas, kind="stable")]
    i, j = pack.locate(offsets, u)
    b = pack.order[i]
    h, k = j // units[b], j % units[b]
    running, finished, slot = waves(u, units[b], ctas, offsets[i] + h * units[b])
    # A pair unit is its long tile (stage 0) then its short one (stage 1); a single unit is one tile.
    unit, stage = expand(np.where(paired[b], 2, 1))
    tb = b[unit]
    n = np.where(stage == 1, num_n[tb] - 1 - k[unit], k[unit])
    m_min, m_end = pack.m_range(tb, n)
    tile, step, step_m = walk_steps(m_min, m_end, False)  # the singles' descending walk
    step_rank = claimed_ranks(n[tile], *pack.rows(tb[tile], step_m), num_n[tb[tile]])
    ps = np.flatnonzero(paired[tb[tile]])  # steps of pair tiles take the pair formulas instead
    pu, pb = unit[tile[ps]], tb[tile[ps]]
    step_m[ps], step_rank[ps] = pair_steps(num_m[pb], num_n[pb], s, stage[tile[ps]], n[tile[ps]], running[pu],
                                           finished[pu], slot[pu], step[ps])
    singles = [why for g in pack.grids if g is not None and (why := symmetric_shift_fallback(g))]
    note = f"; {len(singles)} sequence(s) walk descending on it ({singles[0]})" if singles else ""
    return Orders(ctas, u[unit] % ctas, u[unit] // ctas, tb, slot_heads(h[unit], heads, heads_kv), n, m_end - m_min,
                  step_m, step_rank,
                  "symmetric_shift", f"symmetric_shift over a pair grid of {ctas} CTAs (s={s}) shared by the pack "
                  f"(the longest sequence first){note}")


def build_pack_orders(pack: PackTiles, heads: int, num_sms: int, schedule: str,
                      costs: tuple[float, float] | None = None, claim_heads: int | None = None,
                      heads_kv: int | None = None) -> Orders:
    """Orders of ``schedule`` on ``pack`` for ``heads`` query heads on a persistent grid of at most ``num_sms`` CTAs;
    ``costs``, ``claim_heads`` and ``heads_kv`` as for :func:`.orders.build_orders`.  ``Orders.tile_b`` is the sequence's index in
    the pack."""
    if costs is None:
        costs = default_costs(64, pack.block_m, pack.block_n)
    check_applicable(schedule, pack.mask, pack.banded)
    heads_kv = heads if heads_kv is None else heads_kv
    kind = grid_kind(pack, schedule)
    if kind == "static":
        return _static(pack, heads, num_sms, heads_kv)
    if kind == "pair":
        return _pairs(pack, heads, num_sms, heads_kv)
    fallback = variants.schedule(schedule).fallback
    if fallback is not None and schedule not in sequence_schedules(pack, schedule):
        # No sequence meets its assumptions: the whole pack runs the fallback, as a dense call does.
        index, reason = next((b, why) for b, g in enumerate(pack.grids)
                             if g is not None and (why := fallback_reason(schedule, g)))
        reason = f"no sequence of the pack meets {schedule}'s assumptions (sequence {index}: {reason})"
        orders = _dynamic(pack, heads, num_sms, fallback, costs, claim_heads, heads_kv)
        return replace(orders, description=f"{orders.description} (fallback: {reason})", fallback=reason)
    return _dynamic(pack, heads, num_sms, schedule, costs, claim_heads, heads_kv)
