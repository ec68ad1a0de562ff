"""Learnable sinks (gpt-oss) on the sm90 kernels: the forward's sink finalize (out and lse against the fp32 reference,
rows that see no key give out = 0 and lse = sink), the backward's dq/dk/dv (tests/grad_rule.py's rule, with the sink)
and dsink (the sink-gradient kernel) against the reference, alone and with sliding windows, bitwise repeats of the
deterministic backward, the binding's refusals of a bad sink/dsink pair. GPU only."""
from __future__ import annotations

import math

import pytest
import torch

from grad_rule import assert_tolerance_rule
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims

from flash_attn_dash import flash_attn_func
from flash_attn_dash.reference import attention_ref

pytestmark = pytest.mark.gpu


HDIMS = gpu_head_dims()
DTYPES = gpu_dtypes()
SHAPES = [(1, 1), (113, 203), (203, 113), (128, 128), (799, 3), (1024, 1024)]
MASKS = [(False, (-1, -1)), (True, (-1, -1)), (True, (127, 0)), (False, (64, 64))]
MASK_IDS = ["full", "causal", "causal-window127", "window64_64"]


def _problem(b, sq, sk, h, hk, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    sink = torch.randn(h, device="cuda", dtype=torch.float32, generator=g) * 2
    return q, k, v, dout, sink


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal,window", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_sink_matches_reference(sq, sk, deterministic, causal, window, d, dtype):
    q, k, v, dout, sink = _problem(2, sq, sk, 6, 2, d, dtype)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)] + [sink.clone().requires_grad_(True)]
    out, lse = flash_attn_func(*leaves[:3], causal=causal, window_size=window, learnable_sink=leaves[3],
                               deterministic=deterministic, return_lse=True)
    ref_args = dict(causal=causal, window_size=window, learnable_sink=sink)
    out_ref, lse_ref = attention_ref(q.float(), k.float(), v.float(), **ref_args)
    out_pt, lse_pt = attention_ref(q, k, v, upcast=False, **ref_args)
    atol = 2 * (out_ref + 0.3 - 0.3 - out_ref).abs().max().item()
    err, err_pt = (out.float() - out_ref).abs().max().item(), (out_pt.float() - out_ref).abs().max().item()
    assert err <= 2 * err_pt + atol, f"out: err {err:.3e} > 2 * pt {err_pt:.3e} + atol {atol:.3e}"
    lerr, lerr_pt = (lse - lse_ref).abs().max().item(), (lse_pt - lse_ref).abs().max().item()
    assert lerr <= 2 * lerr_pt + 1e-4, f"lse: err {lerr:.3e} > 2 * pt {lerr_pt:.3e} + 1e-4"
    grads = torch.autograd.grad(out, leaves, dout)
    assert_tolerance_rule(q, k, v, dout, out.detach(), grads[:3], causal, window_size=window, learnable_sink=sink)
    s32 = sink.clone().requires_grad_(True)
    o32, _ = attention_ref(q.float(), k.float(), v.float(), causal=causal, window_size=window, learnable_sink=s32)
    (dsink_ref,) = torch.autograd.grad(o32, s32, dout.float())
    sbf = sink.clone().requires_grad_(True)
    opt, _ = attention_ref(q, k, v, upcast=False, causal=causal, window_size=window, learnable_sink=sbf)
    (dsink_pt,) = torch.autograd.grad(opt, sbf, dout)
    serr = (grads[3].float() - dsink_ref).abs().max().item()
    serr_pt = (dsink_pt.float() - dsink_ref).abs().max().item()
    assert serr <= 2 * serr_pt + 1e-3 * max(1.0, dsink_ref.abs().max().item()), (serr, serr_pt)


@pytest.mark.parametrize("d", HDIMS)
def test_rows_without_keys_see_only_the_sink(d):
    """Causal with seqlen_q > seqlen_k: the first rows see no key: out = 0 and lse = sink[h] (no key at all: the
    same for every row)."""
    for sk in (40, 0):
        q, k, v, _, sink = _problem(1, 300, max(sk, 1), 4, 4, d, torch.bfloat16)
        k, v = k[:, :sk], v[:, :sk]
        out, lse = flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
        empty = 300 - sk
        assert torch.equal(out[:, :empty], torch.zeros_like(out[:, :empty]))
        assert torch.equal(lse[:, :, :empty], sink[None, :, None].expand(1, 4, empty))
        assert not math.isinf(lse.min().item())


@pytest.mark.parametrize("d", HDIMS)
def test_deterministic_sink_bits_repeat(d):
    q, k, v, dout, sink = _problem(2, 2048, 2048, 8, 2, d, torch.bfloat16)
    runs = []
    for _ in range(10):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)] + [sink.clone().requires_grad_(True)]
        out = flash_attn_func(*leaves[:3], causal=True, window_size=(127, 0), learnable_sink=leaves[3],
                              deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@pytest.mark.parametrize("sink_arg,dsink_arg,match", [
    ("fp32", None, "sink and dsink must be given together"),
    (None, "fp32", "sink and dsink must be given together"),
    ("fp32", "short", r"dsink must be a contiguous fp32 tensor of shape \(heads,\) = \(4,\)"),
    ("bf16", "fp32", r"sink must be a contiguous fp32 tensor of shape \(heads,\) = \(4,\)"),
])
def test_the_binding_refuses_a_bad_sink_gradient_before_any_launch(sink_arg, dsink_arg, match):
    """bwd_out's sink/dsink pair (hopper/bwd/sink_grad.hpp computes dsink): both or neither, (heads,) fp32 on q's
    device; a refusal leaves the NaN-poisoned gradients untouched."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)
    from flash_attn_dash.launch import bwd_launch

    q, k, v, dout, _ = _problem(1, 256, 256, 4, 2, 64, torch.bfloat16)
    out, lse = torch.zeros_like(q), torch.zeros(1, 4, 256, device="cuda")
    tensors = {None: None, "fp32": torch.zeros(4, device="cuda"), "short": torch.zeros(3, device="cuda"),
               "bf16": torch.zeros(4, device="cuda", dtype=torch.bfloat16)}
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    launch = bwd_launch(True, 64, 256, 256, 1, 4, torch.cuda.get_device_properties(0).multi_processor_count, True,
                        heads_k=2)
    with pytest.raises(ValueError, match=match):
        torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, None, 64 ** -0.5, True, True,
                                          launch.schedule_id, launch.grid, launch.claim_group, 0, None, -1, 0, 0.0,
                                          launch.gqa_fold, tensors[sink_arg], tensors[dsink_arg])
    torch.cuda.synchronize()
    assert torch.isnan(dq).all() and torch.isnan(dk).all()
