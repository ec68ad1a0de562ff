"""Which order each packed sequence's backward runs, and why deterministic varlen "auto" is a portable order."""
import numpy as np
import pytest
import torch
from varlen_packs import make_pack

import flash_attn_dash.ops as ops
from flash_attn_dash import (backward_schedule_used, flash_attn_varlen_func, set_debug, variants, varlen_cuda,
                             varlen_schedule_used)
from flash_attn_dash.schedule import build_plan, bwd_tile_shape
from flash_attn_dash.launch import (CAUSAL_WINDOW, NO_WINDOW, PORTABLE_SCHEDULES, UP_WALKS, VARLEN_AUTO,
                                    VARLEN_AUTO_DIAGONAL_HDIMS, VARLEN_KERNEL_ORDERS, varlen_request)

# hdim 64: the dense "auto" runs symmetric_shift on causal 1k and shift on full 1k (measured preferences)
LENS_Q = [1024, 0, 256, 300, 1024]
LENS_K = [1024, 128, 256, 700, 0]


def _pack(**kwargs):
    return make_pack(LENS_Q, LENS_K, heads=2, heads_k=1, head_dim=64, **kwargs)


def _dense_answers(pack, causal, deterministic, schedule, sm_margin=0):
    """backward_schedule_used of each sequence alone (None where it has no work)."""
    answers = []
    for rows_q, rows_k in pack.spans():
        q, k = pack.q[rows_q].unsqueeze(0), pack.k[rows_k].unsqueeze(0)
        has_work = q.shape[1] > 0 and k.shape[1] > 0
        answers.append(backward_schedule_used(q, k, causal, deterministic, schedule, sm_margin) if has_work else None)
    return answers


def test_portable_schedules_are_kernel_orders():
    assert VARLEN_AUTO in PORTABLE_SCHEDULES and "diagonal" in PORTABLE_SCHEDULES
    assert set(PORTABLE_SCHEDULES) <= set(variants.SCHEDULE_NAMES)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_deterministic_auto_depends_on_head_dim_and_mask_only(head_dim):
    """What may change bits anyway (head dim, mask, window) picks the order, never the pack: diagonal on the causal
    mask at the head dims measured faster with it, descending elsewhere."""
    diagonal = head_dim in VARLEN_AUTO_DIAGONAL_HDIMS
    assert varlen_request(True, "auto", head_dim, CAUSAL_WINDOW) == ("diagonal" if diagonal else "descending")
    assert varlen_request(True, "auto", head_dim, NO_WINDOW) == "descending"
    assert varlen_request(True, "auto", head_dim, (128, 0)) == "descending"
    assert varlen_request(True, "split", head_dim, CAUSAL_WINDOW) == "split"
    assert varlen_request(False, "auto", head_dim, CAUSAL_WINDOW) == "auto"
    assert VARLEN_AUTO_DIAGONAL_HDIMS == (64,)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_auto_is_one_portable_order_on_every_sequence(causal):
    pack = _pack()
    got = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=causal)
    want = "diagonal" if causal else "descending"  # hdim 64
    assert got == [want, None, want, want, None]
    # where the dense auto picks a grid-dependent order, varlen does not follow it
    assert _dense_answers(pack, causal, True, "auto")[0] == ("symmetric_shift" if causal else "shift")


# everything but deterministic "auto", varlen's own rule (test above)
OTHER_REQUESTS = [(schedule, causal, deterministic)
                  for schedule, causal in [("ascending", True), ("descending", False), ("shift", False),
                                           ("symmetric_shift", True), ("auto", False), ("auto", True)]
                  for deterministic in (True, False) if not (schedule == "auto" and deterministic)]


@pytest.mark.parametrize("schedule,causal,deterministic", OTHER_REQUESTS)
def test_explicit_orders_and_nondeterministic_walks_are_the_dense_ones(monkeypatch, schedule, causal, deterministic):
    """On the per-sequence path, anything but deterministic "auto" runs what the sequence's own dense call runs,
    fallbacks included (symmetric_shift needs equal lengths: sequence 3 falls back to descending)."""
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", False)
    pack = _pack()
    got = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=causal, deterministic=deterministic,
                               schedule=schedule, sm_margin=4)
    assert got == _dense_answers(pack, causal, deterministic, schedule, sm_margin=4)
    if schedule == "symmetric_shift" and deterministic:
        assert got == ["symmetric_shift", None, "symmetric_shift", "descending", None]


