"""research/overlap_model.py: the schedule model with the kernel's dQ-store warps (CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from flash_attn_dash.schedule.plan import build_plan
from flash_attn_dash.schedule.simulate import simulate
from research.overlap_model import plan_of, slack_predecessor, store_warps_makespan


@pytest.mark.parametrize("c, r", [(3, 1), (1, 3), (2, 2)])
def test_one_store_warp_overlaps_each_store_with_the_next_compute(c, r):
    """One CTA, no rank waits (one head, one K/V tile), one store warp: the store of step i overlaps the compute of
    step i + 1, so n steps take min(c, r) + n * max(c, r) where the paper's model takes n * (c + r)."""
    plan = build_plan("full", 512, 128, 64, 128, 1, 1, 1, "descending")
    n = plan.num_steps
    assert n == 8
    assert store_warps_makespan(plan, c, r, warps=1) == min(c, r) + n * max(c, r)
    assert simulate(plan, c, r).makespan == n * (c + r)


@pytest.mark.parametrize("c, r", [(3, 1), (2, 2), (1, 1.5)])
def test_two_store_warps_keep_up_with_a_store_of_up_to_two_steps(c, r):
    """Two warps take the steps in turn and the buffer is free once the copies have read it: a store shorter than two
    steps no longer holds the MMA back, so the last store ends r after the last compute."""
    plan = build_plan("full", 512, 128, 64, 128, 1, 1, 1, "descending")
    assert store_warps_makespan(plan, c, r, read=0.3) == pytest.approx(plan.num_steps * c + r)
    assert store_warps_makespan(plan, c, r) <= store_warps_makespan(plan, c, r, warps=1)


@pytest.mark.parametrize("mask, schedule", [("full", "shift"), ("causal", "descending"),
                                            ("causal", "symmetric_shift"), ("causal", "ascending")])
def test_no_store_is_the_compute_critical_path(mask, schedule):
    """On the plan's CTAs and without a store the model is the product's compute-only simulation; claiming the dynamic
    grid's tiles again in claim order can only balance them better."""
    plan = build_plan(mask, 1024, 1024, 64, 64, 2, 4, 16, schedule)
    compute = float(simulate(plan, 1.0, 0.0).makespan)
    for warps in (1, 2):
        assert store_warps_makespan(plan, 1.0, 0.0, warps=warps, dynamic=False) == pytest.approx(compute)
        assert store_warps_makespan(plan, 1.0, 0.0, warps=warps) <= compute + 1e-9


def test_lock_step_orders_lose_only_when_the_store_nears_the_step():
    """Causal, 64 x 64 tiles, one store warp (session 16's hdim 256 reading): descending's tiles open on one row,
    symmetric_shift's pairs start staggered. With a short store descending hides its chain; with one near a step it
    falls behind."""
    def ratio(r):
        desc, sym = (store_warps_makespan(build_plan("causal", 8192, 8192, 64, 64, 2, 8, 132, s), 1.0, r, warps=1)
                     for s in ("descending", "symmetric_shift"))
        return desc / sym

    assert ratio(0.3) < 1.0
    assert ratio(0.7) > 1.05


def test_diagonal_ranks_follow_arrival():
    """The diagonal order on one causal head: a dQ tile's contributions come in descending n and each tile walks up
    from its first Q tile, so with the tiles started together no store waits (each rank predecessor ran a step
    earlier on another CTA)."""
    plan = build_plan("causal", 512, 512, 128, 128, 1, 1, 4, "diagonal")
    assert [plan.dq_order(0, 0, m) for m in range(4)] == [[0], [1, 0], [2, 1, 0], [3, 2, 1, 0]]
    assert sorted([m for (_, _, _, m) in tasks] for tasks in plan.cta_tasks) == [[0, 1, 2, 3], [1, 2, 3], [2, 3], [3]]
    assert store_warps_makespan(plan, 1.0, 0.9) == pytest.approx(4 * 1.0 + 0.9)


def test_diagonal_removes_the_queue_of_short_sequences():
    """A pack of short causal sequences whose heads' tiles are claimed back to back (one head: claim groups of one):
    descending's tiles queue on their sequence's last Q tile, one store apart, which costs once the store nears a
    step; the diagonal order runs at the non-deterministic pace."""
    seqlens = [512] * 32
    desc = plan_of("causal", seqlens, 128, 128, 1, 16, "descending", 1)
    diag = plan_of("causal", seqlens, 128, 128, 1, 16, "diagonal", 1)
    assert diag.num_steps == desc.num_steps
    nondet = store_warps_makespan(desc, 1.0, 0.9, deterministic=False)
    assert store_warps_makespan(desc, 1.0, 0.9) > 1.15 * nondet
    assert store_warps_makespan(diag, 1.0, 0.9) < nondet
    assert store_warps_makespan(desc, 1.0, 0.3) == store_warps_makespan(diag, 1.0, 0.3)


def test_nondeterministic_stores_wait_for_three_ranks_back():
    """The kernel's slack: rank r waits until max(1, r - 2) contributions have landed, i.e. for rank max(0, r - 3)."""
    pred = np.array([-1, 0, 1, 2, 3, 4], dtype=np.int64)  # one dQ tile, ranks 0..5 in step order
    rank = np.arange(6)
    assert slack_predecessor(pred, rank).tolist() == [-1, 0, 0, 0, 1, 2]


def test_bad_arguments_are_refused():
    plan = build_plan("full", 512, 512, 64, 64, 1, 1, 4, "shift")
    with pytest.raises(ValueError, match="c and r must be >= 0"):
        store_warps_makespan(plan, -1.0, 0.5)
    with pytest.raises(ValueError, match="warps must be 1 or 2"):
        store_warps_makespan(plan, 1.0, 0.5, warps=3)
