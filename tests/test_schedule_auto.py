"""``auto`` and the launch decider: the O(1) rule, its agreement with the simulated model, fallbacks, non-deterministic
walks, and the model's own pick."""

from __future__ import annotations

import pytest

from flash_attn_dash import variants
from flash_attn_dash.launch import bwd_launch
from flash_attn_dash.schedule import (MEASURED_PREFERENCES, applicable, auto_reason, auto_schedule, build_plan,
                                      default_costs, model_choice, predict, rule_schedule)
from flash_attn_dash.schedule.auto import TIE_TOLERANCE


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_launch_is_the_models_plan(causal, head_dim):
    """Whatever the shape, the decided order is defined for the mask, runs as itself in the model (its fallback is
    resolved), and the grid and claim group are the ones the model plans."""
    mask = "causal" if causal else "full"
    bm, bn = variants.bwd_tile(head_dim)
    for sq, sk, sms in ((1024, 1024, 132), (2000, 1000, 114), (1920, 1920, 78), (300, 4000, 7), (1, 1, 132)):
        for det in (True, False):
            launch = bwd_launch(causal, head_dim, sq, sk, 2, 4, sms, det)
            assert applicable(launch.schedule, mask)
            plan = build_plan(mask, sq, sk, bm, bn, 2, 4, sms, launch.schedule, claim_heads=launch.claim_group)
            assert plan.schedule_used == launch.schedule and plan.fallback is None
            assert plan.num_ctas == launch.grid
            if variants.schedule(launch.schedule).grid == "dynamic":
                assert f"groups of {launch.claim_group} head" in plan.description


@pytest.mark.parametrize("mask,head_dim,seqlen,expect", [
    ("full", 64, 512, "shift"), ("full", 128, 16384, "shift"), ("causal", 64, 16384, "symmetric_shift"),
    ("causal", 128, 1024, "symmetric_shift"), ("causal", 128, 2048, "descending"), ("causal", 128, 16384, "descending")])