@pytest.mark.parametrize("schedule,causal,deterministic", OTHER_REQUESTS)
def test_the_varlen_kernel_runs_explicit_portable_orders_and_descending_otherwise(monkeypatch, schedule, causal,
                                                                                 deterministic):
    """Where the varlen kernel runs: a deterministic ascending/descending request is what each sequence's dense call
    runs; a deterministic grid-dependent one (shift, symmetric_shift) runs per sequence, as the dense calls do; a
    non-deterministic pack walks descending on every sequence (launch.VARLEN_KERNEL_NONDETERMINISTIC_WALK)."""
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    pack = _pack()
    got = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=causal, deterministic=deterministic,
                               schedule=schedule, sm_margin=4)
    if deterministic:
        assert got == _dense_answers(pack, causal, deterministic, schedule, sm_margin=4)
    else:
        assert got == ["descending", None, "descending", "descending", None]


def test_used_lengths_decide():
    """seqused makes sequence 0 square (256 x 256), so symmetric_shift no longer falls back."""
    pack = make_pack([300], [700], heads=2, head_dim=64)
    args = pack.args()
    assert varlen_schedule_used(pack.q, pack.k, **args, causal=True, schedule="symmetric_shift") == ["descending"]
    args.update(seqused_q=torch.tensor([256], dtype=torch.int32), seqused_k=torch.tensor([256], dtype=torch.int32))
    assert varlen_schedule_used(pack.q, pack.k, **args, causal=True, schedule="symmetric_shift") == ["symmetric_shift"]
    args.update(seqused_k=torch.tensor([0], dtype=torch.int32))
    assert varlen_schedule_used(pack.q, pack.k, **args, causal=True) == [None]


def test_backward_asks_each_sequence_for_the_reported_order(monkeypatch):
    """In debug mode the dense backward resolves each sequence's launch (ops.launch_for); the varlen backward must
    ask it for the order varlen_schedule_used reports."""
    seen = []
    real = ops.launch_for

    def record(q, k, causal, deterministic, schedule, num_sms, window=(-1, -1), **kwargs):
        launch = real(q, k, causal, deterministic, schedule, num_sms, window, **kwargs)
        seen.append((q.shape[1], k.shape[1], launch.schedule))
        return launch

    monkeypatch.setattr(ops, "launch_for", record)
    pack = make_pack([256, 0, 128, 200], [256, 64, 128, 300], heads=2, head_dim=64)
    set_debug(True)
    try:
        out = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), causal=True, deterministic=True)
        out.sum().backward()
    finally:
        set_debug(None)
    assert seen == [(256, 256, "diagonal"), (128, 128, "diagonal"), (200, 300, "diagonal")]  # hdim 64, causal
    reported = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=True)
    assert reported == ["diagonal", None, "diagonal", "diagonal"]


def _head_orders(schedule, causal, seqlen, batch, b, num_sms, heads=2, h=1):
    """A head's dQ addition orders (rank -> K/V tile, per Q tile) and each K/V tile's Q-tile walk, from the model."""
    mask = "causal" if causal else "full"
    block_m, block_n = bwd_tile_shape(64, causal)
    plan = build_plan(mask, seqlen, seqlen, block_m, block_n, batch, heads, num_sms, schedule)
    mine = (plan.step_b == b) & (plan.step_h == h)
    walks = [tuple(plan.step_m[mine & (plan.step_n == n)]) for n in range(plan.grid.num_n)]
    return plan.schedule_used, plan.trace_array()[b, h], walks


# (batch, position, grid): alone on a full H200, third of three on 10 CTAs, second of five on 7
PLACEMENTS = [(1, 0, 132), (3, 2, 10), (5, 1, 7)]


@pytest.mark.parametrize("schedule,causal", [(s, causal) for s in PORTABLE_SCHEDULES for causal in (False, True)
                                              if ("causal" if causal else "full") in variants.schedule(s).masks])
