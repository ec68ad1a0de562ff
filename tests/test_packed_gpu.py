"""Packed entry points on the GPU: the kernels read the strided views and write the one packed gradient buffer,
giving the same bits as flash_attn_func on contiguous copies (deterministic backward: same kernel, same order)."""
import pytest
import torch

from flash_attn_dash import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

pytestmark = pytest.mark.gpu


def _dout(shape, seed):
    return torch.randn(shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda",
                       dtype=torch.bfloat16)


def _dense(q, k, v, dout, **kw):
    leaves = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, deterministic=True, **kw)
    return out, torch.autograd.grad(out, leaves, dout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,s,h,d", [(2, 1000, 4, 128), (1, 777, 3, 64)])
def test_qkvpacked_bits_equal_dense(b, s, h, d, causal):
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=causal, deterministic=True)
    dout = _dout(out.shape, 1)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    ref, grads = _dense(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dout, causal=causal)
    assert dqkv.shape == qkv.shape
    assert torch.equal(out, ref)
    assert torch.equal(dqkv, torch.stack(grads, dim=2))


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_gqa_layout_bits_equal_dense(causal):
    hq, hk, d = 8, 2, 128
    qkv = torch.randn(2, 900, hq + 2 * hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=causal, deterministic=True, num_heads_q=hq)
    dout = _dout(out.shape, 2)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    ref, grads = _dense(qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:], dout, causal=causal)
    assert torch.equal(out, ref)
    assert torch.equal(dqkv, torch.cat(grads, dim=2))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [4, 1])
def test_kvpacked_bits_equal_dense(hk, causal):
    q = torch.randn(2, 640, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(2, 1100, 2, hk, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_kvpacked_func(q, kv, causal=causal, deterministic=True)
    dout = _dout(out.shape, 3)
    dq, dkv = torch.autograd.grad(out, (q, kv), dout)
    ref, (rq, rk, rv) = _dense(q, kv[:, :, 0], kv[:, :, 1], dout, causal=causal)
    assert torch.equal(out, ref)
    assert torch.equal(dq, rq)
    assert torch.equal(dkv, torch.stack((rk, rv), dim=2))


def test_deterministic_none_under_torch_switch_is_bitwise_repeatable():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        qkv = torch.randn(2, 2048, 3, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = _dout((2, 2048, 8, 128), 4)
        first = None
        for _ in range(10):
            (g,) = torch.autograd.grad(flash_attn_qkvpacked_func(qkv, causal=True), qkv, dout)
            first = g if first is None else first
            assert torch.equal(g, first)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_packed_bits_equal_varlen(causal):
    from flash_attn_dash import (flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                 flash_attn_varlen_qkvpacked_func)
    from varlen_packs import cu_seqlens

    lens = [700, 0, 1, 1300, 64]
    cu, total, longest = cu_seqlens(lens, "cuda"), sum(lens), max(lens)
    qkv = torch.randn(total, 3, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = _dout((total, 4, 128), 5)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, longest, causal=causal, deterministic=True)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    leaves = [qkv.detach()[:, i].contiguous().requires_grad_() for i in range(3)]
    ref = flash_attn_varlen_func(*leaves, cu, cu, longest, longest, causal=causal, deterministic=True)
    grads = torch.autograd.grad(ref, leaves, dout)
    assert torch.equal(out, ref)
    assert torch.equal(dqkv, torch.stack(grads, dim=1))
    q = qkv.detach()[:, 0].clone().requires_grad_()
    kv = qkv.detach()[:, 1:].clone().requires_grad_()
    out_kv = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, longest, longest, causal=causal, deterministic=True)
    dq, dkv = torch.autograd.grad(out_kv, (q, kv), dout)
    assert torch.equal(out_kv, ref)
    assert torch.equal(dq, grads[0]) and torch.equal(dkv, torch.stack(grads[1:], dim=1))
