"""The GQA sibling fold on the sm90 kernels (one tile per batch, K/V head and K/V tile runs every query head sharing
the K/V head; dK/dV stay in registers and are stored once), which runs on narrow sliding windows
(flash_attn_dash.launch.gqa_fold): gradients vs the fp32 reference (tests/grad_rule.py's
rule), bitwise repeats in deterministic mode, the dQ arrival order = the model's folded plan, dQ bits equal to the
unfolded kernels' where the ranks do not depend on the grid, and the launch decision. GPU only.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grad_rule import assert_tolerance_rule
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims
from test_bwd_gpu import _blocks, _inputs, _trace_buffer, _wait
from test_window_gpu import _bwd_window, assert_backward_bits_repeat

from flash_attn_dash import features, variants
from flash_attn_dash.launch import bwd_launch, model_mask

# tests/conftest.py skips them without an sm90 GPU and the kernels.
pytestmark = pytest.mark.gpu

HDIMS = gpu_head_dims()
DTYPES = gpu_dtypes()
# (batch, heads, heads_k): groups 3, 6, 4, 8 (MQA included)
HEAD_CONFIGS = [(3, 6, 2), (1, 6, 1), (2, 8, 2), (1, 8, 1)]
SHAPES = [(1024, 1024), (1000, 1500), (1500, 1000)]
# Narrow bands (the fold's rule: at most variants.GQA_FOLD_MAX_BAND_STEPS Q tiles per K/V tile at every head dim):
# gpt-oss's causal 128, a two-sided band, a causal 300.
WINDOWS = [(True, (128, 0)), (False, (64, 64)), (True, (300, -1))]
WINDOW_IDS = [f"{'causal' if c else 'full'}-{w[0]}_{w[1]}" for c, w in WINDOWS]
# Every order defined on bands ("shift" is not, in the sm90 kernels), and the non-deterministic walk.
BAND_ORDERS = [("ascending", True), ("descending", True), ("symmetric_shift", True), ("auto", False)]


_bwd = _bwd_window  # the CUDA backward into NaN-poisoned gradients, with the launch flash_attn_dash.launch decides


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("schedule,deterministic", BAND_ORDERS)
@pytest.mark.parametrize("causal,window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("b,h,hk", HEAD_CONFIGS)
def test_fold_matches_reference(b, h, hk, sq, sk, causal, window, schedule, deterministic, d, dtype):
    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, dtype, causal, window_size=window)
    grads, launch = _bwd(dout, q, k, v, out, lse, causal, window, deterministic, schedule)
    _wait(timeout=60)
    assert launch.gqa_fold
    assert_tolerance_rule(q, k, v, dout, out, grads, causal, window_size=window)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,window", WINDOWS[:2], ids=WINDOW_IDS[:2])
def test_fold_deterministic_bits_repeat(causal, window, d):
    assert_backward_bits_repeat(_bwd, causal, window, d)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("schedule", ["ascending", "descending", "symmetric_shift"])
@pytest.mark.parametrize("sq,sk,b,h,hk,margin,causal,window", [
    (2048, 2048, 2, 8, 2, 0, True, (128, 0)), (2048, 2048, 2, 8, 4, 18, False, (64, 64)),
    (1024, 1024, 1, 6, 1, 54, True, (128, 0)), (4224, 4224, 1, 4, 2, 100, True, (300, 0)),
    (1000, 2000, 1, 4, 2, 17, True, (128, 0)), (8192, 8192, 1, 16, 2, 0, True, (128, 0)),
    (2048, 2048, 2, 8, 2, 131, True, (128, 0)),
])
def test_fold_trace_matches_model(sq, sk, b, h, hk, margin, causal, window, schedule, d):
    """The kernel's dQ arrival order per (b, h, m) is the model's folded plan (build_plan(..., fold=True)), on the
    full H200 and on fewer SMs, and the run finishes under the watchdog."""
    from flash_attn_dash.schedule import build_plan

    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, torch.bfloat16, causal, window_size=window)
    trace = _trace_buffer(b, h, sq, sk, d)
    _, launch = _bwd(dout, q, k, v, out, lse, causal, window, True, schedule, sm_margin=margin, trace=trace)
    _wait(timeout=60)
    assert launch.gqa_fold
    kc, kw = features.kernel_window(causal, window, sq, sk)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count - margin
    plan = build_plan(model_mask(kc, kw), sq, sk, *_blocks(d), b, h, num_sms, launch.schedule, heads_kv=hk,
                      claim_heads=launch.claim_group, window=kw, fold=True)
    plan.check()
    assert (plan.schedule_used, plan.num_ctas) == (launch.schedule, launch.grid)
    got = trace.cpu().numpy().astype(np.int32)
    expect = plan.trace_array()
    bad = np.argwhere(got != expect)
    assert bad.size == 0, f"{plan!r} ({plan.description}): {len(bad)} trace entries differ, first (b,h,m,pos) " \
                          f"{bad[0].tolist()}: kernel {got[tuple(bad[0])]} model {expect[tuple(bad[0])]}"


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,window", WINDOWS[:2], ids=WINDOW_IDS[:2])
def test_fold_dq_bits_equal_the_unfolded_kernels(monkeypatch, causal, window, d):
    """Descending ranks dQ by n alone (n - n_min(m)), whatever the grid: folded and unfolded kernels then add the same
    contributions in the same order, so dQ is bitwise the same; dK/dV (registers vs fp32 atomics in head order) agree
    within the tolerance rule. gpt-oss's group 8, smaller."""
    q, k, v, dout, out, lse = _inputs(1, 4096, 4096, 16, 2, d, torch.bfloat16, causal, window_size=window)
    folded, launch = _bwd(dout, q, k, v, out, lse, causal, window, True, "descending")
    assert launch.gqa_fold
    monkeypatch.setattr(variants, "GQA_FOLD_MAX_BAND_STEPS", 0)  # the rule folds nothing
    bwd_launch.cache_clear()
    plain, plain_launch = _bwd(dout, q, k, v, out, lse, causal, window, True, "descending")
    bwd_launch.cache_clear()
    _wait(timeout=60)
    assert not plain_launch.gqa_fold and plain_launch.schedule == launch.schedule
    assert torch.equal(folded[0], plain[0])
    assert_tolerance_rule(q, k, v, dout, out, folded, causal, window_size=window)


