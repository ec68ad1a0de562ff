"""Softcaps on the sm90 kernels (the full and causal kernels with the tanh compiled in): the forward's out and lse and
the backward's dq/dk/dv against the fp32 reference (tests/grad_rule.py's rule, with the softcap), every order each
mask's kernels instantiate in both modes, the dQ order = the plain kernels' order, bitwise repeats of the
deterministic backward, rows that see no key, saturated scores, the public functions (dense and varlen) and the
refusals of the combinations no kernel is built for. GPU only."""
from __future__ import annotations

import math

import pytest
import torch

from grad_rule import assert_tolerance_rule
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims
from test_bwd_gpu import _trace_buffer, _wait
from test_fwd_gpu import _check as _check_fwd

from flash_attn_dash import flash_attn_func, flash_attn_varlen_func, variants
from flash_attn_dash.reference import attention_ref

pytestmark = pytest.mark.gpu

HDIMS = gpu_head_dims()
DTYPES = gpu_dtypes()
SOFTCAPS = [5.0, 30.0, 50.0]
SHAPES = [(1, 1), (113, 203), (203, 113), (128, 128), (799, 3), (1024, 1024), (1000, 1500)]
MASKS = [False, True]
MASK_IDS = ["full", "causal"]
# Each mask's orders in deterministic mode (every one the softcap kernels instantiate) and the non-deterministic walk.
RUNS = [(causal, s, True) for causal in MASKS for s in variants.schedules_for("causal" if causal else "full")] + \
       [(causal, "auto", False) for causal in MASKS]
RUN_IDS = [f"{'causal' if c else 'full'}-{s}-{'det' if det else 'nondet'}" for c, s, det in RUNS]


def _problem(b, sq, sk, h, hk, d, dtype, seed=0, spread=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g) * spread
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    return q.to(dtype), k, v, dout