def test_committed_measurements_drive_dash_grid_picks(mask, head_dim, seqlen, expect):
    """The DASH-grid shapes request what the committed H200 runs measured fastest (auto.MEASURED_PREFERENCES)."""
    assert auto_schedule(mask, head_dim, seqlen, seqlen) == expect
    assert "measured" in auto_reason(mask, head_dim, seqlen, seqlen)
    launch = bwd_launch(mask == "causal", head_dim, seqlen, seqlen, max(1, 16384 // seqlen), 2048 // head_dim, 132,
                        True)
    assert launch.schedule == expect and launch.fallback is None


def test_outside_the_measurements_the_rule_decides():
    for mask in ("full", "causal"):
        for sq, sk in ((128, 128), (256, 256), (32768, 32768), (1 << 20, 1 << 20), (1024, 4096), (4096, 1024)):
            assert auto_schedule(mask, 64, sq, sk) == rule_schedule(mask, 64, sq, sk)
            assert "rule" in auto_reason(mask, 64, sq, sk)
    assert rule_schedule("full", 128, 2048, 4096) == "shift"  # 64x128 tiles: M = N = 32
    assert rule_schedule("full", 128, 2048, 4224) == "ascending"  # N = 33 > M
    assert rule_schedule("causal", 64, 100, 9000) == "descending"


# (mask, head_dim, seqlen_q, seqlen_k, batch, heads, num_sms): shapes outside MEASURED_PREFERENCES' lengths, where the
# rule stands alone (few and long enough to keep the simulation fast).
RULE_SHAPES = [
    ("full", 64, 128, 128, 64, 32, 132), ("full", 128, 256, 256, 1, 8, 132), ("full", 128, 384, 300, 2, 3, 100),
    ("full", 64, 20000, 20000, 1, 4, 132), ("full", 128, 32768, 32768, 1, 2, 100), ("full", 128, 200, 40000, 1, 2, 78),
    ("full", 64, 512, 4096, 4, 16, 132), ("full", 128, 2048, 16384, 1, 16, 132), ("full", 64, 8192, 1024, 2, 4, 78),
    ("full", 128, 2048, 4096, 4, 2, 132),
    ("causal", 64, 128, 128, 64, 32, 132), ("causal", 128, 256, 256, 1, 8, 132), ("causal", 64, 448, 448, 3, 5, 78),
    ("causal", 128, 20000, 20000, 1, 4, 132), ("causal", 64, 32768, 32768, 1, 2, 100),
    ("causal", 128, 30000, 20000, 1, 2, 114), ("causal", 64, 300, 400, 2, 6, 132),
]


@pytest.mark.parametrize("shape", RULE_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_rule_is_the_models_best_where_nothing_was_measured(shape):
    """The committed rule (full -> shift, causal -> descending) is the model's fastest order, or within its tie
    tolerance, at every sampled shape outside the measured lengths: the simulation checks the table."""
    mask, head_dim, sq, sk, batch, heads, sms = shape
    predictions = predict(mask, head_dim, sq, sk, batch, heads, sms)
    launch = bwd_launch(mask == "causal", head_dim, sq, sk, batch, heads, sms, True)
    best = min(p.makespan for p in predictions if p.valid)
    runs = next(p for p in predictions if p.schedule == launch.schedule)
    assert runs.valid and runs.makespan <= best * (1 + TIE_TOLERANCE), (launch, runs.makespan / best)


def test_fallback_is_resolved_and_explained():
    launch = bwd_launch(True, 64, 2048, 1024, 1, 4, 132, True, "symmetric_shift")
    assert launch.requested == "symmetric_shift" and launch.schedule == "descending"
    assert "seqlen_q == seqlen_k" in launch.fallback
    auto = bwd_launch(True, 64, 2048, 1024, 1, 4, 132, True)  # the DASH-grid measurement is for sq == sk only
    assert auto.requested == auto.schedule == "descending" and auto.fallback is None
    odd_auto = bwd_launch(True, 64, 1920, 1920, 1, 3, 78, True)  # measured symmetric_shift, but N = 15 is odd
    assert odd_auto.requested == "symmetric_shift" and odd_auto.schedule == "descending" and odd_auto.fallback
    odd = bwd_launch(True, 128, 1920, 1920, 1, 3, 78, True, "symmetric_shift")  # N = 15 K/V tiles
    assert odd.schedule == "descending" and "even number" in odd.fallback
    assert bwd_launch(False, 128, 2048, 2048, 1, 4, 132, True, "shift").fallback is None


def test_nondeterministic_walks():
    """Non-deterministic backwards walk the first order of variants.NONDETERMINISTIC_WALKS that fits, whatever
    ``schedule`` asks, claiming on the dynamic grid in the deterministic walks' groups."""
    for requested in ("auto", "ascending", "descending", "shift"):
        assert bwd_launch(False, 128, 4096, 4096, 2, 8, 132, False, requested).schedule == "shift"
    pair = bwd_launch(True, 128, 4096, 4096, 2, 8, 132, False, "ascending")
    assert pair.schedule == "symmetric_shift" and pair.grid == min(132, 2 * 8 * 16)
    walk = bwd_launch(True, 128, 4096, 2048, 2, 8, 132, False)
    assert walk.schedule == "descending" and walk.claim_group > 1
    assert bwd_launch(True, 128, 4096, 2048, 2, 8, 132, True, "descending").claim_group == walk.claim_group


def test_bad_schedule_names_every_valid_one():
    with pytest.raises(ValueError, match="valid for causal masks: 'auto', 'ascending', 'descending', 'symmetric_shift'"):
        bwd_launch(True, 64, 256, 256, 1, 1, 132, True, "shift")
    with pytest.raises(ValueError, match="valid for full masks: 'auto', 'ascending', 'descending', 'shift'"):
        bwd_launch(False, 64, 256, 256, 1, 1, 132, False, "symmetric_shift")
    with pytest.raises(ValueError, match="schedule must be one of"):
        bwd_launch(False, 64, 256, 256, 1, 1, 132, True, "fastest")
    with pytest.raises(ValueError, match="head_dim must be one of"):
        bwd_launch(False, 80, 256, 256, 1, 1, 132, True)


def test_model_choice_and_measured_preferences_are_consistent():
    assert MEASURED_PREFERENCES, "the committed measurements must be wired in"
    for pref in MEASURED_PREFERENCES:
        assert applicable(pref.schedule, pref.mask) and pref.min_seqlen <= pref.max_seqlen
    # The model alone: both balanced orders far ahead of ascending (whose rank chains start on the diagonal).
    predictions = predict("causal", 128, 2048, 2048, 8, 16, 132)
    base = predictions[0].makespan
    assert all(base / p.makespan > 1.2 for p in predictions if p.schedule in ("descending", "symmetric_shift"))
    assert model_choice(predictions).schedule in ("descending", "symmetric_shift")
    fallback = predict("causal", 128, 2048, 1024, 1, 4, 132)
    assert next(p for p in fallback if p.schedule == "symmetric_shift").schedule_used == "descending"
    assert model_choice(fallback).schedule != "symmetric_shift"


def test_default_costs_ratio():
    for head_dim, (bm, bn) in ((64, (128, 128)), (128, (64, 128))):
        c, r = default_costs(head_dim, bm, bn)
        assert 0.1 <= r / c <= 0.3
    with pytest.raises(ValueError, match="block_n"):
        default_costs(64, 128, 0)


def test_bad_mask():
    with pytest.raises(ValueError, match="mask"):
        predict("local", 64, 128, 128, 1, 1, 1)
    with pytest.raises(ValueError, match="mask"):
        auto_schedule("local", 64, 128, 128)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("causal,window,heads_k,folds", [
    (True, (127, 0), 8, True),      # gpt-oss: a narrow causal band
    (True, (64, 64), 8, True),      # a narrow two-sided band
    (True, (511, 0), 8, True),      # 4 to 11 steps per K/V tile
    (True, (127, 0), 64, False),    # MHA: no siblings
    (True, (-1, -1), 8, False),     # the causal mask
    (False, (-1, -1), 8, False),    # the full mask
    (True, (4095, 0), 8, False),    # Mistral: a wide band
    (True, (9000, 0), 8, False),    # a window wider than the sequence: the causal mask
])
def test_gqa_fold_runs_on_narrow_bands_only(head_dim, causal, window, heads_k, folds):
    """The fold's rule (launch.gqa_fold, variants.GQA_FOLD_MAX_BAND_STEPS) at 8k with 64 query heads. A folded launch
    walks the K/V heads' grid."""
    launch = bwd_launch.__wrapped__(causal, head_dim, 8192, 8192, 1, 64, 132, True, "auto", window, heads_k)
    assert launch.gqa_fold == folds
    plan = build_plan("causal" if causal else "full", 8192, 8192, *variants.bwd_tile(head_dim), 1, 64, 132,
                      launch.schedule, heads_kv=heads_k, claim_heads=launch.claim_group,
                      window=window if causal else (-1, -1), fold=launch.gqa_fold)
    assert plan.num_ctas == launch.grid


def test_band_steps_bounds_every_tile():
    """TileGrid.band_steps (O(1)) bounds the exact steps of every K/V tile, and is None on unbounded sides."""
    from flash_attn_dash.schedule.tiles import TileGrid

    for window in [(127, 0), (64, 64), (300, 0), (0, 0), (1000, 17)]:
        for sq, sk in [(8192, 8192), (1000, 1500), (1500, 1000), (333, 333)]:
            for block_m, block_n in [(128, 128), (64, 128)]:
                grid = TileGrid("causal" if window[1] == 0 else "full", sq, sk, block_m, block_n, window)
                bound = grid.band_steps()
                if bound is not None:
                    assert grid.tile_lengths().max() <= bound
    assert TileGrid("causal", 4096, 4096, 64, 128).band_steps() is None
    assert TileGrid("full", 4096, 4096, 64, 128).band_steps() is None
