"""Packed entry points and deterministic=None on the reference path (CPU): same answers as flash_attn_func on
the views, one gradient buffer per packed argument, clear errors, custom ops that trace."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attn_dash.ops as ops
import flash_attn_dash.varlen_per_sequence as per_sequence
from flash_attn_dash import (backward_schedule_used, flash_attn_func, flash_attn_kvpacked_func,
                             flash_attn_qkvpacked_func, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                             flash_attn_varlen_qkvpacked_func)
from varlen_packs import cu_seqlens


def _grads(out, leaves, seed=0):
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, leaves, dout)


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_matches_flash_attn_func_on_its_views(causal):
    qkv = torch.randn(2, 13, 3, 4, 16, dtype=torch.float64, requires_grad=True)
    out, lse = flash_attn_qkvpacked_func(qkv, causal=causal, return_lse=True)
    (dqkv,) = _grads(out, (qkv,))
    leaves = [qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3)]
    ref, ref_lse = flash_attn_func(*leaves, causal=causal, return_lse=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    torch.testing.assert_close(dqkv, torch.stack(_grads(ref, leaves), dim=2))


def test_qkvpacked_gqa_layout_with_num_heads_q():
    hq, hk = 6, 2
    qkv = torch.randn(1, 9, hq + 2 * hk, 8, dtype=torch.float64, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=hq, softmax_scale=0.3)
    assert out.shape == (1, 9, hq, 8)
    (dqkv,) = _grads(out, (qkv,))
    x = qkv.detach()
    leaves = [t.clone().requires_grad_() for t in (x[:, :, :hq], x[:, :, hq:hq + hk], x[:, :, hq + hk:])]
    ref = flash_attn_func(*leaves, causal=True, softmax_scale=0.3)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dqkv, torch.cat(_grads(ref, leaves), dim=2))


@pytest.mark.parametrize("causal", [False, True])
def test_kvpacked_matches_flash_attn_func(causal):
    q = torch.randn(2, 7, 4, 16, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 11, 2, 2, 16, dtype=torch.float64, requires_grad=True)
    out = flash_attn_kvpacked_func(q, kv, causal=causal)
    dq, dkv = _grads(out, (q, kv))
    leaves = [q.detach().clone().requires_grad_()] + [kv.detach()[:, :, i].clone().requires_grad_() for i in range(2)]
    ref = flash_attn_func(*leaves, causal=causal)
    torch.testing.assert_close(out, ref)
    rq, rk, rv = _grads(ref, leaves)
    torch.testing.assert_close(dq, rq)
    torch.testing.assert_close(dkv, torch.stack((rk, rv), dim=2))


LENS = [5, 0, 9, 1, 7]  # an empty and a one-token document


@pytest.mark.parametrize("num_heads_q", [None, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_qkvpacked_matches_flash_attn_varlen_func(causal, num_heads_q):
    total, cu = sum(LENS), cu_seqlens(LENS)
    shape = (total, 3, 4, 16) if num_heads_q is None else (total, num_heads_q + 2 * 2, 16)
    qkv = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    out, lse = flash_attn_varlen_qkvpacked_func(qkv, cu, max(LENS), causal=causal, num_heads_q=num_heads_q,
                                                return_lse=True)
    (dqkv,) = _grads(out, (qkv,))
    x = qkv.detach()
    views = [x[:, i] for i in range(3)] if num_heads_q is None else [x[:, :4], x[:, 4:6], x[:, 6:]]
    leaves = [t.clone().requires_grad_() for t in views]
    ref, ref_lse = flash_attn_varlen_func(*leaves, cu, cu, max(LENS), max(LENS), causal=causal, return_lse=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    grads = _grads(ref, leaves)
    torch.testing.assert_close(dqkv, torch.stack(grads, 1) if num_heads_q is None else torch.cat(grads, 1))


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_kvpacked_matches_flash_attn_varlen_func(causal):
    lens_k = [3, 4, 0, 8, 2]
    q = torch.randn(sum(LENS), 4, 16, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(sum(lens_k), 2, 1, 16, dtype=torch.float64, requires_grad=True)
    args = (cu_seqlens(LENS), cu_seqlens(lens_k), max(LENS), max(lens_k))
    out = flash_attn_varlen_kvpacked_func(q, kv, *args, causal=causal, softmax_scale=0.2)
    dq, dkv = _grads(out, (q, kv))
    leaves = [q.detach().clone().requires_grad_()] + [kv.detach()[:, i].clone().requires_grad_() for i in range(2)]
    ref = flash_attn_varlen_func(*leaves, *args, causal=causal, softmax_scale=0.2)
    torch.testing.assert_close(out, ref)
    rq, rk, rv = _grads(ref, leaves)
    torch.testing.assert_close(dq, rq)
    torch.testing.assert_close(dkv, torch.stack((rk, rv), dim=1))
    assert dkv[cu_seqlens(lens_k)[-1]:].abs().sum() == 0


def test_varlen_packed_backward_writes_into_one_buffer(monkeypatch):
    """The per-sequence backward receives views of the packed gradient buffer, not buffers of its own."""
    seen = []
    real = per_sequence.backward_into

    def spy(dout, q, k, v, out, lse, dq, dk, dv, *rest, **features):
        seen.append((dq._base, dk._base, dv._base))
        return real(dout, q, k, v, out, lse, dq, dk, dv, *rest, **features)

    monkeypatch.setattr(per_sequence, "backward_into", spy)
    qkv = torch.randn(sum(LENS), 3, 2, 16, requires_grad=True)
    flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens(LENS), max(LENS)).sum().backward()
    (bases,) = seen
    assert bases[0] is not None and bases[0] is bases[1] is bases[2] and bases[0].shape == qkv.shape


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 2, 2, 8)), ValueError, r"qkv must be \(batch, seqlen, 3"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 6, 8)), ValueError, r"qkv must be \(batch, seqlen, 3"),
        (lambda: flash_attn_qkvpacked_func([1]), TypeError, "qkv must be a torch.Tensor"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 6, 8), num_heads_q=3), ValueError,
         r"num_heads_q \(3\) must leave qkv.shape\[2\] \(6\)"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 7, 8), num_heads_q=3), ValueError, "num_heads_q"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 6, 8), num_heads_q=2.0), TypeError,
         "num_heads_q must be an int"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 3, 2, 8), num_heads_q=2), ValueError,
         "with num_heads_q, qkv must be"),
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 4, 3, 2, 8), deterministic="yes"), TypeError,
         "deterministic must be a bool"),
        (lambda: flash_attn_kvpacked_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)), ValueError,
         r"kv must be \(batch, seqlen_k, 2, heads_k, head_dim\)"),
        (lambda: flash_attn_kvpacked_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 2, 8, dtype=torch.float64)),
         TypeError, r"kv\[:, :, 0\].dtype must equal q.dtype"),
        (lambda: flash_attn_kvpacked_func(torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 2, 8)), ValueError,
         r"q heads \(3\) must be a multiple of kv\[:, :, 0\]/kv\[:, :, 1\] heads \(2\)"),
        (lambda: flash_attn_kvpacked_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 2, 8), schedule="fast"),
         ValueError, "schedule"),
        (lambda: flash_attn_varlen_qkvpacked_func(torch.randn(4, 2, 2, 8), cu_seqlens([4]), 4), ValueError,
         r"qkv must be \(total, 3, heads, head_dim\)"),
        (lambda: flash_attn_varlen_qkvpacked_func(torch.randn(4, 3, 2, 8), cu_seqlens([3]), 4), ValueError,
         r"cu_seqlens_q\[-1\] must equal"),
        (lambda: flash_attn_varlen_qkvpacked_func(torch.randn(4, 3, 2, 8), cu_seqlens([4]).long(), 4), TypeError,
         "cu_seqlens_q.dtype must be torch.int32"),
        (lambda: flash_attn_varlen_kvpacked_func(torch.randn(4, 2, 8), torch.randn(4, 2, 2, 8, dtype=torch.float64),
                                                 cu_seqlens([4]), cu_seqlens([4]), 4, 4), TypeError,
         r"kv\[:, 0\].dtype must equal q.dtype"),
        (lambda: flash_attn_varlen_kvpacked_func(torch.randn(4, 2, 8), torch.randn(1, 4, 2, 2, 8),
                                                 cu_seqlens([4]), cu_seqlens([4]), 4, 4), ValueError,
         r"kv must be \(total_k, 2, heads_k, head_dim\)"),
    ],
)
def test_packed_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_packed_fake_shapes_and_opcheck():
    with FakeTensorMode():
        qkv = torch.empty(2, 5, 3, 2, 16)
        out, lse = torch.empty(2, 5, 2, 16), torch.empty(2, 2, 5)
        dqkv, dsink = torch.ops.flash_attn_dash.bwd_qkvpacked(out, qkv, out, lse, None, 0.25, True, True, "auto", 0)
        assert dqkv.shape == qkv.shape and dsink.shape == (0,)
        q, kv = torch.empty(2, 5, 2, 16), torch.empty(2, 3, 2, 1, 16)
        dq, dkv, dsink = torch.ops.flash_attn_dash.bwd_kvpacked(out, q, kv, out, lse, 0.25, True, True, "auto", 0)
        assert dq.shape == q.shape and dkv.shape == kv.shape and dsink.shape == (0,)
    qkv = torch.randn(1, 6, 4, 16)
    q, k, v = qkv[:, :, :2], qkv[:, :, 2:3], qkv[:, :, 3:]
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.25, True, 0)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd_qkvpacked.default,
                          (dout, qkv, out, lse, 2, 0.25, True, True, "ascending", 0))
    kv = torch.randn(1, 6, 2, 1, 16)
    out, lse = torch.ops.flash_attn_dash.fwd(q, kv[:, :, 0], kv[:, :, 1], 0.25, False, 0)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd_kvpacked.default,
                          (dout, q.contiguous(), kv, out, lse, 0.25, False, False, "auto", 0))
    cu = cu_seqlens([2, 4])
    qkv = torch.randn(6, 3, 2, 16)
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(*qkv.unbind(1), cu, cu, 4, 4, None, None, 0.25, True, 0)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd_qkvpacked.default,
                          (out, qkv, out, lse, cu, 4, None, 0.25, True, True, "auto", 0))
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd_kvpacked.default,
                          (out, qkv[:, 0].contiguous(), qkv[:, 1:].contiguous(), out, lse, cu, cu, 4, 4, 0.25, True,
                           False, "auto", 0))


def test_packed_torch_compile_fullgraph():
    torch._dynamo.reset()
    qkv = torch.randn(2, 10, 3, 2, 16, requires_grad=True)
    q = torch.randn(2, 10, 2, 16, requires_grad=True)

    cu = cu_seqlens([3, 0, 7])

    def step(qkv, q):
        a = flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True)
        b = flash_attn_kvpacked_func(q, qkv[:, :, 1:], deterministic=False)
        c = flash_attn_varlen_qkvpacked_func(qkv[0], cu, 7, causal=True)
        d = flash_attn_varlen_kvpacked_func(q[1], qkv[1, :, 1:], cu, cu, 7, 7)
        return (a * b).sum() + (c * d).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    grads = torch.autograd.grad(compiled(qkv, q), (qkv, q))
    ref = torch.autograd.grad(step(qkv, q), (qkv, q))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)


@pytest.fixture
def deterministic_switch():
    before = torch.are_deterministic_algorithms_enabled()
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(before)


@pytest.fixture
def seen_deterministic(monkeypatch):
    """The ``deterministic`` each backward received (flash_attn_func, packed)."""
    seen = []
    real = ops.backward_into

    def spy(*args, **features):
        seen.append(args[11])
        return real(*args, **features)

    monkeypatch.setattr(ops, "backward_into", spy)
    return seen


@pytest.mark.parametrize("enabled", [False, True])
def test_deterministic_none_follows_torch_switch(enabled, deterministic_switch, seen_deterministic):
    deterministic_switch(enabled)
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    qkv = torch.randn(1, 8, 3, 2, 16, requires_grad=True)
    flash_attn_func(q, q, q, causal=True).sum().backward()
    flash_attn_qkvpacked_func(qkv).sum().backward()
    flash_attn_kvpacked_func(q, qkv[:, :, 1:]).sum().backward()
    flash_attn_func(q, q, q, deterministic=not enabled).sum().backward()  # an explicit bool wins
    assert seen_deterministic == [enabled, enabled, enabled, not enabled]
    # Non-deterministic causal backwards walk the balanced pair grid whatever schedule says.
    expected = "descending" if enabled else "symmetric_shift"
    big = torch.empty(1, 4096, 8, 128)
    assert backward_schedule_used(big, big, causal=True, deterministic=None, schedule="descending") == expected


def test_deterministic_none_is_read_when_compiled(deterministic_switch, seen_deterministic):
    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flash_attn_func(q, k, v).sum(), fullgraph=True, backend="aot_eager")
    for enabled in (False, True, False):
        deterministic_switch(enabled)
        compiled(q, k, v).backward()
    assert seen_deterministic == [False, True, False]
