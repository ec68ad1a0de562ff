"""Sliding windows on the sm90 kernels (the causal kernels with a band): forward and backward against the fp32
reference (tests/grad_rule.py's rule), every order the kernels run on a window, the model = kernel dQ order trace,
bitwise determinism, rows that see no key, the public functions and the varlen path. GPU only."""
from __future__ import annotations

import re

import pytest
import torch

from grad_rule import assert_tolerance_rule
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims
from test_bwd_gpu import _blocks, _bwd, _inputs, _trace_buffer, _wait
from test_fwd_gpu import _check as _check_fwd

from flash_attn_dash import features, flash_attn_func, flash_attn_varlen_func
from flash_attn_dash.launch import model_mask

# tests/conftest.py skips them without an sm90 GPU and the kernels.
pytestmark = pytest.mark.gpu

HDIMS = gpu_head_dims()
DTYPES = gpu_dtypes()
# (causal, window_size): causal bands, two-sided bands, the diagonal alone, one-sided (left or right only)
WINDOWS = [(True, (128, 0)), (False, (64, 64)), (False, (0, 0)), (True, (300, -1)), (False, (-1, 100)),
           (False, (1, 200)), (True, (1000, 0))]
WINDOW_IDS = [f"{'causal' if c else 'full'}-{w[0]}_{w[1]}" for c, w in WINDOWS]
SHAPES = [(1, 1), (113, 203), (203, 113), (128, 128), (799, 3), (3, 799), (1024, 1024), (1000, 1500)]
SCHEDULES = ["ascending", "descending", "symmetric_shift"]


def _kernel(causal, window, sq, sk):
    return features.kernel_window(causal, window, sq, sk)


def _fwd(q, k, v, causal, window, sm_margin=0):
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    kc, kw = _kernel(causal, window, q.shape[1], k.shape[1])
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device=q.device)
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, q.shape[-1] ** -0.5, kc, sm_margin, *kw)
    return out, lse


def _bwd_window(dout, q, k, v, out, lse, causal, window, deterministic, schedule, sm_margin=0, trace=None):
    from flash_attn_dash.ops import bwd_into

    kc, kw = _kernel(causal, window, q.shape[1], k.shape[1])
    grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    launch = bwd_into(dout, q, k, v, out, lse, *grads, q.shape[-1] ** -0.5, kc, deterministic, schedule, sm_margin,
                      order_trace=trace, window=kw)
    return grads, launch


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("b,h,hk", [(1, 1, 1), (2, 6, 2)])
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_window_fwd_matches_reference(sq, sk, b, h, hk, causal, window, d, dtype):
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    out, lse = _fwd(q, k, v, causal, window)
    torch.cuda.synchronize()
    _check_fwd(q, k, v, out, lse, d ** -0.5, causal, window_size=window)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("schedule,deterministic", [(s, True) for s in SCHEDULES] + [("auto", False)])
@pytest.mark.parametrize("causal,window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("b,h,hk", [(1, 1, 1), (2, 6, 2)])
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_window_bwd_matches_reference(sq, sk, b, h, hk, causal, window, schedule, deterministic, d, dtype):
    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, dtype, causal, window_size=window)
    try:
        features.check_schedule_on_mask(schedule, causal, window, sq, sk)
    except ValueError as refusal:  # the window covers the full mask here, and the order is not one of the full mask's
        with pytest.raises(ValueError, match=re.escape(str(refusal))):
            _bwd_window(dout, q, k, v, out, lse, causal, window, deterministic, schedule)
        return
    grads, _ = _bwd_window(dout, q, k, v, out, lse, causal, window, deterministic, schedule)
    _wait()
    assert_tolerance_rule(q, k, v, dout, out, grads, causal, window_size=window)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("causal,window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("sq,sk,b,h,hk,margin", [(4224, 4224, 1, 2, 1, 0), (2048, 2048, 2, 8, 2, 18),
                                                 (1000, 3000, 1, 3, 3, 54), (8192, 8192, 1, 4, 4, 0)])
