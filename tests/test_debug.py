"""Debug mode (flash_attn_dash.debug): every backward's order is proven for its grid before launch."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import flash_attn_dash
from flash_attn_dash import debug
from flash_attn_dash.launch import bwd_launch
from flash_attn_dash.schedule import ScheduleError


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    monkeypatch.delenv(debug.ENV_VAR, raising=False)
    debug.set_debug(None)
    debug.check_backward_launch.cache_clear()
    yield
    debug.set_debug(None)
    debug.check_backward_launch.cache_clear()


def test_switches(monkeypatch):
    assert not debug.debug_enabled()
    monkeypatch.setenv(debug.ENV_VAR, "1")
    assert debug.debug_enabled()
    monkeypatch.setenv(debug.ENV_VAR, "0")
    assert not debug.debug_enabled()
    flash_attn_dash.set_debug(True)
    assert debug.debug_enabled()
    flash_attn_dash.set_debug(None)
    assert not debug.debug_enabled()
    with pytest.raises(TypeError, match="enabled"):
        debug.set_debug("yes")


@pytest.mark.parametrize("causal,schedule", [(False, "ascending"), (False, "descending"), (False, "shift"),
                                             (True, "ascending"), (True, "descending"), (True, "symmetric_shift")])
@pytest.mark.parametrize("num_sms", [1, 78, 114, 132])
def test_kernel_orders_pass(causal, schedule, num_sms):
    for b, sq, sk, h, hk, d in ((2, 1024, 1024, 4, 2, 128), (1, 300, 1000, 3, 1, 64), (3, 2048, 2048, 2, 2, 64)):
        for det in (True, False):
            launch = bwd_launch(causal, d, sq, sk, b, h, num_sms, det, schedule)
            debug.check_backward_launch(causal, b, sq, sk, h, hk, d, num_sms, launch)


def test_a_launch_the_model_would_not_plan_is_refused():
    good = bwd_launch(True, 128, 1024, 1024, 2, 4, 132, True, "descending")
    debug.check_backward_launch(True, 2, 1024, 1024, 4, 4, 128, 132, good)
    bad = dataclasses.replace(good, grid=good.grid - 1)
    with pytest.raises(ScheduleError, match="disagrees"):
        debug.check_backward_launch(True, 2, 1024, 1024, 4, 4, 128, 132, bad)


def _cpu_backward(sm_margin: int) -> None:
    q, k, v = (torch.randn(1, 512, 2, 64, requires_grad=True) for _ in range(3))
    out = flash_attn_dash.flash_attn_func(q, k, v, causal=False, deterministic=True, schedule="ascending",
                                          sm_margin=sm_margin)
    out.sum().backward()


def test_backward_checks_its_order_once_per_shape(monkeypatch):
    import flash_attn_dash.schedule as sched

    built = []
    real = sched.build_plan
    monkeypatch.setattr(sched, "build_plan", lambda *a, **kw: built.append(a) or real(*a, **kw))
    _cpu_backward(0)
    assert built == []  # debug off: no model work
    flash_attn_dash.set_debug(True)
    _cpu_backward(0)
    _cpu_backward(0)
    assert len(built) == 1 and built[0][-2:] == (132, "ascending")  # (num_sms, schedule) of the launch


def test_a_deadlocking_order_is_refused_before_launch(monkeypatch):
    """Reverse every dQ tile's ranks (tile n adds last instead of n-th): on a one-CTA grid the first tile then
    waits for tiles that run after it on the same CTA, a real hang the check must catch."""
    import flash_attn_dash.schedule as sched

    real = sched.build_plan

    def reversed_ranks(*args, **kwargs):
        plan = real(*args, **kwargs)
        k_m = plan.grid.contributions()[plan.step_m]
        plan.step_rank = k_m - 1 - plan.step_rank
        return plan

    monkeypatch.setattr(sched, "build_plan", reversed_ranks)
    flash_attn_dash.set_debug(True)
    with pytest.raises(ScheduleError, match="deadlock"):
        _cpu_backward(131)  # 132 - 131 = 1 CTA


def test_cpu_margin_beyond_the_modelled_gpu_is_a_clear_error():
    flash_attn_dash.set_debug(True)
    with pytest.raises(ValueError, match="sm_margin must be < 132"):
        _cpu_backward(132)
    q = torch.empty(1, 64, 2, 64)
    with pytest.raises(ValueError, match="sm_margin must be < 132"):
        flash_attn_dash.backward_schedule_used(q, q, sm_margin=140)