def test_portable_orders_do_not_depend_on_placement_or_grid(schedule, causal):
    first, *others = (_head_orders(schedule, causal, 1024, *p) for p in PLACEMENTS)
    for other in others:
        assert other[0] == first[0] == schedule
        assert np.array_equal(other[1], first[1]) and other[2] == first[2]


@pytest.mark.parametrize("schedule,causal", [("shift", False), ("symmetric_shift", True)])
def test_round_based_orders_depend_on_placement_and_grid(schedule, causal):
    """Why they are not varlen's auto: the same head gets other ranks or walks elsewhere in the grid."""
    first, *others = (_head_orders(schedule, causal, 1024, *p) for p in PLACEMENTS)
    assert all(o[0] == first[0] == schedule for o in others)
    assert any(not np.array_equal(o[1], first[1]) or o[2] != first[2] for o in others)


@pytest.mark.parametrize("deterministic,schedule,head_dim,window,order", [
    (True, "auto", 128, NO_WINDOW, "descending"), (True, "auto", 128, CAUSAL_WINDOW, "descending"),
    (True, "auto", 64, CAUSAL_WINDOW, "diagonal"), (True, "auto", 64, NO_WINDOW, "descending"),
    (True, "auto", 64, (128, 0), "descending"),
    (True, "ascending", 128, NO_WINDOW, "ascending"), (True, "descending", 128, NO_WINDOW, "descending"),
    (True, "split", 128, CAUSAL_WINDOW, "split"), (True, "diagonal", 128, CAUSAL_WINDOW, "diagonal"),
    (True, "split", 128, NO_WINDOW, None), (True, "diagonal", 64, (128, 0), None),
    (True, "shift", 128, NO_WINDOW, None), (True, "symmetric_shift", 128, CAUSAL_WINDOW, None),
    (False, "auto", 64, CAUSAL_WINDOW, "descending"), (False, "shift", 128, NO_WINDOW, "descending"),
    (False, "diagonal", 128, CAUSAL_WINDOW, "descending"),
])
def test_varlen_kernel_runs_the_portable_orders_only(deterministic, schedule, head_dim, window, order):
    """The varlen backward kernel (hopper/bwd/launch.h with_varlen_policy) runs what each sequence's dense backward
    would run where that order is portable; a deterministic request for a grid-dependent order, or for split or
    diagonal on a pack that is not causal without a window (their policies walk the causal triangle only), gets None
    (the per-sequence path, which runs it as asked)."""
    from flash_attn_dash.launch import VARLEN_KERNEL_NONDETERMINISTIC_WALK, varlen_kernel_launch
    decided = varlen_kernel_launch(deterministic, schedule, head_dim, 10_000, 7, 16, 132, None, window,
                                   window != NO_WINDOW)
    assert (decided and decided.order) == order
    assert VARLEN_KERNEL_NONDETERMINISTIC_WALK in PORTABLE_SCHEDULES
    if decided is not None:
        tiles_bound = 16 * (10_000 // variants.head_dim(128).bwd.block_n + 7)
        assert decided.grid == min(132, tiles_bound) and not decided.gqa_fold
    assert varlen_kernel_launch(True, "auto", 64, 100, 1, 2, 132).grid == 2 * (100 // 128 + 1)


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("heads_k", [16, 4])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, 0)), (True, (128, 0)), (False, (64, 32)),
                                           (False, (128, 0)), (True, (4000, 0))])
def test_varlen_fold_folds_where_the_dense_backward_folds(deterministic, heads_k, causal, window):
    """A pack folds exactly where launch.gqa_fold folds its window, in both modes, and hands the kernel the lengths of
    varlen_fold_lengths."""
    from flash_attn_dash import launch
    from flash_attn_dash.schedule.tiles import band_steps
    block_m, block_n = variants.bwd_tile(128)
    folds = window not in ((-1, -1), (-1, 0)) and launch.gqa_fold(16, heads_k, band_steps(window, block_m, block_n))
    decided = launch.varlen_kernel_launch(deterministic, "auto", 128, 10_000, 7, 16, 132, heads_k, window, causal)
    assert decided.gqa_fold == folds
    if folds:
        assert (decided.fold_min_len_q, decided.fold_min_len_k) == launch.varlen_fold_lengths(causal, window)


