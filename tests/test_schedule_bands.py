"""The schedule model on sliding-window bands: tile ranges against the reference's element mask, the canonical window,
coverage and deadlock freedom of every schedule on every sampled grid, the band orders' ranks, fallbacks, and what the
simulation says about them."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from flash_attn_dash.reference import visible_mask
from flash_attn_dash.schedule import SCHEDULES, ScheduleError, applicable, build_plan, predict, simulate
from flash_attn_dash.schedule.auto import BAND_SCHEDULE, TIE_TOLERANCE, auto_reason, auto_schedule
from flash_attn_dash.schedule.costs import default_costs
from flash_attn_dash.schedule.orders import band_walks_up
from flash_attn_dash.schedule.tiles import TileGrid, canonical_window, check_window_size

SIDES = (0, 1, 63, 64, 127, 128, 1000, -1)
TILES = ((128, 128), (64, 128), (80, 128), (64, 96), (64, 64))
SHAPES = ((700, 700), (300, 1300), (1300, 300), (1024, 1024), (129, 1000))


def brute_tiles(sq: int, sk: int, bm: int, bn: int, causal: bool, window: tuple[int, int]) -> np.ndarray:
    """(M, N) bool: a tile is visible iff any of its elements is, by the reference's mask."""
    visible = visible_mask(sq, sk, causal, window).numpy()
    num_m, num_n = -(-sq // bm), -(-sk // bn)
    padded = np.zeros((num_m * bm, num_n * bn), dtype=bool)
    padded[:sq, :sk] = visible
    return padded.reshape(num_m, bm, num_n, bn).any(axis=(1, 3))


def grid_tiles(grid: TileGrid) -> np.ndarray:
    """(M, N) bool from the model's per-tile ranges."""
    m = np.arange(grid.num_m)[:, None]
    return (m >= grid.m_min()[None, :]) & (m < grid.m_end()[None, :])


def random_windows(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        sq, sk = rng.choice(SHAPES) if rng.random() < 0.5 else (rng.randint(1, 1500), rng.randint(1, 1500))
        yield sq, sk, rng.choice(TILES), rng.random() < 0.5, (rng.choice(SIDES), rng.choice(SIDES))


@pytest.mark.parametrize("seed", range(6))
def test_tile_ranges_match_the_element_mask(seed):
    for sq, sk, (bm, bn), causal, window in random_windows(40, seed):
        grid = TileGrid("causal" if causal else "full", sq, sk, bm, bn, window)
        tiles = brute_tiles(sq, sk, bm, bn, causal, window)
        assert np.array_equal(grid_tiles(grid), tiles), (sq, sk, bm, bn, causal, window)
        # Each K/V tile's Q tiles and each Q tile's K/V tiles are one contiguous range.
        assert np.array_equal(grid.contributions(), tiles.sum(1))
        first = np.where(tiles.any(1), tiles.argmax(1), 0)
        assert np.array_equal(grid.n_min()[tiles.any(1)], first[tiles.any(1)])
        assert grid.num_steps_per_head() == tiles.sum() == grid.tile_lengths().sum()
        for a in (grid.m_min(), grid.m_end(), grid.n_min()):
            assert np.all(np.diff(a) >= 0)  # the contiguity the rank formulas rely on


@pytest.mark.parametrize("seed", range(4))
def test_banded_is_a_tile_that_the_mask_alone_visits(seed):
    """The O(1) corner test of ``TileGrid.banded`` against the whole tile sets."""
    for sq, sk, (bm, bn), causal, window in random_windows(60, 100 + seed):
        grid = TileGrid("causal" if causal else "full", sq, sk, bm, bn, window)
        alone = brute_tiles(sq, sk, bm, bn, grid.mask == "causal", (-1, -1))
        assert grid.banded == (not np.array_equal(brute_tiles(sq, sk, bm, bn, causal, window), alone)), \
            (sq, sk, bm, bn, causal, window)


def test_canonical_window():
    assert canonical_window(False, (-1, -1), 100, 200) == (-1, -1)
    assert canonical_window(True, (-1, -1), 100, 200) == (-1, 0)
    assert canonical_window(True, (5, 7), 100, 200) == (5, 0)
    assert canonical_window(False, (199, 99), 100, 200) == (-1, -1)  # sides that clip nothing
    assert canonical_window(False, (198, 98), 100, 200) == (198, 98)
    full_as_causal = TileGrid("full", 300, 300, 64, 64, (-1, 0))
    assert full_as_causal.mask == "causal" and not full_as_causal.banded
    assert full_as_causal == TileGrid("causal", 300, 300, 64, 64)
    band = TileGrid("full", 300, 300, 64, 64, (100, 0))
    assert band.mask == "causal" and band.banded and band.describe() == "window (100, 0)"
    wide = TileGrid("causal", 1024, 1024, 64, 128, (1000, -1))  # hides elements, but no tile
    assert wide.window == (1000, 0) and not wide.banded and "no tile outside causal" in wide.describe()
    for bad in ((-2, 0), (0,), (0, 1, 2), (0.5, 1), (True, 0), "0,1"):
        with pytest.raises(ValueError, match="window_size"):
            check_window_size(bad)


def _check_plan(plan, tiles):
    plan.check()
    num_m = plan.grid.num_m
    for b, h in itertools.product(range(plan.batch), range(plan.heads)):
        mine = (plan.step_b == b) & (plan.step_h == h)
        got = np.zeros_like(tiles)
        got[plan.step_m[mine], plan.step_n[mine]] = True
        assert np.array_equal(got, tiles)
    if not (plan.grid.banded or plan.schedule_used in ("ascending", "descending")):
        return
    # Ranks are the tiles of each dQ tile in ascending n, or in descending n for shift walking up the band.
    order = np.argsort(plan.step_rank, kind="stable")
    up = plan.schedule_used == "shift" and plan.grid.banded and band_walks_up(plan.grid)
    for m in range(num_m):
        ns = plan.step_n[order][(plan.step_m[order] == m) & (plan.step_b[order] == 0) & (plan.step_h[order] == 0)]
        assert ns.tolist() == sorted(ns.tolist(), reverse=up)


@pytest.mark.parametrize("left", SIDES)
@pytest.mark.parametrize("right", SIDES)
def test_every_schedule_covers_the_band_and_never_deadlocks(left, right):
    """The sweep: windows x both sides x causal/non-causal x seqlen_q != seqlen_k x grids 1..200 (sampled) x every
    schedule.  ``Plan.check`` proves coverage, valid ranks and deadlock freedom for the grid it is given."""
    rng = random.Random(left * 7919 + right)
    for causal in (False, True):
        for sq, sk in ((rng.randint(64, 1500), rng.randint(64, 1500)), rng.choice(SHAPES)):
            bm, bn = rng.choice(TILES)
            tiles = brute_tiles(sq, sk, bm, bn, causal, (left, right))
            grid = TileGrid("causal" if causal else "full", sq, sk, bm, bn, (left, right))
            for schedule in SCHEDULES:
                if not applicable(schedule, grid.mask, grid.banded):
                    continue  # no band: the mask's own schedules
                for sms in (1, rng.randint(2, 40), rng.randint(41, 200)):
                    plan = build_plan("causal" if causal else "full", sq, sk, bm, bn, rng.randint(1, 2),
                                      rng.randint(1, 3), sms, schedule, window=(left, right))
                    _check_plan(plan, tiles)


@pytest.mark.parametrize("window", [(-1, 0), (1000, -1), (5000, 5000)])
def test_a_window_that_removes_no_tile_schedules_as_the_mask(window):
    for schedule in ("ascending", "descending", "symmetric_shift"):
        plain = build_plan("causal", 1024, 1024, 64, 128, 2, 3, 78, schedule)
        same = build_plan("causal" if window[1] else "full", 1024, 1024, 64, 128, 2, 3, 78, schedule, window=window)
        assert same.cta_tasks == plain.cta_tasks and np.array_equal(same.trace_array(), plain.trace_array())
    with pytest.raises(ValueError, match="needs a full mask"):
        build_plan("full", 1024, 1024, 64, 128, 1, 1, 8, "shift", window=(-1, 0))


def test_band_orders():
    """A causal band, 128x128 tiles, window (128, 0) at 1024: tile n visits Q tiles n and n+1 (the last only n)."""
    plan = build_plan("causal", 1024, 1024, 128, 128, 1, 1, 132, "descending", window=(128, 0))
    assert plan.cta_tasks[0] == [(0, 0, 0, 1), (0, 0, 0, 0)] and plan.cta_tasks[7] == [(0, 0, 7, 7)]
    assert [plan.dq_order(0, 0, m) for m in (0, 1, 7)] == [[0], [0, 1], [6, 7]]
    up = build_plan("causal", 1024, 1024, 128, 128, 1, 1, 132, "shift", window=(128, 0))
    assert band_walks_up(up.grid) and "walks up the band" in up.description
    assert up.cta_tasks[0] == [(0, 0, 7, 7)] and up.cta_tasks[7] == [(0, 0, 0, 0), (0, 0, 0, 1)]
    assert [up.dq_order(0, 0, m) for m in (0, 1, 7)] == [[0], [1, 0], [7, 6]]
    # A band open to the right ties at its lower edge (every tile starts on Q tile 0): shift walks down there.
    down = build_plan("full", 1024, 1024, 128, 128, 1, 1, 132, "shift", window=(0, -1))
    assert not band_walks_up(down.grid) and "walks down the band" in down.description
    assert down.cta_tasks == build_plan("full", 1024, 1024, 128, 128, 1, 1, 132, "descending",
                                        window=(0, -1)).cta_tasks
    # Tiles no query sees keep their (empty) place for the dK/dV write.
    empty = build_plan("full", 200, 1000, 64, 128, 1, 1, 132, "descending", window=(10, 0))
    assert empty.grid.tile_lengths()[0] == 0 and [] in empty.cta_tasks and len(empty.cta_tiles) == 8


def test_symmetric_shift_falls_back_on_bands():
    plan = build_plan("causal", 2048, 2048, 64, 128, 1, 4, 132, "symmetric_shift", window=(512, 0))
    plan.check()
    assert plan.schedule_used == "descending"
    assert "complementary tile counts" in plan.fallback and "(34 steps per pair)" in plan.fallback  # 2M - (N-1)s
    assert plan.cta_tasks == build_plan("causal", 2048, 2048, 64, 128, 1, 4, 132, "descending",
                                        window=(512, 0)).cta_tasks
    full_band = build_plan("full", 2048, 2048, 64, 128, 1, 4, 132, "symmetric_shift", window=(256, 256))
    assert full_band.schedule_used == "descending" and "complementary" in full_band.fallback
    other = build_plan("causal", 2048, 1024, 64, 128, 1, 4, 132, "symmetric_shift", window=(512, 0))
    assert "seqlen_q == seqlen_k" in other.fallback


def _ratio_to_ideal(plan, c, r):
    """Makespan over the work spread evenly on the grid (a lower bound)."""
    return float(simulate(plan, c, r).makespan) / (plan.num_steps * (c + r) / plan.num_ctas)


def test_the_model_reproduces_the_ascending_queue_and_the_band_orders_avoid_it():
    """gpt-oss-shaped: hdim 64 (128x128 tiles), window 128, 8k, 64 heads.  FlashAttention-3's ascending order queues
    every tile of a head behind its predecessor; descending and shift stay within 1% of the ideal."""
    c, r = default_costs(64, 128, 128)
    plans = {s: build_plan("causal", 8192, 8192, 128, 128, 1, 64, 132, s, window=(128, 0), costs=(c, r))
             for s in ("ascending", "descending", "shift")}
    assert _ratio_to_ideal(plans["ascending"], c, r) > 5
    assert _ratio_to_ideal(plans["descending"], c, r) < 1.01
    assert _ratio_to_ideal(plans["shift"], c, r) < 1.01
    assert simulate(plans["shift"], c, r).wait.max() < 1e-9 * c  # the up walk never waits on a causal band


def test_shift_never_waits_where_descending_queues():
    """Window 4096 at 8k, hdim 128: the band's last 32 tiles share the last Q tile.  Descending queues there once
    (small at the default costs, more as the reduce gets dearer); shift does not wait at all."""
    for c, r in ((5, 1), (1, 1), (1, 2)):  # integer costs: exact times
        plans = {s: build_plan("causal", 8192, 8192, 64, 128, 2, 16, 132, s, window=(4096, 0), costs=(c, r))
                 for s in ("descending", "shift")}
        assert simulate(plans["descending"], c, r).wait_fraction > 0
        assert simulate(plans["shift"], c, r).wait_fraction == 0


# (head_dim, seqlen_q, seqlen_k, causal, window, batch, heads): model-shaped bands (gpt-oss window 128 with 64
# heads, Gemma-style window 4096, local attention, sq != sk).
BAND_SHAPES = [
    (64, 8192, 8192, True, (128, 0), 2, 64), (64, 32768, 32768, True, (128, 0), 1, 64),
    (128, 8192, 8192, True, (4096, 0), 2, 16), (128, 16384, 16384, True, (4096, 0), 1, 16),
    (64, 4096, 4096, False, (256, 256), 4, 32), (128, 4096, 4096, False, (1024, 1024), 4, 16),
    (128, 2048, 2048, True, (512, 0), 8, 16), (64, 4000, 6000, True, (1000, 0), 2, 32),
    (128, 6000, 4000, False, (700, 100), 2, 16), (64, 16384, 16384, False, (-1, 100), 1, 32),
]


@pytest.mark.parametrize("shape", BAND_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_band_rule_is_the_models_best(shape):
    head_dim, sq, sk, causal, window, batch, heads = shape
    mask = "causal" if causal else "full"
    assert auto_schedule(mask, head_dim, sq, sk, window) == BAND_SCHEDULE
    assert "picked by simulation" in auto_reason(mask, head_dim, sq, sk, window)
    predictions = predict(mask, head_dim, sq, sk, batch, heads, 132, window=window)
    assert [p.schedule for p in predictions] == list(SCHEDULES)
    best = min(p.makespan for p in predictions if p.valid)
    runs = next(p for p in predictions if p.schedule == BAND_SCHEDULE)
    assert runs.valid and runs.makespan <= best * (1 + TIE_TOLERANCE), runs.makespan / best


def test_auto_without_a_band_is_unchanged():
    assert auto_schedule("causal", 128, 8192, 8192, (1000000, -1)) == auto_schedule("causal", 128, 8192, 8192)
    assert auto_schedule("full", 64, 4096, 4096, (-1, 0)) == auto_schedule("causal", 64, 4096, 4096)


def test_check_catches_a_band_order_ranked_against_its_claims():
    """Shift walking up claims n descending; ranking its contributions in ascending n instead makes tiles wait on
    tiles claimed later: the round rule flags it, and on one CTA it deadlocks."""
    for sms, message in ((132, "later persistent round"), (1, "deadlock")):
        plan = build_plan("causal", 1024, 1024, 128, 128, 1, 1, sms, "shift", window=(256, 0))
        plan.check()
        plan.step_rank = plan.step_n - plan.grid.n_min()[plan.step_m]
        with pytest.raises(ScheduleError, match=message):
            plan.check()