def test_window_trace_matches_model(sq, sk, b, h, hk, margin, causal, window, schedule, d):
    """The kernel's dQ arrival order per Q tile is the model's, for the order the launch runs (a band's fallback
    included), on the full H200 and on fewer SMs; the run finishes under the watchdog."""
    import numpy as np

    from flash_attn_dash.schedule import build_plan

    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, torch.bfloat16, causal, window_size=window)
    trace = _trace_buffer(b, h, sq, sk, d)
    _, launch = _bwd_window(dout, q, k, v, out, lse, causal, window, True, schedule, sm_margin=margin, trace=trace)
    _wait(timeout=60)
    kc, kw = _kernel(causal, window, sq, sk)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count - margin
    plan = build_plan(model_mask(kc, kw), sq, sk, *_blocks(d), b, h, num_sms, launch.schedule, heads_kv=hk,
                      claim_heads=launch.claim_group, window=kw, fold=launch.gqa_fold)
    plan.check()
    assert (plan.schedule_used, plan.num_ctas) == (launch.schedule, launch.grid)
    got = trace.cpu().numpy().astype(np.int32)
    expect = plan.trace_array()
    bad = np.argwhere(got != expect)
    assert bad.size == 0, f"{plan.description}: {len(bad)} trace entries differ, first {bad[0].tolist()}"


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,window", [(True, (128, 0)), (False, (64, 64))])
def test_window_deterministic_bits_repeat(causal, window, d):
    assert_backward_bits_repeat(_bwd_window, causal, window, d)


def assert_backward_bits_repeat(bwd, causal, window, d):
    """``bwd`` (``_bwd_window``'s signature) in deterministic ``auto`` gives the same gradient bits 21 times on a
    GQA shape (8 query heads, 2 K/V heads)."""
    q, k, v, dout, out, lse = _inputs(2, 3000, 3000, 8, 2, d, torch.bfloat16, causal, window_size=window)
    first, _ = bwd(dout, q, k, v, out, lse, causal, window, True, "auto")
    for _ in range(20):
        again, _ = bwd(dout, q, k, v, out, lse, causal, window, True, "auto")
        for a, b_ in zip(first, again):
            assert torch.equal(a, b_)
    _wait()


@pytest.mark.parametrize("d", HDIMS)
def test_window_public_functions_run_the_tested_kernels(d):
    """flash_attn_func with a window on CUDA gives the bits of the kernel calls checked above (forward and
    deterministic backward), and flash_attn_varlen_func gives each sequence the bits of its dense call (the window
    applied to each sequence, aligned bottom-right on its own lengths)."""
    torch.manual_seed(1)
    window = (96, 0)
    q, k, v = (torch.randn(2, 700, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out, lse = flash_attn_func(q, k, v, window_size=window, deterministic=True, return_lse=True)
    out_k, lse_k = _fwd(q.detach(), k.detach(), v.detach(), False, window)
    assert torch.equal(out, out_k) and torch.equal(lse, lse_k)
    dout = torch.randn_like(out)
    out.backward(dout)
    grads, launch = _bwd_window(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), False, window,
                                True, "auto")
    assert launch.schedule == "descending"
    for x, g in zip((q, k, v), grads):
        assert torch.equal(x.grad, g)
    lens = [300, 0, 457, 1, 200]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    qv, kv, vv = (torch.randn(sum(lens), 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out_v = flash_attn_varlen_func(qv, kv, vv, cu, cu, max(lens), max(lens), window_size=window, deterministic=True)
    for s_, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e > s_:
            dense = flash_attn_func(qv[s_:e][None], kv[s_:e][None], vv[s_:e][None], window_size=window,
                                    deterministic=True)
            assert torch.equal(out_v[s_:e], dense[0])