def test_a_sequence_folds_exactly_when_its_dense_call_folds():
    """The prepare CTA folds a sequence when its used lengths exceed varlen_fold_lengths (hopper/common/varlen.hpp
    varlen_folds): that must be the dense backward's own decision for the sequence alone, its window taken at its
    lengths (features.kernel_window) - so the sequence gets its dense bits, whatever the pack."""
    import random
    from flash_attn_dash import features, launch
    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        causal = rng.random() < 0.5
        left = rng.choice([0, 1, 5, 63, 64, 127, 128, 300])
        right = 0 if causal else rng.choice([0, 1, 7, 64, 100])
        heads_k = rng.choice([2, 8])
        max_q, max_k = rng.choice([(2048, 2048), (4096, 4096), (1500, 3000)])
        pack_causal, pack_window = features.kernel_window(causal, (left, right), max_q, max_k)
        pack = launch.bwd_launch(pack_causal, 128, max_q, max_k, 1, 16, 132, True, "auto", pack_window, heads_k)
        if not pack.gqa_fold:
            continue
        min_q, min_k = launch.varlen_fold_lengths(causal, pack_window)
        len_q = rng.choice([1, 2, 3, right + 1, right + 2, rng.randint(1, max_q)])
        len_k = max(1, rng.choice([1, 2, left, left + 1, left + 2, rng.randint(1, max_k)]))
        seq_causal, seq_window = features.kernel_window(causal, (left, right), len_q, len_k)
        alone = launch.bwd_launch(seq_causal, 128, len_q, len_k, 1, 16, 132, True, "auto", seq_window, heads_k)
        assert alone.gqa_fold == (len_q > min_q and len_k > min_k), (causal, left, right, len_q, len_k)
        seen[alone.gqa_fold] += 1
    assert min(seen.values()) > 100, seen


def test_varlen_kernel_orders_match_the_launcher():
    """launch.h's with_varlen_policy names the orders the Python side hands it: descending in both modes, ascending
    when deterministic, split and diagonal when deterministic on the causal mask without a window (kUpWalks)."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "hopper" / "bwd" / "launch.h").read_text()
    body = text[text.index("bool with_varlen_policy"):text.index("// Launches the main kernel")]
    assert re.search(r"Schedule::kDescending\)\s*\{\s*f\(PolicyTag<Descending>", body)
    assert re.search(r"if constexpr \(Deterministic\)\s*\{\s*if \(s == Schedule::kAscending\)", body)
    up = body[body.index("if constexpr (kUpWalks)"):]
    assert re.search(r"Schedule::kSplit\)\s*\{\s*f\(PolicyTag<Split>", up)
    assert re.search(r"Schedule::kDiagonal\)\s*\{\s*f\(PolicyTag<Diagonal>", up)
    assert "with_varlen_policy<Deterministic, Is_causal && !Is_local>" in text
    assert set(VARLEN_KERNEL_ORDERS) == set(PORTABLE_SCHEDULES) == {"ascending", "descending", "split", "diagonal"}
    assert set(UP_WALKS) == {"split", "diagonal"}


def test_varlen_schedule_used_answers_the_kernels_order_where_it_runs(monkeypatch):
    """With the varlen backward kernel in use, every sequence with work answers the pack's one portable order; a
    deterministic grid-dependent request still answers per sequence (it runs one dense backward per sequence)."""
    from flash_attn_dash import varlen_cuda
    pack = _pack()
    per_sequence = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=True, deterministic=True,
                                        schedule="symmetric_shift")
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    want = [None if s is None else "descending" for s in per_sequence]
    assert varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=True, deterministic=False) == want
    diagonal = [None if s is None else "diagonal" for s in per_sequence]  # hdim 64
    assert varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=True, deterministic=True) == diagonal
    asc = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=False, deterministic=True, schedule="ascending")
    assert asc == [None if s is None else "ascending" for s in per_sequence]
    assert varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=True, deterministic=True,
                                schedule="symmetric_shift") == per_sequence
