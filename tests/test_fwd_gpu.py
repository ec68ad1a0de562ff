"""sm90 forward kernel against the fp32 reference (FlashAttention tolerance rule), GPU only.

Rule (docs dash.md §7): max|x - ref| <= 2 * max|x_pt - ref| + atol, ref computed in fp32, x_pt the same
math in the input dtype, atol = 2 * max|ref + 0.3 - 0.3 - ref|. LSE: max|lse - ref| <= 2 * max|lse_pt -
ref| + 1e-4 over rows with a visible key; rows without one must be exactly -inf in both. Head dims include the
pairs with a V head dim of their own (MLA's (192, 128), where built): v and out then have head_dim_v(d) columns.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims, head_dim_v


pytestmark = pytest.mark.gpu  # tests/conftest.py skips it without an sm90 GPU and the kernels

DTYPES = gpu_dtypes()
HDIMS = gpu_head_dims(v_pairs=True)
SMALL_SHAPES = [(1, 1), (113, 203), (203, 113), (128, 128), (799, 3), (1024, 1024)]
BIG_SHAPES = [(4224, 4224), (8192, 8192)]
# (batch, heads, heads_k): MHA, GQA 6/2, MQA 6/1
HEAD_CONFIGS = [(1, 1, 1), (3, 6, 6), (3, 6, 2), (1, 6, 1)]


def _run_fwd(q, k, v, softmax_scale, causal, sm_margin=0, poison=True):
    """Low-level forward into preallocated, poisoned out / lse buffers."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    b, sq, h, d = q.shape
    fill = float("nan") if poison else 0.0
    out = torch.full((*q.shape[:-1], v.shape[-1]), fill, dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, sq), fill, dtype=torch.float32, device=q.device)
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, softmax_scale, causal, sm_margin)
    return out, lse


def _check(q, k, v, out, lse, softmax_scale, causal, window_size=(-1, -1), softcap=0.0):
    from flash_attn_dash.reference import attention_ref

    ref = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap)
    out_ref, lse_ref = attention_ref(q, k, v, upcast=True, **ref)
    out_pt, lse_pt = attention_ref(q, k, v, upcast=False, **ref)
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    assert lse.shape == lse_ref.shape and lse.dtype == torch.float32
    assert not torch.isnan(out).any(), "output rows left unwritten (poison) or NaN"
    assert not torch.isnan(lse).any(), "lse rows left unwritten (poison) or NaN"

    out_f, out_pt_f = out.float(), out_pt.float()
    atol = 2 * (out_ref + 0.3 - 0.3 - out_ref).abs().max().item()
    err = (out_f - out_ref).abs().max().item()
    err_pt = (out_pt_f - out_ref).abs().max().item()
    assert err <= 2 * err_pt + atol, f"out: err {err:.3e} > 2 * pt {err_pt:.3e} + atol {atol:.3e}"

    inf_ref = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse), inf_ref), "rows with no visible key must (only) give lse = -inf"
    if inf_ref.any():
        assert (lse[inf_ref] == -math.inf).all()
        assert (out[inf_ref.transpose(1, 2)] == 0).all(), "rows with no visible key must give out = 0"
    fin = ~inf_ref
    if fin.any():
        lerr = (lse[fin] - lse_ref[fin]).abs().max().item()
        lerr_pt = (lse_pt[fin] - lse_ref[fin]).abs().max().item()
        assert lerr <= 2 * lerr_pt + 1e-4, f"lse: err {lerr:.3e} > 2 * pt {lerr_pt:.3e} + 1e-4"


