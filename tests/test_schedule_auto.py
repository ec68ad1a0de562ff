"""``auto``: model-based choice, validity of the pick, fallback handling and the measured-preference hook."""

from __future__ import annotations

import pytest

from flash_attn_dash.schedule import MeasuredPreference, applicable, build_plan, choose_schedule, default_costs, predict
from flash_attn_dash.schedule.auto import choose


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_pick_is_applicable_and_valid(mask, head_dim):
    for seqlen_q, seqlen_k, num_sms in ((1024, 1024, 132), (2000, 1000, 114), (1920, 1920, 78), (300, 4000, 7)):
        name, reason = choose_schedule(mask, head_dim, seqlen_q, seqlen_k, 2, 4, num_sms)
        assert applicable(name, mask) and reason.startswith(name)
        plan = build_plan(mask, seqlen_q, seqlen_k, *((128, 128) if head_dim == 64 else (64, 128)), 2, 4, num_sms, name)
        assert plan.schedule_used == name


def test_causal_dash_grid_picks_symmetric_shift():
    name, reason = choose_schedule("causal", 128, 1024, 1024, 16, 16, 132)
    assert name == "symmetric_shift" and "measured" in reason
    # The model alone: both balanced orders far ahead of ascending (whose rank chains start on the diagonal).
    predictions = predict("causal", 128, 2048, 2048, 8, 16, 132)
    base = predictions[0].makespan
    assert all(base / p.makespan > 1.2 for p in predictions if p.schedule in ("descending", "symmetric_shift"))
    assert choose(predictions, "causal", 128, 2048, measured=())[0] in ("descending", "symmetric_shift")


def test_fallback_schedules_are_skipped_with_reason():
    predictions = predict("causal", 128, 2048, 1024, 1, 4, 132)
    sym = next(p for p in predictions if p.schedule == "symmetric_shift")
    assert not sym.valid and sym.schedule_used == "descending"
    name, reason = choose(predictions, "causal", 128, 1024)
    assert name in ("ascending", "descending") and "symmetric_shift skipped (" in reason


def test_measured_preference_overrides_model_when_valid():
    predictions = predict("full", 64, 2048, 2048, 8, 32, 132)
    model_pick, _ = choose(predictions, "full", 64, 2048, measured=())
    other = "descending" if model_pick != "descending" else "ascending"
    pref = MeasuredPreference("full", 64, 1024, 4096, other, "bench/h200.json 2026-12-01")
    name, reason = choose(predictions, "full", 64, 2048, measured=(pref,))
    assert name == other and "measured" in reason and "h200.json" in reason
    assert choose(predictions, "full", 64, 8192, measured=(pref,))[0] == model_pick  # out of its seqlen range
    causal = predict("causal", 64, 2048, 1024, 1, 4, 132)
    bad = MeasuredPreference("causal", 64, 0, 1 << 20, "symmetric_shift", "x")  # falls back on sq != sk: ignored
    assert choose(causal, "causal", 64, 1024, measured=(bad,))[0] != "symmetric_shift"


def test_default_costs_ratio():
    for head_dim, (bm, bn) in ((64, (128, 128)), (128, (64, 128))):
        c, r = default_costs(head_dim, bm, bn)
        assert 0.1 <= r / c <= 0.3
    with pytest.raises(ValueError, match="block_n"):
        default_costs(64, 128, 0)


def test_bad_mask():
    with pytest.raises(ValueError, match="mask"):
        predict("local", 64, 128, 128, 1, 1, 1)


@pytest.mark.parametrize("mask,head_dim,seqlen,expect", [
    ("full", 64, 512, "shift"), ("full", 128, 16384, "shift"), ("causal", 64, 16384, "symmetric_shift"),
    ("causal", 128, 1024, "symmetric_shift"), ("causal", 128, 2048, "descending"), ("causal", 128, 16384, "descending")])
def test_committed_measurements_drive_dash_grid_picks(mask, head_dim, seqlen, expect):
    """The DASH-grid shapes pick what the committed H200 runs measured fastest (auto.MEASURED_PREFERENCES)."""
    heads = 2048 // head_dim
    name, reason = choose_schedule(mask, head_dim, seqlen, seqlen, max(1, 16384 // seqlen), heads, 132)
    assert name == expect and "measured" in reason
