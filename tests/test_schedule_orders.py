"""Orders of the schedules: coverage against a brute-force mask, ranks, deadlock freedom, purity and fallbacks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from flash_attn_dash import variants
from flash_attn_dash.schedule import SCHEDULES, ScheduleError, applicable, build_plan, bwd_tile_shape
from flash_attn_dash.schedule.orders import claim_group
from flash_attn_dash.schedule.simulate import simulate
from flash_attn_dash.schedule.tiles import TileGrid

GRIDS = (1, 7, 78, 114, 132)
TILES = ((128, 128), (64, 128), (80, 128), (64, 96), (96, 128), (64, 64))
DYNAMIC = tuple(s.name for s in variants.SCHEDULES if s.grid == "dynamic")  # tiles claimed at run time (orders.py)


def brute_visible(mask: str, sq: int, sk: int, bm: int, bn: int) -> set[tuple[int, int]]:
    """(m, n) tiles with at least one visible element, from the elementwise mask."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    visible = np.ones((sq, sk), dtype=bool) if mask == "full" else j <= i + (sk - sq)
    num_m, num_n = -(-sq // bm), -(-sk // bn)
    padded = np.zeros((num_m * bm, num_n * bn), dtype=bool)
    padded[:sq, :sk] = visible
    tiles = padded.reshape(num_m, bm, num_n, bn).any(axis=(1, 3))
    return {(int(m), int(n)) for m, n in zip(*np.nonzero(tiles))}


def mirror(mask: str, sq: int, sk: int, bm: int, bn: int, batch: int, heads: int, num_sms: int,
           schedule: str) -> tuple[str, list[list[tuple[int, int, int, int, int]]]]:
    """Scalar re-implementation of the orders.py docstring, the way a kernel evaluates it: per CTA (b, h, n, m,
    rank); on the dynamic grid (ascending, descending, split, diagonal), whose CTAs are decided at run time, one list in claim
    order."""
    num_m, num_n = -(-sq // bm), -(-sk // bn)
    causal = mask == "causal"

    def m_min(n: int) -> int:
        return min(num_m, max(0, (n * bn - (sk - sq)) // bm)) if causal else 0

    def waves(unit: int, per_head: int, g: int) -> tuple[int, int, int]:
        head_start, wave_start = unit // per_head * per_head, unit // g * g
        finished = max(0, wave_start - head_start)
        running = min(head_start + per_head, wave_start + g) - max(head_start, wave_start)
        return running, finished, unit - head_start - finished

    pairs_ok = causal and sq == sk and bn % bm == 0 and num_n % 2 == 0
    if schedule == "symmetric_shift" and not pairs_ok:
        schedule = "descending"
    out: list[list[tuple[int, int, int, int, int]]] = []
    if schedule != "symmetric_shift":
        total = batch * heads * num_n
        g_count = min(num_sms, total)
        lists = [range(total)] if schedule in DYNAMIC else [range(g, total, g_count) for g in range(g_count)]
        group = claim_group(num_m, batch * heads, g_count)
        for tiles in lists:
            tasks = []
            for t in tiles:
                n, q = t % num_n, t // num_n
                if schedule in DYNAMIC:  # claim p = t: n-major within groups of `group` heads
                    first = t // (group * num_n) * group
                    size = min(group, batch * heads - first)
                    n, within = divmod(t - first * num_n, size)
                    q = first + within
                half = num_n // 2 if schedule == "split" else 0
                up_walk = schedule in ("split", "diagonal")
                if up_walk and n >= half:  # the short half (diagonal: every tile), from the shortest tile
                    n = num_n - 1 - (n - half)
                b, h = divmod(q, heads)
                lo = m_min(n)
                rows = list(range(lo, num_m))
                ranks = [n] * len(rows)
                if up_walk:  # ranks in claim order among the tiles touching m (those with m_min <= m)
                    touching = [sum(1 for k in range(num_n) if m_min(k) <= m) for m in rows]
                    ranks = [n if n < half else half + end - 1 - n for end in touching]
                if schedule == "descending" or (up_walk and n < half):
                    rows, ranks = rows[::-1], ranks[::-1]
                elif schedule == "shift":
                    running, finished, k = waves(t, num_n, g_count)
                    if running <= num_m:
                        rows = [(k + i) % num_m for i in range(num_m)]
                        ranks = [finished + (min(m, running - 1) - k) % running for m in rows]
                    else:
                        rows = rows[::-1]
                tasks += [(b, h, n, m, rk) for m, rk in zip(rows, ranks)]
            out.append(tasks)
        return schedule, out
    s, per_head = bn // bm, num_n // 2
    total = batch * heads * per_head
    g_count = min(num_sms, total)
    for g in range(g_count):
        tasks = []
        for chunk in range(g, total, g_count):
            q, p = divmod(chunk, per_head)
            b, h = divmod(q, heads)
            running, finished, k = waves(chunk, per_head, g_count)
            rect_start = (finished + running - 1) * s
            rect_len = num_m - rect_start

            def earlier(m: int) -> int:
                return finished + max(0, m // s + 1 - num_n + finished)

            n = p
            for i in range(rect_len):
                m = rect_start + (k + i) % rect_len
                tasks.append((b, h, n, m, earlier(m) + (min(m - rect_start, running - 1) - k) % running))
            for m in range(n * s, rect_start):
                tasks.append((b, h, n, m, earlier(m) + m // s - n))
            n = num_n - 1 - p
            for m in range(num_m - 1, n * s - 1, -1):
                tasks.append((b, h, n, m, earlier(m) + running + (running - 1 - k)))
        out.append(tasks)
    return schedule, out


def plan_tuples(plan) -> list[list[tuple[int, int, int, int, int]]]:
    """The plan's steps as :func:`mirror` lists them."""
    cols = [plan.step_b, plan.step_h, plan.step_n, plan.step_m, plan.step_rank]
    if plan.schedule_used in DYNAMIC:  # claim order
        return [[tuple(int(a[i]) for a in cols) for i in np.argsort(plan.step_round, kind="stable")]]
    out = []
    for g in range(plan.num_ctas):
        lo, hi = plan.cta_ptr[g], plan.cta_ptr[g + 1]
        out.append([tuple(int(a[i]) for a in cols) for i in range(lo, hi)])
    return out


def random_shapes(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        mask = rng.choice(("full", "causal"))
        bm, bn = rng.choice(TILES)
        if rng.random() < 0.3:
            sq = sk = bn * rng.randint(1, 3000 // bn)  # the symmetric-shift-friendly case
        else:
            sq, sk = rng.randint(1, 3000), rng.randint(1, 3000)
        yield mask, sq, sk, bm, bn, rng.randint(1, 3), rng.randint(1, 5), rng.choice(GRIDS)


def test_tile_shapes():
    assert bwd_tile_shape(64, False) == bwd_tile_shape(64, True) == (128, 128)
    assert bwd_tile_shape(128, False) == bwd_tile_shape(128, True) == (64, 128)
    assert bwd_tile_shape(96, True) == (64, 128)
    assert bwd_tile_shape(192, False) == bwd_tile_shape(192, True) == (64, 96)
    assert bwd_tile_shape(256, False) == bwd_tile_shape(256, True) == (64, 64)
    for bad in (32, 80, 160, 320):
        with pytest.raises(ValueError, match="head_dim"):
            bwd_tile_shape(bad, True)


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_tile_grid_matches_brute_force(mask):
    rng = random.Random(7)
    for _ in range(60):
        sq, sk = rng.randint(1, 700), rng.randint(1, 700)
        bm, bn = rng.choice(TILES)
        grid = TileGrid(mask, sq, sk, bm, bn)
        m_min = grid.m_min()
        fast = {(m, n) for n in range(grid.num_n) for m in range(int(m_min[n]), grid.num_m)}
        assert fast == brute_visible(mask, sq, sk, bm, bn), (sq, sk, bm, bn)
        k_m = grid.contributions()
        assert [sum(1 for (mm, _) in fast if mm == m) for m in range(grid.num_m)] == k_m.tolist()


@pytest.mark.parametrize("seed", range(16))
def test_random_shapes_valid_and_mirrored(seed):
    """Every applicable schedule covers the brute-force tile set once, has valid ranks, never deadlocks, and matches the
    scalar kernel-style formulas exactly."""
    for mask, sq, sk, bm, bn, batch, heads, grid in random_shapes(3, seed):
        visible = brute_visible(mask, sq, sk, bm, bn)
        for schedule in SCHEDULES:
            if not applicable(schedule, mask):
                continue
            plan = build_plan(mask, sq, sk, bm, bn, batch, heads, grid, schedule)
            plan.check()
            for b in range(batch):
                for h in range(heads):
                    got = {(int(m), int(n)) for bb, hh, n, m in zip(plan.step_b, plan.step_h, plan.step_n, plan.step_m)
                           if (bb, hh) == (b, h)}
                    assert got == visible
            used, expected = mirror(mask, sq, sk, bm, bn, batch, heads, grid, schedule)
            assert plan.schedule_used == used
            assert plan_tuples(plan) == expected, (mask, sq, sk, bm, bn, batch, heads, grid, schedule)


@pytest.mark.parametrize("num_sms", GRIDS + (132 - 18, 132 - 54, 3))
def test_all_grids_deadlock_free(num_sms):
    """DASH hard-coded 132; our waves follow the actual grid (incl. sm_margin 18 and 54)."""
    shapes = [("full", 2048, 2048, 64, 128, 1, 16), ("full", 1000, 3000, 128, 128, 2, 3),
              ("causal", 2048, 2048, 64, 128, 1, 16), ("causal", 1536, 1536, 128, 128, 2, 5),
              ("causal", 2000, 900, 64, 128, 1, 3)]
    for mask, sq, sk, bm, bn, batch, heads in shapes:
        for schedule in SCHEDULES:
            if applicable(schedule, mask):
                build_plan(mask, sq, sk, bm, bn, batch, heads, num_sms, schedule).check()


def test_reference_examples():
    """The worked examples of reference/fa3-and-dash.md §2.4 and §2.5."""
    plan = build_plan("full", 5 * 64, 4 * 64, 64, 64, 1, 1, 132, "shift")
    assert [plan.dq_order(0, 0, m) for m in range(5)] == [[0, 3, 2, 1], [1, 0, 3, 2], [2, 1, 0, 3], [3, 2, 1, 0],
                                                          [3, 2, 1, 0]]
    plan = build_plan("causal", 1024, 1024, 64, 128, 1, 1, 132, "symmetric_shift")
    assert plan.schedule_used == "symmetric_shift"
    tasks = plan.cta_tasks[0] + plan.cta_tasks[1] + plan.cta_tasks[3]
    rows = {n: [t[3] for t in tasks if t[2] == n] for n in (0, 1, 3)}
    assert rows[0] == list(range(6, 16)) + list(range(0, 6))
    assert rows[1] == list(range(7, 16)) + [6] + list(range(2, 6))
    assert rows[3] == list(range(9, 16)) + [6, 7, 8]
    assert [t[3] for t in plan.cta_tasks[3] if t[2] == 4] == list(range(15, 7, -1))
    assert [t[3] for t in plan.cta_tasks[0] if t[2] == 7] == [15, 14]
    assert plan.dq_order(0, 0, 15) == [3, 2, 1, 0, 4, 5, 6, 7]
    assert plan.dq_order(0, 0, 8) == [2, 1, 0, 3, 4]
    assert plan.dq_order(0, 0, 6) == [0, 3, 2, 1]
    assert plan.dq_order(0, 0, 3) == [1, 0]
    assert plan.rank(0, 0, 4, 15) == 4
    with pytest.raises(ValueError, match="does not add"):
        plan.rank(0, 0, 7, 3)


def test_ascending_descending_orders():
    plan = build_plan("causal", 300, 500, 64, 128, 2, 3, 7, "descending")
    assert plan.num_ctas == 7
    claimed = []
    num_n = plan.grid.num_n
    assert claim_group(plan.grid.num_m, 2 * 3, 7) == 4  # 4 * 7 // M = 5 -> 4 heads per group
    claim = {}  # (q, n) -> claim index: n-major in the groups {0..3}, {4, 5}
    for first, size in ((0, 4), (4, 2)):
        for n in range(num_n):
            for q in range(first, first + size):
                claim[q, n] = len(claim)
    for g, tiles in enumerate(plan.cta_tiles):  # dynamic grid: CTA g starts with claim g, then claims in order
        ps = [claim[b * 3 + h, n] for b, h, n in tiles]
        assert ps[0] == g and ps == sorted(ps)
        claimed += ps
    assert sorted(claimed) == list(range(2 * 3 * num_n))
    for tasks in plan.cta_tasks:
        for (b, h, n, m), nxt in zip(tasks, tasks[1:]):
            if nxt[:3] == (b, h, n):
                assert nxt[3] == m - 1
    trace = plan.trace_array()
    assert trace.dtype == np.int32 and trace.shape == (2, 3, plan.grid.num_m, plan.grid.num_n)
    k_m = plan.grid.contributions()
    for m in range(plan.grid.num_m):
        assert trace[1, 2, m].tolist() == list(range(k_m[m])) + [-1] * (plan.grid.num_n - k_m[m])


def test_split_order():
    """split: the long half claimed first in ascending n walking down, then n = N-1 down to N/2 walking up; each dQ
    tile adds in that claim order (N = 8, s = 2: tile n sees the Q tiles 2n .. 15)."""
    plan = build_plan("causal", 1024, 1024, 64, 128, 1, 1, 132, "split")
    plan.check()
    assert plan.schedule_used == "split" and "n < 4 ascending walking down" in plan.description
    walks = {n: [t[3] for t in plan.cta_tasks[g] if t[2] == n] for g in range(plan.num_ctas) for n in range(8)
             if any(t[2] == n for t in plan.cta_tasks[g])}
    assert walks[0] == list(range(15, -1, -1)) and walks[3] == list(range(15, 5, -1))
    assert walks[4] == list(range(8, 16)) and walks[7] == [14, 15]
    claimed = [int(n) for n in plan._orders.tile_n[np.argsort(plan._orders.tile_round)]]
    assert claimed == [0, 1, 2, 3, 7, 6, 5, 4]
    assert plan.dq_order(0, 0, 15) == [0, 1, 2, 3, 7, 6, 5, 4]
    assert plan.dq_order(0, 0, 9) == [0, 1, 2, 3, 4]
    assert plan.dq_order(0, 0, 5) == [0, 1, 2]
    band = build_plan("causal", 1024, 1024, 64, 128, 1, 1, 132, "split", window=(256, 0))
    assert band.schedule_used == "descending" and "split needs the causal mask" in band.fallback


@pytest.mark.parametrize("seed", range(3))
def test_portable_orders_are_functions_of_the_tile(seed):
    """variants' portable orders give every head the walks and ranks of that head alone on one CTA, whatever the
    batch, its position in it and the grid (sm_margin, SM count): what makes a sequence's bits its own."""
    rng = random.Random(seed)
    for mask, sq, sk, bm, bn, _, _, _ in random_shapes(4, seed):
        for schedule in (s.name for s in variants.SCHEDULES if s.portable and mask in s.masks):
            alone = build_plan(mask, sq, sk, bm, bn, 1, 1, 1, schedule)
            batch, heads, g = rng.randint(1, 4), rng.randint(1, 5), rng.choice(GRIDS + (rng.randint(1, 200),))
            b, h = rng.randrange(batch), rng.randrange(heads)
            plan = build_plan(mask, sq, sk, bm, bn, batch, heads, g, schedule)
            assert plan.schedule_used == alone.schedule_used == schedule
            assert np.array_equal(plan.trace_array()[b, h], alone.trace_array()[0, 0])
            mine = (plan.step_b == b) & (plan.step_h == h)
            for n in range(plan.grid.num_n):
                assert np.array_equal(plan.step_m[mine & (plan.step_n == n)], alone.step_m[alone.step_n == n])


def test_fully_masked_rows_have_no_contributions():
    plan = build_plan("causal", 1000, 200, 64, 128, 1, 1, 132, "ascending")
    plan.check()
    k_m = plan.grid.contributions()
    assert k_m[0] == 0 and (plan.trace_array()[0, 0, 0] == -1).all()
    assert plan.grid.m_min()[0] == (1000 - 200) // 64


def test_purity():
    for schedule, mask in (("shift", "full"), ("symmetric_shift", "causal"), ("ascending", "causal"),
                           ("split", "causal")):
        a = build_plan(mask, 2048, 2048, 64, 128, 2, 5, 114, schedule)
        b = build_plan(mask, 2048, 2048, 64, 128, 2, 5, 114, schedule)
        assert a.cta_tasks == b.cta_tasks and a.cta_tiles == b.cta_tiles
        assert np.array_equal(a.trace_array(), b.trace_array())
        assert a.description == b.description


@pytest.mark.parametrize("shape, reason", [
    ((2048, 1024, 64, 128), "seqlen_q == seqlen_k"),
    ((1920, 1920, 64, 128), "even number"),  # N = 15
    ((2048, 2048, 64, 96), "block_n % block_m"),
    ((2048, 2048, 96, 128), "block_n % block_m"),
])
def test_symmetric_shift_fallback(shape, reason):
    sq, sk, bm, bn = shape
    plan = build_plan("causal", sq, sk, bm, bn, 1, 3, 78, "symmetric_shift")
    plan.check()
    assert plan.schedule_used == "descending" and reason in plan.fallback and reason in plan.description
    assert plan.cta_tasks == build_plan("causal", sq, sk, bm, bn, 1, 3, 78, "descending").cta_tasks


def test_symmetric_shift_partial_last_tile():
    """M < N*s (S not a multiple of block_n) keeps the pair order; every CTA does 2M - (N-1)s steps per chunk."""
    plan = build_plan("causal", 8100, 8100, 64, 128, 1, 2, 132, "symmetric_shift")
    plan.check()
    assert plan.schedule_used == "symmetric_shift" and plan.fallback is None
    num_m, num_n = plan.grid.num_m, plan.grid.num_n
    assert num_m == 127 and num_n == 64
    lengths = np.diff(plan.cta_ptr)
    assert (lengths == 2 * num_m - (num_n - 1) * 2).all()


def test_shift_fallback_when_more_tiles_in_flight_than_q_tiles():
    plan = build_plan("full", 256, 16384, 64, 128, 1, 2, 132, "shift")
    plan.check()
    assert plan.schedule_used == "shift" and "R > M=4" in plan.description
    # Group of head 0 in round 0 has R = 128 > M = 4: descending rows, rank = n.
    assert [t[3] for t in plan.cta_tasks[5]][:4] == [3, 2, 1, 0]
    assert plan.dq_order(0, 0, 2) == list(range(128))
    # Head 1's tiles straddle rounds 0 and 1 (4 in round 0); that group shifts, the next falls back.
    assert plan.rank(0, 1, 0, 0) == 0 and plan.rank(0, 1, 3, 0) == 1


def test_gqa_heads_kv():
    plan = build_plan("causal", 1024, 1024, 64, 128, 2, 8, 78, "symmetric_shift", heads_kv=2)
    plan.check()
    assert np.array_equal(plan.trace_array(),
                          build_plan("causal", 1024, 1024, 64, 128, 2, 8, 78, "symmetric_shift").trace_array())
    with pytest.raises(ValueError, match="heads_kv"):
        build_plan("causal", 1024, 1024, 64, 128, 2, 8, 78, "ascending", heads_kv=3)


@pytest.mark.parametrize("kwargs, name", [
    ({"mask": "local"}, "mask"), ({"schedule": "lpt"}, "schedule"), ({"seqlen_q": 0}, "seqlen_q"),
    ({"block_n": -1}, "block_n"), ({"batch": 0}, "batch"), ({"num_sms": 0}, "num_sms"),
    ({"schedule": "shift", "mask": "causal"}, "schedule 'shift' needs a full mask"),
    ({"schedule": "symmetric_shift"}, "needs a causal mask"),
])
def test_bad_arguments(kwargs, name):
    args = {"mask": "full", "seqlen_q": 128, "seqlen_k": 128, "block_m": 64, "block_n": 64, "batch": 1, "heads": 1,
            "num_sms": 4, "schedule": "ascending", **kwargs}
    with pytest.raises(ValueError, match=name):
        build_plan(**args)


def test_check_catches_broken_plans():
    plan = build_plan("full", 256, 128, 64, 64, 1, 1, 1, "ascending")
    plan.check()
    # One CTA runs tile 0 then tile 1; making tile 1 add first deadlocks.
    plan.step_rank = 1 - plan.step_rank
    with pytest.raises(ScheduleError, match="deadlock"):
        plan.check()
    # Deadlock free, but tile 1 (round 0) waits on tile 2 (round 1).
    plan = build_plan("full", 64, 256, 64, 64, 1, 1, 2, "ascending")
    plan.step_rank = np.array([0, 2, 1, 3])[plan.step_n]
    with pytest.raises(ScheduleError, match="later persistent round"):
        plan.check()
    plan = build_plan("full", 256, 128, 64, 64, 1, 1, 2, "ascending")
    plan.step_rank = np.zeros_like(plan.step_rank)
    with pytest.raises(ScheduleError, match="share a rank"):
        plan.check()
    plan = build_plan("full", 256, 128, 64, 64, 1, 1, 2, "ascending")
    plan.step_m = plan.step_m.copy()
    plan.step_m[1] = plan.step_m[0]
    with pytest.raises(ScheduleError, match="distinct"):
        plan.check()
    plan = build_plan("causal", 256, 256, 64, 64, 1, 1, 2, "ascending")
    plan.step_rank = plan.step_rank + 1
    with pytest.raises(ScheduleError, match="outside"):
        plan.check()


def test_large_plan_is_fast():
    import time

    start = time.monotonic()
    plan = build_plan("full", 16384, 16384, 128, 128, 1, 32, 132, "shift")
    plan.check()
    assert plan.num_steps == 32 * 128 * 128
    assert time.monotonic() - start < 10


def test_claim_groups_balance_causal_tiles():
    """The dynamic grid's claim groups (both modes) against head-major claims on causal tiles, where the last head's
    longest tiles would be claimed at the end of the run while the other CTAs idle."""
    for seqlen, batch in ((2048, 8), (8192, 2), (16384, 1)):
        grid = TileGrid("causal", seqlen, seqlen, 64, 96)
        group = claim_group(grid.num_m, batch * 8, 132)
        assert group > 1
        span = {g: simulate(build_plan("causal", seqlen, seqlen, 64, 96, batch, 8, 132, "descending", claim_heads=g),
                            1.0, 0.0).makespan for g in (1, group)}  # r = 0: the balance of the claims alone
        assert span[group] < 0.98 * span[1], (seqlen, group, span)