def _inputs(b, sq, sk, h, hk, d, dtype):
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, head_dim_v(d), device="cuda", dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,hk", HEAD_CONFIGS)
@pytest.mark.parametrize("sq,sk", SMALL_SHAPES)
def test_fwd_small(sq, sk, b, h, hk, causal, d, dtype):
    q, k, v = _inputs(b, sq, sk, h, hk, d, dtype)
    scale = d**-0.5
    out, lse = _run_fwd(q, k, v, scale, causal)
    _check(q, k, v, out, lse, scale, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", BIG_SHAPES)
def test_fwd_big(sq, sk, causal, d, dtype):
    q, k, v = _inputs(1, sq, sk, 1, 1, d, dtype)
    scale = d**-0.5
    out, lse = _run_fwd(q, k, v, scale, causal)
    _check(q, k, v, out, lse, scale, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_fwd_softmax_scale_and_sm_margin(causal, d, dtype):
    q, k, v = _inputs(2, 300, 517, 4, 2, d, dtype)
    out, lse = _run_fwd(q, k, v, 0.37, causal, sm_margin=40)
    _check(q, k, v, out, lse, 0.37, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1024, 1024), (799, 3), (203, 113), (1, 1)])
def test_fwd_many_tiles_per_cta(sq, sk, causal, d, dtype):
    """A 3-CTA grid: each CTA runs many tiles back to back, so every tile's O epilogue overlaps the next
    tile's first step (and, causal (799, 3), tiles without a visible key sit between tiles with keys)."""
    q, k, v = _inputs(3, sq, sk, 6, 2, d, dtype)
    margin = torch.cuda.get_device_properties(q.device).multi_processor_count - 3
    scale = d**-0.5
    out, lse = _run_fwd(q, k, v, scale, causal, sm_margin=margin)
    _check(q, k, v, out, lse, scale, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq", [1, 257, 1000])
def test_fwd_packed_qkv_strides(sq, causal, d, dtype):
    """q, k, v as slices of a packed (b, s, 3, h, d) tensor: row stride 3*h*d, batch stride s*3*h*d (v: its first
    head_dim_v columns)."""
    b, h = 2, 3
    qkv = torch.randn(b, sq, 3, h, d, device="cuda", dtype=dtype)
    q, k, v = qkv.unbind(dim=2)
    v = v[..., :head_dim_v(d)]
    assert not q.is_contiguous()
    scale = d**-0.5
    out, lse = _run_fwd(q, k, v, scale, causal)
    _check(q, k, v, out, lse, scale, causal)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_fwd_packed_gqa_strides(causal, d):
    """GQA k/v as head-slices of one (b, s, h + 2*hk, d) buffer (head stride d, row stride (h+2hk)*d)."""
    b, s, h, hk, dtype = 2, 333, 6, 2, torch.bfloat16
    buf = torch.randn(b, s, h + 2 * hk, d, device="cuda", dtype=dtype)
    q, k, v = buf[:, :, :h], buf[:, :, h : h + hk], buf[:, :, h + hk :, :head_dim_v(d)]
    scale = d**-0.5
    out, lse = _run_fwd(q, k, v, scale, causal)
    _check(q, k, v, out, lse, scale, causal)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_fwd_bitwise_repeatable(causal, d):
    q, k, v = _inputs(2, 1537, 1537, 4, 2, d, torch.bfloat16)
    scale = d**-0.5
    out0, lse0 = _run_fwd(q, k, v, scale, causal)
    for _ in range(100):
        out, lse = _run_fwd(q, k, v, scale, causal)
        assert torch.equal(out, out0) and torch.equal(lse, lse0)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_fwd_bits_do_not_depend_on_the_grid(causal, d):
    """Each output row is computed by one CTA in a fixed order: the number of CTAs (sm_margin) cannot change a bit."""
    q, k, v = _inputs(2, 1537, 1537, 4, 2, d, torch.bfloat16)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    out0, lse0 = _run_fwd(q, k, v, d**-0.5, causal)
    for margin in (1, 17, sms - 3, sms - 1):
        out, lse = _run_fwd(q, k, v, d**-0.5, causal, sm_margin=margin)
        assert torch.equal(out, out0) and torch.equal(lse, lse0), f"sm_margin {margin} changed bits"