def _fwd(q, k, v, causal, softcap, window=None, sink=None):
    """The forward op into poisoned buffers (the kernels' mask: causal = (-1, 0), full = (-1, -1))."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device=q.device)
    window = window or ((-1, 0) if causal else (-1, -1))
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, q.shape[-1] ** -0.5, causal, 0, *window, sink, softcap)
    return out, lse


def _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule, softcap, trace=None, window=None):
    from flash_attn_dash.ops import bwd_into

    grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    window = window or ((-1, 0) if causal else (-1, -1))
    launch = bwd_into(dout, q, k, v, out, lse, *grads, q.shape[-1] ** -0.5, causal, deterministic, schedule, 0,
                      order_trace=trace, window=window, softcap=softcap)
    return grads, launch


def _stored(q, k, v, causal, softcap):
    """The fp32 reference's output in the input dtype and its lse: what a forward hands the backward."""
    with torch.no_grad():
        out32, lse = attention_ref(q.float(), k.float(), v.float(), softmax_scale=q.shape[-1] ** -0.5, causal=causal,
                                   softcap=softcap)
    return out32.to(q.dtype).contiguous(), lse.float().contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("causal", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("b,h,hk", [(1, 1, 1), (2, 6, 2)])
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_softcap_fwd_matches_reference(sq, sk, b, h, hk, causal, softcap, d, dtype):
    q, k, v, _ = _problem(b, sq, sk, h, hk, d, dtype)
    out, lse = _fwd(q, k, v, causal, softcap)
    torch.cuda.synchronize()
    _check_fwd(q, k, v, out, lse, d ** -0.5, causal, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("causal,schedule,deterministic", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_softcap_bwd_matches_reference(sq, sk, causal, schedule, deterministic, softcap, d, dtype):
    q, k, v, dout = _problem(2, sq, sk, 6, 2, d, dtype, seed=1)
    out, lse = _stored(q, k, v, causal, softcap)
    grads, _ = _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule, softcap)
    _wait()
    assert_tolerance_rule(q, k, v, dout, out, grads, causal, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", MASKS, ids=MASK_IDS)
def test_saturated_scores(causal, d, dtype):
    """Scores far beyond the cap (q scaled by 8, softcap 5): most of tanh is saturated, 1 - tanh^2 near 0."""
    q, k, v, dout = _problem(2, 700, 900, 4, 2, d, dtype, seed=2, spread=8.0)
    out, lse = _fwd(q, k, v, causal, 5.0)
    torch.cuda.synchronize()
    _check_fwd(q, k, v, out, lse, d ** -0.5, causal, softcap=5.0)
    grads, _ = _bwd(dout, q, k, v, out, lse, causal, True, "auto", 5.0)
    _wait()
    assert_tolerance_rule(q, k, v, dout, out, grads, causal, softcap=5.0)


@pytest.mark.parametrize("d", HDIMS)
def test_rows_without_keys(d):
    """Causal with seqlen_q > seqlen_k: the first rows see no key: out = 0 and lse = -inf, their dq = 0 (no NaN from
    the masked 1 - tanh^2), in both modes."""
    q, k, v, dout = _problem(1, 300, 40, 4, 4, d, torch.bfloat16, seed=3)
    out, lse = _fwd(q, k, v, True, 30.0)
    torch.cuda.synchronize()
    empty = 300 - 40
    assert torch.equal(out[:, :empty], torch.zeros_like(out[:, :empty]))
    assert (lse[:, :, :empty] == -math.inf).all() and not torch.isinf(lse[:, :, empty:]).any()
    for det in (True, False):
        grads, _ = _bwd(dout, q, k, v, out, lse, True, det, "auto", 30.0)
        _wait()
        assert torch.equal(grads[0][:, :empty], torch.zeros_like(grads[0][:, :empty]))
        assert_tolerance_rule(q, k, v, dout, out, grads, True, softcap=30.0)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,schedule,deterministic", [r for r in RUNS if r[2]],
                         ids=[i for r, i in zip(RUNS, RUN_IDS) if r[2]])
def test_softcap_runs_the_plain_kernels_order(causal, schedule, deterministic, d):
    """The softcap kernels instantiate the plain kernels' policies: the same launch and dQ arrival order per Q tile
    (tests/test_bwd_gpu.py checks the plain order against the model)."""
    b, sq, sk, h, hk = 2, 2048, 2048, 4, 2
    q, k, v, dout = _problem(b, sq, sk, h, hk, d, torch.bfloat16, seed=4)
    out, lse = _stored(q, k, v, causal, 30.0)
    traces, launches = [], []
    for softcap in (0.0, 30.0):
        trace = _trace_buffer(b, h, sq, sk, d)
        _, launch = _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule, softcap, trace=trace)
        _wait(timeout=60)
        traces.append(trace)
        launches.append(launch)
    assert launches[0] == launches[1]
    assert torch.equal(traces[0], traces[1])


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", MASKS, ids=MASK_IDS)
def test_deterministic_softcap_bits_repeat(causal, d):
    q, k, v, dout = _problem(2, 3000, 3000, 8, 2, d, torch.bfloat16, seed=5)
    out, lse = _fwd(q, k, v, causal, 30.0)
    first, _ = _bwd(dout, q, k, v, out, lse, causal, True, "auto", 30.0)
    for _ in range(20):
        again_out, again_lse = _fwd(q, k, v, causal, 30.0)
        assert torch.equal(again_out, out) and torch.equal(again_lse, lse)
        again, _ = _bwd(dout, q, k, v, out, lse, causal, True, "auto", 30.0)
        for a, b_ in zip(first, again):
            assert torch.equal(a, b_)
    _wait()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("causal", MASKS, ids=MASK_IDS)
def test_public_functions_run_the_tested_kernels(causal, deterministic, d, dtype):
    """flash_attn_func with a softcap gives the bits of the kernel calls above (forward; deterministic backward) and
    gradients within the rule; flash_attn_varlen_func gives each sequence the bits of its dense call."""
    q, k, v, dout = _problem(2, 700, 650, 4, 2, d, dtype, seed=6)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = flash_attn_func(*leaves, causal=causal, softcap=50.0, deterministic=deterministic, return_lse=True)
    out_k, lse_k = _fwd(q, k, v, causal, 50.0)
    assert torch.equal(out, out_k) and torch.equal(lse, lse_k)
    grads = torch.autograd.grad(out, leaves, dout)
    assert_tolerance_rule(q, k, v, dout, out.detach(), grads, causal, softcap=50.0)
    if deterministic:
        grads_k, launch = _bwd(dout, q, k, v, out.detach(), lse.detach(), causal, True, "auto", 50.0)
        assert all(torch.equal(a, b_) for a, b_ in zip(grads, grads_k)), launch
    lens = [300, 0, 457, 1, 200]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    qv, kv, vv = (torch.randn(sum(lens), 4, d, device="cuda", dtype=dtype) for _ in range(3))
    out_v = flash_attn_varlen_func(qv, kv, vv, cu, cu, max(lens), max(lens), causal=causal, softcap=50.0,
                                   deterministic=deterministic)
    for s_, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e > s_:
            dense = flash_attn_func(qv[s_:e][None], kv[s_:e][None], vv[s_:e][None], causal=causal, softcap=50.0,
                                    deterministic=deterministic)
            assert torch.equal(out_v[s_:e], dense[0])


def test_unbuilt_combinations_are_refused_before_launch():
    """The API names a softcap with a sliding window or a sink (NotImplementedError); the ops' launchers refuse the
    same calls (ValueError) and a negative or non-finite softcap, before anything runs."""
    d = HDIMS[0]
    q, k, v, dout = _problem(1, 256, 256, 2, 2, d, torch.bfloat16, seed=7)
    out, lse = _stored(q, k, v, True, 30.0)
    if "window" not in variants.SOFTCAP_WITH:
        with pytest.raises(NotImplementedError, match=r"softcap=30.0 with a sliding window \(no softcap kernel"):
            flash_attn_func(q, k, v, window_size=(64, 0), softcap=30.0)
        with pytest.raises(ValueError, match="no softcap kernel is built for a sliding window"):
            _fwd(q, k, v, True, 30.0, window=(64, 0))
        with pytest.raises(ValueError, match="no softcap kernel is built for a sliding window"):
            _bwd(dout, q, k, v, out, lse, True, True, "descending", 30.0, window=(64, 0))
    if "sink" not in variants.SOFTCAP_WITH:
        with pytest.raises(NotImplementedError, match=r"softcap=30.0 with a learnable_sink \(no softcap kernel"):
            flash_attn_func(q, k, v, softcap=30.0, learnable_sink=torch.zeros(2, device="cuda"))
        with pytest.raises(ValueError, match="no softcap kernel is built for a learnable_sink"):
            _fwd(q, k, v, False, 30.0, sink=torch.zeros(2, device="cuda"))
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
            _fwd(q, k, v, False, bad)
        with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
            _bwd(dout, q, k, v, out, lse, True, True, "descending", bad)
    torch.cuda.synchronize()


@pytest.mark.skipif("window" not in variants.SOFTCAP_WITH, reason="no softcap kernel for sliding windows in the table")
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("window", [(128, 0), (64, 64)])
@pytest.mark.parametrize("deterministic", [True, False])
def test_softcap_with_a_sliding_window(window, deterministic, d):
    """Where variants.SOFTCAP_WITH builds them: softcap 50 on a causal band and a two-sided window (Gemma 2's local
    layers), forward and backward against the reference (GQA: the causal band runs the folded kernels)."""
    q, k, v, dout = _problem(2, 700, 900, 4, 2, d, torch.bfloat16, seed=8)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = flash_attn_func(*leaves, window_size=window, softcap=50.0, deterministic=deterministic, return_lse=True)
    ref_out, _ = attention_ref(q.float(), k.float(), v.float(), window_size=window, softcap=50.0)
    pt_out, _ = attention_ref(q, k, v, upcast=False, window_size=window, softcap=50.0)
    atol = 2 * (ref_out + 0.3 - 0.3 - ref_out).abs().max().item()
    err, err_pt = (out.float() - ref_out).abs().max().item(), (pt_out.float() - ref_out).abs().max().item()
    assert err <= 2 * err_pt + atol, f"out: err {err:.3e} > 2 * pt {err_pt:.3e} + atol {atol:.3e}"
    grads = torch.autograd.grad(out, leaves, dout)
    assert_tolerance_rule(q, k, v, dout, out.detach(), grads, False, window_size=window, softcap=50.0)