@pytest.mark.parametrize("causal,window,heads_k", [(True, (-1, -1), 2), (False, (-1, -1), 2), (True, (4095, 0), 2),
                                                   (True, (128, 0), 8)])
def test_unfolded_calls_run_as_before(causal, window, heads_k):
    """The one decision (flash_attn_dash.launch): causal and full masks, wide bands and MHA do not fold, and run the
    plain kernels correctly with the fold enabled."""
    q, k, v, dout, out, lse = _inputs(1, 8192, 8192, 8, heads_k, 64, torch.bfloat16, causal, window_size=window)
    grads, launch = _bwd(dout, q, k, v, out, lse, causal, window, True, "auto")
    _wait(timeout=60)
    assert not launch.gqa_fold
    assert_tolerance_rule(q, k, v, dout, out, grads, causal, window_size=window)


def test_launcher_refuses_a_fold_without_gqa():
    """The launcher checks the decision: gqa_fold=True on an MHA call is refused by name before any launch."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    q, k, v, dout, out, lse = _inputs(1, 256, 256, 2, 2, 64, torch.bfloat16, True)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    launch = bwd_launch(True, 64, 256, 256, 1, 2, torch.cuda.get_device_properties(0).multi_processor_count, True)
    with pytest.raises(ValueError, match="gqa_fold needs num_heads != num_heads_k"):
        torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, None, 64 ** -0.5, True, True,
                                          launch.schedule_id, launch.grid, launch.claim_group, 0, None, -1, -1, 0.0,
                                          True)
    torch.cuda.synchronize()
    assert torch.isnan(dq).all()


def test_launcher_refuses_a_fold_without_a_window():
    """Folded kernels exist for sliding windows only: gqa_fold=True on a causal GQA call is refused by name."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    q, k, v, dout, out, lse = _inputs(1, 256, 256, 4, 2, 64, torch.bfloat16, True)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    launch = bwd_launch(True, 64, 256, 256, 1, 4, torch.cuda.get_device_properties(0).multi_processor_count, True,
                        heads_k=2)
    with pytest.raises(ValueError, match="gqa_fold runs on sliding windows only"):
        torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, None, 64 ** -0.5, True, True,
                                          launch.schedule_id, launch.grid, launch.claim_group, 0, None, -1, 0, 0.0,
                                          True)
    torch.cuda.synchronize()
    assert torch.isnan(dq).all()
