"""research/overlap_model.py: the schedule model with a decoupled dQ-store warp (CPU)."""
from __future__ import annotations

import pytest

from flash_attn_dash.schedule.plan import build_plan
from flash_attn_dash.schedule.simulate import simulate
from research.overlap_model import overlapped_makespan


@pytest.mark.parametrize("c, r", [(3, 1), (1, 3), (2, 2)])
def test_one_cta_runs_at_the_slower_of_compute_and_store(c, r):
    """One CTA, no rank waits (one head, one K/V tile): the store of step i overlaps the compute of step i + 1, so
    n steps take min(c, r) + n * max(c, r) where the paper's model takes n * (c + r)."""
    plan = build_plan("full", 512, 128, 64, 128, 1, 1, 1, "descending")
    n = plan.num_steps
    assert n == 8
    assert overlapped_makespan(plan, c, r) == min(c, r) + n * max(c, r)
    assert simulate(plan, c, r).makespan == n * (c + r)


@pytest.mark.parametrize("mask, schedule", [("full", "shift"), ("causal", "descending"),
                                            ("causal", "symmetric_shift"), ("causal", "ascending")])
def test_no_store_is_the_compute_critical_path(mask, schedule):
    plan = build_plan(mask, 1024, 1024, 64, 64, 2, 4, 16, schedule)
    assert overlapped_makespan(plan, 1.0, 0.0) == pytest.approx(float(simulate(plan, 1.0, 0.0).makespan))


def test_lock_step_orders_lose_only_when_the_store_nears_the_step():
    """Causal, 64 x 64 tiles: descending's tiles open on one row, symmetric_shift's pairs start staggered. With a
    short store descending hides its chain; with one near a step (the hdim 256 timeline's rank gap) it falls behind."""
    def ratio(r):
        desc, sym = (overlapped_makespan(build_plan("causal", 8192, 8192, 64, 64, 2, 8, 132, s), 1.0, r)
                     for s in ("descending", "symmetric_shift"))
        return desc / sym

    assert ratio(0.3) < 1.0
    assert ratio(0.7) > 1.05


def test_bad_costs_are_refused():
    plan = build_plan("full", 512, 512, 64, 64, 1, 1, 4, "shift")
    with pytest.raises(ValueError, match="c and r must be >= 0"):
        overlapped_makespan(plan, -1.0, 0.5)
