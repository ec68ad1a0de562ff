"""The schedule model of a varlen pack (schedule/packs.py, pack_orders.py, pack_plan.py): a pack of one sequence is
the dense batch-1 plan, a pack of equal sequences the dense batch where the grids agree, claims map one to one onto
(sequence, head, unit) in most-work-first order, portable sequences keep their dense bits whatever the pack, and
random packs (empty sequences, seqlen_k = 0, bands, GQA, small grids) are valid and deadlock-free."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from flash_attn_dash.schedule import (SCHEDULES, PackPlan, PackTiles, applicable, build_pack_plan, build_plan,
                                      critical_path, plan_dag, predict, predict_pack, simulate)
from flash_attn_dash.schedule.pack_orders import grid_kind, sequence_portable, sequence_schedules
from flash_attn_dash.schedule.packs import check_seqlens

STEP_FIELDS = ("step_cta", "step_round", "step_b", "step_h", "step_n", "step_m", "step_rank")


def assert_same_plan(got, want) -> None:
    assert (got.num_ctas, got.schedule_used, got.fallback is None) == (want.num_ctas, want.schedule_used,
                                                                       want.fallback is None)
    for name in STEP_FIELDS + ("cta_ptr",):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert got.cta_tiles == want.cta_tiles
    assert critical_path(got, 3, 1) == critical_path(want, 3, 1)


def sequence_bits(plan, b: int) -> list[tuple[int, int, int, int, int]]:
    """What fixes sequence b's bits: per (h, n) tile its walk (the i-th step visits m) and every step's rank."""
    mine = np.flatnonzero(plan.step_b == b)
    h, n, m, rank = (getattr(plan, f"step_{x}")[mine] for x in ("h", "n", "m", "rank"))
    tile = h * (int(n.max(initial=0)) + 1) + n
    first = {}
    bits = []
    for t, hh, nn, mm, rr in zip(tile.tolist(), h.tolist(), n.tolist(), m.tolist(), rank.tolist()):
        i = first.setdefault(t, [0])
        bits.append((hh, nn, i[0], mm, rr))
        i[0] += 1
    return sorted(bits)


# ---------------------------------------------------------------------------------------------------------------
# A pack of one sequence is the dense batch-1 call; a pack of equal sequences is the dense batch.

ONE_SEQUENCE = [
    # (mask, seqlen_q, seqlen_k, block_m, block_n, window)
    ("causal", 1024, 1024, 64, 128, (-1, -1)),  # symmetric_shift pairs
    ("causal", 1100, 1100, 64, 128, (-1, -1)),  # odd N: symmetric_shift falls back
    ("causal", 700, 1300, 128, 128, (-1, -1)),
    ("full", 1000, 2000, 128, 128, (-1, -1)),
    ("full", 2048, 2048, 64, 128, (-1, -1)),
    ("causal", 2048, 2048, 64, 128, (128, -1)),  # a band
    ("full", 1500, 900, 128, 128, (256, 256)),
]


@pytest.mark.parametrize("num_sms", [132, 7])
@pytest.mark.parametrize("mask, sq, sk, bm, bn, window", ONE_SEQUENCE)
def test_pack_of_one_is_the_dense_plan(mask, sq, sk, bm, bn, window, num_sms):
    checked = 0
    for schedule in SCHEDULES:
        try:
            dense = build_plan(mask, sq, sk, bm, bn, 1, 4, num_sms, schedule, heads_kv=2, window=window)
        except ValueError:  # not defined for the mask: the pack refuses it too
            with pytest.raises(ValueError, match="schedule"):
                build_pack_plan(mask, [sq], [sk], bm, bn, 4, num_sms, schedule, heads_kv=2, window=window)
            continue
        pack = build_pack_plan(mask, [sq], [sk], bm, bn, 4, num_sms, schedule, heads_kv=2, window=window)
        pack.check()
        assert_same_plan(pack, dense)
        assert pack.fallback == dense.fallback or pack.fallback.endswith(dense.fallback + ")")
        np.testing.assert_array_equal(pack.sequence_trace(0), dense.trace_array()[0])
        c, r = Fraction(5, 2), Fraction(1, 2)  # exact times: the makespans must agree exactly
        assert simulate(pack, c, r).makespan == simulate(dense, c, r).makespan
        checked += 1
    assert checked >= 3


def test_pack_of_one_predicts_the_dense_numbers():
    dense = predict("causal", 128, 2048, 2048, 1, 16, 132, 3.0, 1.0)
    pack = predict_pack("causal", 128, [2048], None, 16, 132, 3.0, 1.0)
    assert [(p.schedule, p.schedule_used, p.makespan, p.bubble_fraction, p.wait_fraction) for p in pack] == \
        [(p.schedule, p.schedule_used, p.makespan, p.bubble_fraction, p.wait_fraction) for p in dense]


@pytest.mark.parametrize("mask, seqlen, schedule, claim_heads", [
    ("full", 1024, "shift", None),  # static grid: heads start where the dense batch's do
    ("causal", 1024, "symmetric_shift", None),  # pair grid
    ("causal", 1024, "descending", 1),  # dynamic, head-major claims
    ("full", 1536, "ascending", 1),
])
@pytest.mark.parametrize("num_sms", [132, 10])
def test_pack_of_equal_sequences_is_the_dense_batch(mask, seqlen, schedule, claim_heads, num_sms):
    dense = build_plan(mask, seqlen, seqlen, 64, 128, 3, 2, num_sms, schedule, claim_heads=claim_heads)
    pack = build_pack_plan(mask, [seqlen] * 3, None, 64, 128, 2, num_sms, schedule, claim_heads=claim_heads)
    pack.check()
    assert_same_plan(pack, dense)


# ---------------------------------------------------------------------------------------------------------------
# The tile space and the claims.

def random_lengths(rng: random.Random, count: int, work: bool = True) -> tuple[list[int], list[int]]:
    """``count`` random sequences, some empty; with ``work``, at least one with seqlen_q, seqlen_k > 0."""
    choices = (0, 1, 63, 64, 65, 128, 300, 512, 1000, 1024, 2048)
    lens_q = [rng.choice(choices) for _ in range(count)]
    lens_k = list(lens_q) if rng.random() < 0.5 else [rng.choice(choices) for _ in range(count)]
    if work and not any(q and k for q, k in zip(lens_q, lens_k)):
        lens_q[0], lens_k[0] = 777, 777
    return lens_q, lens_k


@pytest.mark.parametrize("seed", range(20))
def test_claims_map_one_to_one_onto_sequence_head_unit(seed):
    rng = random.Random(seed)
    lens_q, lens_k = random_lengths(rng, rng.randint(1, 9))
    pack = PackTiles(rng.choice(("full", "causal")), lens_q, lens_k, 64, 128)
    heads = rng.randint(1, 4)
    # Claim order: a permutation, longest first (query length: one K/V tile's work), ties in the pack's order.
    order = pack.order.tolist()
    assert sorted(order) == list(range(pack.num_sequences))
    keys = [(-(pack.seqlens_q[b] if pack.grids[b] is not None else -1), b) for b in order]
    assert keys == sorted(keys)
    for units in (pack.num_n, pack.num_n // 2, np.array([rng.randint(0, 3) for _ in lens_q])):
        offsets = pack.claim_offsets(units, heads)
        assert offsets[0] == 0 and np.all(np.diff(offsets) == heads * units[pack.order])
        claims = np.arange(offsets[-1])
        i, j = pack.locate(offsets, claims)
        b = pack.order[i]
        assert np.all((j >= 0) & (j < heads * units[b]))  # inside its sequence's claims
        assert np.all(offsets[i] + j == claims)
        pairs = set(zip(b.tolist(), j.tolist()))
        assert len(pairs) == claims.size == int(heads * units.sum())  # every (sequence, head, unit) exactly once
        assert np.all(np.diff(i) >= 0)  # sequences claimed one after the other
        for bad in (-1, int(offsets[-1])):
            with pytest.raises(ValueError, match=r"claim must lie in \[0, "):
                pack.locate(offsets, np.array([bad]))


def test_tile_ranges_are_the_sequences_grids():
    pack = PackTiles("causal", [1000, 0, 300, 64], [1000, 128, 0, 200], 64, 128, (100, -1))
    assert [g is None for g in pack.grids] == [False, True, True, False]
    assert pack.num_m.tolist() == [16, 0, 5, 1] and pack.num_n.tolist() == [8, 1, 0, 2]
    for b, g in enumerate(pack.grids):
        n, m = np.arange(pack.num_n[b]), np.arange(pack.num_m[b])
        m_min, m_end = pack.m_range(np.full(n.size, b), n)
        n_min, k_m = pack.rows(np.full(m.size, b), m)
        if g is None:  # K/V tiles without steps, dQ tiles without contributions
            assert not np.any(m_end - m_min) and not np.any(k_m)
        else:
            np.testing.assert_array_equal(m_min, g.m_min())
            np.testing.assert_array_equal(m_end, g.m_end())
            np.testing.assert_array_equal(n_min, g.n_min())
            np.testing.assert_array_equal(k_m, g.contributions())
    assert pack.describe() == "causal pack of 4 sequences (2 without work), window (100, -1) (1 banded)"


@pytest.mark.parametrize("schedule", ["ascending", "descending"])
def test_dynamic_claims_go_longest_first(schedule):
    lens = [300, 2048, 0, 1024, 1024, 64]
    plan = build_pack_plan("causal", lens, None, 64, 128, 3, 20, schedule)
    claim_b = plan._orders.tile_b[np.argsort(plan._orders.tile_round)]  # the dynamic grid's round is the claim
    position = {b: i for i, b in enumerate(plan.pack.order.tolist())}
    assert [position[b] for b in claim_b.tolist()] == sorted(position[b] for b in claim_b.tolist())
    assert plan.pack.order.tolist()[:3] == [1, 3, 4]


def test_empty_sequences_and_seqlen_k_zero():
    plan = build_pack_plan("causal", [1024, 512, 0, 256], [1024, 0, 256, 256], 64, 128, 2, 16, "descending")
    plan.check()
    assert plan.sequence_schedules == ("descending", None, None, "descending")
    assert plan.sequence_portable == (True, None, None, True)
    # seqlen_k = 0: 8 dQ tiles per head that receive nothing (the kernel writes zeros)
    assert plan.sequence_trace(1).shape == (2, 8, 0)
    # seqlen_q = 0: its 2 K/V tiles per head still run, without steps, to write zero dK/dV
    tiles = [t for cta in plan.cta_tiles for t in cta if t[0] == 2]
    assert sorted(tiles) == [(2, h, n) for h in range(2) for n in range(2)]
    assert not np.any(plan.step_b == 2) and not np.any(plan.step_b == 1)
    with pytest.raises(TypeError, match="sequence_trace"):
        plan.trace_array()


# ---------------------------------------------------------------------------------------------------------------
# Portability: a portable sequence keeps the bits of its dense batch-1 call whatever it is packed with.

TARGETS = [("causal", 1024, 1024, (-1, -1)), ("full", 700, 1300, (-1, -1)), ("causal", 1100, 1100, (-1, -1)),
           ("causal", 2048, 2048, (128, -1)), ("full", 1536, 1536, (300, 300))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mask, sq, sk, window", TARGETS)
def test_portable_sequences_keep_their_dense_bits(mask, sq, sk, window, seed):
    rng = random.Random(seed)
    heads, heads_kv = 4, rng.choice((1, 2, 4))
    others_q, others_k = random_lengths(rng, rng.randint(0, 5), work=False)
    at = rng.randint(0, len(others_q))
    lens_q, lens_k = others_q[:at] + [sq] + others_q[at:], others_k[:at] + [sk] + others_k[at:]
    num_sms = rng.choice((5, 16, 132))
    checked = 0
    for schedule in SCHEDULES:
        try:
            plan = build_pack_plan(mask, lens_q, lens_k, 64, 128, heads, num_sms, schedule, heads_kv=heads_kv,
                                   window=window)
        except ValueError:
            continue
        plan.check()
        assert plan.sequence_portable == sequence_portable(plan.pack, schedule)
        if not plan.sequence_portable[at]:
            continue
        dense = build_plan(mask, sq, sk, 64, 128, 1, heads, rng.choice((3, 132)), schedule, heads_kv=heads_kv,
                           window=window)
        assert dense.schedule_used == plan.sequence_schedules[at]
        assert sequence_bits(plan, at) == sequence_bits(dense, 0), schedule
        checked += 1
    assert checked >= 2  # ascending and descending at least


def test_ascending_and_descending_are_portable_everywhere():
    for mask, schedule in (("full", "ascending"), ("causal", "descending")):
        pack = PackTiles(mask, [1024, 300, 0, 2048], [1024, 300, 64, 1000], 64, 128)
        assert grid_kind(pack, schedule) == "dynamic"
        assert sequence_portable(pack, schedule) == (True, True, None, True)


def test_static_shift_is_not_portable():
    """Shift's stagger follows the pack's rounds: the same sequence gets other ranks behind a longer one."""
    alone = build_pack_plan("full", [1024], None, 64, 128, 4, 10, "shift")
    behind = build_pack_plan("full", [2048, 1024], None, 64, 128, 4, 10, "shift")
    assert behind.grid_kind == "static" and behind.sequence_portable == (False, False) and not behind.portable
    assert sequence_bits(behind, 1) != sequence_bits(alone, 0)


def test_shift_on_a_banded_pack():
    """A band makes the grid dynamic: banded sequences keep their dense (band-walk) bits, the others do not run
    their dense order."""
    pack = PackTiles("full", [2048, 256], None, 64, 128, (256, 256))
    assert [g.banded for g in pack.grids] == [True, False]
    assert grid_kind(pack, "shift") == "dynamic"
    assert sequence_portable(pack, "shift") == (True, False)
    plan = build_pack_plan("full", [2048, 256], None, 64, 128, 2, 8, "shift", window=(256, 256))
    plan.check()
    assert not plan.portable
    dense = build_plan("full", 256, 256, 64, 128, 1, 2, 8, "shift")  # static shift, staggered ranks
    assert sequence_bits(plan, 1) != sequence_bits(dense, 0)


def test_symmetric_shift_pairs_and_singles():
    lens = [1024, 1100, 700]  # pairs; odd N; seqlen_q != seqlen_k
    plan = build_pack_plan("causal", lens, [1024, 1100, 900], 64, 128, 2, 12, "symmetric_shift")
    plan.check()
    assert plan.grid_kind == "pair" and plan.schedule_used == "symmetric_shift"
    assert plan.sequence_schedules == ("symmetric_shift", "descending", "descending")
    assert plan.sequence_portable == (False, True, True)
    assert "2 sequence(s) walk descending on it" in plan.description
    # no sequence can pair: the whole pack falls back to descending on the dynamic grid, as a dense call does
    plan = build_pack_plan("causal", [1100, 700], [1100, 900], 64, 128, 2, 12, "symmetric_shift")
    assert plan.grid_kind == "dynamic" and plan.schedule_used == "descending" and plan.portable
    assert plan.fallback.startswith("no sequence of the pack meets symmetric_shift's assumptions (sequence 0: ")


# ---------------------------------------------------------------------------------------------------------------
# Random packs: valid, deadlock-free, and the simulation agrees with the bounds.

@pytest.mark.parametrize("seed", range(40))
def test_random_packs_are_valid_and_terminate(seed):
    rng = random.Random(1000 + seed)
    lens_q, lens_k = random_lengths(rng, rng.randint(1, 7))
    mask = rng.choice(("full", "causal"))
    window = rng.choice(((-1, -1), (-1, -1), (128, -1), (200, 64), (0, 0)))
    bm, bn = rng.choice(((64, 128), (128, 128), (80, 128)))
    heads = rng.choice((1, 2, 4))
    heads_kv = rng.choice([d for d in (1, 2, 4) if heads % d == 0])
    num_sms = rng.choice((1, 3, 16, 132))
    pack = PackTiles(mask, lens_q, lens_k, bm, bn, window)
    for schedule in SCHEDULES:
        if not applicable(schedule, pack.mask, pack.banded):
            continue
        plan = build_pack_plan(mask, lens_q, lens_k, bm, bn, heads, num_sms, schedule, heads_kv=heads_kv,
                               window=window)
        assert isinstance(plan, PackPlan)
        plan.check()  # coverage, ranks, deadlock freedom (simulation and the round rule)
        assert plan.num_steps == int(pack.steps.sum()) * heads
        assert plan.sequence_schedules == sequence_schedules(pack, schedule)
        timeline = simulate(plan, 3, 1)
        longest = max(int((g.m_end() - g.m_min()).max()) for g in pack.grids if g is not None)
        assert timeline.makespan >= max(longest, -(-plan.num_steps // plan.num_ctas)) * 4
        assert timeline.makespan <= plan.num_steps * 4  # no idle time beyond serialising every step
        assert timeline.makespan == critical_path(plan, 3, 1) == plan_dag(plan, 3, 1).critical_path()


def test_packs_are_pure_functions_of_their_arguments():
    args = ("causal", [2048, 300, 1024], [2048, 500, 1024], 64, 128, 4, 20, "symmetric_shift")
    assert_same_plan(build_pack_plan(*args), build_pack_plan(*args))


# ---------------------------------------------------------------------------------------------------------------
# Bad arguments name themselves and what is accepted.

@pytest.mark.parametrize("seqlens_q, seqlens_k, message", [
    ([], None, "seqlens_q must be a non-empty sequence of ints >= 0"),
    ([128, -1], None, "seqlens_q must be a non-empty sequence of ints >= 0"),
    ([128, 1.5], None, "seqlens_q must be"),
    ([True], None, "seqlens_q must be"),
    ("128", None, "seqlens_q must be"),
    ([128], [128, 64], r"seqlens_k must have one length per sequence \(1 in seqlens_q\), got 2"),
    ([128], [-5], "seqlens_k must be"),
    ([0, 128], [128, 0], "a pack needs a sequence with seqlen_q > 0 and seqlen_k > 0"),
])
def test_bad_seqlens(seqlens_q, seqlens_k, message):
    with pytest.raises(ValueError, match=message):
        check_seqlens(seqlens_q, seqlens_k)
    with pytest.raises(ValueError, match=message):
        build_pack_plan("full", seqlens_q, seqlens_k, 64, 128, 2, 132, "ascending")


@pytest.mark.parametrize("kwargs, message", [
    ({"mask": "sliding"}, r"mask must be one of \('full', 'causal'\)"),
    ({"schedule": "zigzag"}, "schedule must be one of"),
    ({"heads": 0}, "heads must be a positive integer"),
    ({"num_sms": 0}, "num_sms must be a positive integer"),
    ({"heads_kv": 3}, "heads_kv must be a positive divisor of heads=4"),
    ({"claim_heads": 0}, "claim_heads must be a positive integer or None"),
    ({"block_m": 0}, "block_m must be a positive integer"),
    ({"window": (-2, 0)}, "window_size must be a pair"),
    ({"schedule": "symmetric_shift", "mask": "full"}, "schedule 'symmetric_shift' needs a causal mask"),
    ({"schedule": "shift", "mask": "causal"}, "schedule 'shift' needs a full mask"),
])
def test_bad_plan_arguments(kwargs, message):
    args = {"mask": "causal", "seqlens_q": [512, 256], "seqlens_k": None, "block_m": 64, "block_n": 128,
            "heads": 4, "num_sms": 132, "schedule": "ascending"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        build_pack_plan(**args)


def test_a_pack_has_no_dense_shape():
    plan = build_pack_plan("full", [256, 128], None, 64, 128, 2, 8, "ascending")
    with pytest.raises(TypeError, match="no .B, H, M, N. shape"):
        plan.shape
    assert plan.dq_order(0, 1, 3) == [0, 1] and plan.rank(0, 1, 1, 3) == 1
    with pytest.raises(ValueError, match="sequence 1"):
        plan.rank(1, 0, 1, 0)
    assert "full pack of 2 sequences" in repr(plan) and "dynamic grid" in repr(plan)
