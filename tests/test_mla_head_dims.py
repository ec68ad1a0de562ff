"""A V head dim of its own (DeepSeek-V3's MLA: q/k 192, v 128) on the CPU: the reference's forward, lse and gradients
against autograd of a naive softmax attention, every entry point's shapes and default scale, the ops' fakes / opcheck /
torch.compile, the validation messages and the kernel-table answers ((192, 128) is a pair of the variant table)."""
import math
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flash_attn_dash import (checks, flash_attn_func, flash_attn_kvpacked_func, flash_attn_varlen_func,
                             flash_attn_varlen_kvpacked_func, variants)
from flash_attn_dash.reference import attention_ref, attention_ref_grads

F64 = torch.float64
D, DV = 24, 16  # small stand-ins for 192 / 128: what matters is dv != d


def _qkv(b=2, sq=7, sk=9, h=4, hk=2, d=D, dv=DV, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g, dtype=dtype)
    k = torch.randn(b, sk, hk, d, generator=g, dtype=dtype)
    v = torch.randn(b, sk, hk, dv, generator=g, dtype=dtype)
    return q, k, v


def _naive(q, k, v, scale, causal, window, softcap, sink):
    """Softmax attention written out (no shared code with reference.py): (out, lse)."""
    h = q.shape[2]
    k = k.repeat_interleave(h // k.shape[2], dim=2)
    v = v.repeat_interleave(h // v.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq).view(-1, 1) + sk - sq
    j = torch.arange(sk).view(1, -1)
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.view(1, -1, 1, 1).expand(s.shape[0], -1, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


CASES = {
    "full": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(3, 1)),
    "softcap_sink": dict(causal=True, softcap=1.5, sink=True),
}


@pytest.mark.parametrize("case", CASES)
def test_reference_forward_lse_and_gradients_match_a_naive_softmax(case):
    """out (b, sq, h, dv), lse and dq/dk/dv (and dsink) of reference.py against autograd of the naive attention, with
    the default scale q's head dim ** -0.5."""
    kw = dict(CASES[case])
    sink = torch.tensor([0.3, -0.2, 0.1, 0.5], dtype=F64, requires_grad=True) if kw.pop("sink", False) else None
    causal, window, softcap = kw.get("causal", False), kw.get("window_size", (-1, -1)), kw.get("softcap", 0.0)
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, lse = attention_ref(q, k, v, None, causal, window_size=window, softcap=softcap, learnable_sink=sink)
    want_out, want_lse = _naive(q, k, v, D ** -0.5, causal, window, softcap, sink)
    assert out.shape == (2, 7, 4, DV)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)
    dout = torch.randn_like(want_out)
    leaves = (q, k, v) + ((sink,) if sink is not None else ())
    want = torch.autograd.grad(want_out, leaves, dout)
    got = attention_ref_grads(dout, q.detach(), k.detach(), v.detach(), None, causal, window_size=window,
                              softcap=softcap, learnable_sink=None if sink is None else sink.detach())
    assert got.dv.shape == v.shape and got.dk.shape == k.shape and got.dq.shape == q.shape
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), (got.dq, got.dk, got.dv, got.dsink), want):
        torch.testing.assert_close(g, w, msg=name)


def test_flash_attn_func_takes_a_v_head_dim_of_its_own():
    """The CPU path (the reference behind the custom ops): out has v's head dim, the default scale is q's head dim's
    (not v's), and the gradients reach q, k, v in their own shapes."""
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 7, 4, DV)
    torch.testing.assert_close(out, attention_ref(q, k, v, D ** -0.5, True)[0])
    assert not torch.allclose(out, attention_ref(q, k, v, DV ** -0.5, True)[0])
    out.square().sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)


def test_flash_attn_varlen_func_takes_a_v_head_dim_of_its_own():
    """Each packed sequence's rows equal its dense call's, out (total_q, heads, dv)."""
    lens_q, lens_k = [3, 0, 5], [4, 2, 6]
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12], dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(8, 4, D, generator=g, dtype=F64), torch.randn(12, 2, D, generator=g, dtype=F64)
    v = torch.randn(12, 2, DV, generator=g, dtype=F64)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    assert out.shape == (8, 4, DV)
    for b in (0, 2):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = flash_attn_func(q[rq][None], k[rk][None], v[rk][None], causal=True)[0]
        torch.testing.assert_close(out[rq], want, atol=0, rtol=0)


def test_validation_messages():
    """v may differ from k in its head dim only; k's head dim must be q's; kv-packed entry points, whose k and v share
    one tensor, name the entry point a v head dim of its own needs."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"v.shape\[:3\] \(batch, seqlen, heads\) must equal k.shape\[:3\]"):
        flash_attn_func(q, k, v[:, :3])
    with pytest.raises(ValueError, match=r"k.shape\[3\] \(head_dim\) must equal q.shape\[3\] = 24, got 16"):
        flash_attn_func(q, v, v)
    kv = torch.randn(2, 9, 2, 2, DV, dtype=F64)
    with pytest.raises(ValueError, match=r"kv.shape\[-1\] \(the head_dim of k and v\) must equal q.shape\[-1\] = 24, "
                                         r"got 16: .*needs flash_attn_func / flash_attn_varlen_func"):
        flash_attn_kvpacked_func(q, kv)
    cu = torch.tensor([0, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv.shape\[-1\] \(the head_dim of k and v\) must equal q.shape\[-1\]"):
        flash_attn_varlen_kvpacked_func(q[0], kv[0, :7], cu, cu, 7, 7)


def test_kernel_table_names_the_pair():
    """(192, 128) is a table entry (its own kernels, hdim 192's backward tiles); other pairs are refused naming the
    accepted ones; a build without it says how to add it (FLASH_DASH_HDIMS=...,192v128)."""
    assert (192, 128) in checks.KERNEL_HEAD_DIMS and 192 in checks.KERNEL_HEAD_DIMS
    checks.check_kernel_head_dim(192, 128)
    checks.check_kernel_head_dim(128, 128)
    with pytest.raises(ValueError, match=re.escape(f"head_dim must be one of {checks.KERNEL_HEAD_DIMS}") +
                       r".*got \(192, 64\)"):
        checks.check_kernel_head_dim(192, 64)
    with pytest.raises(ValueError, match=r"got \(128, 192\)"):
        checks.check_kernel_head_dim(128, 192)
    msg = checks.not_compiled_message(192, (64, 96, 128), 128)
    assert "head_dim (192, 128) was not compiled into this build (built: 64, 96, 128)" in msg
    assert "default builds leave it out" in msg
    assert "FLASH_DASH_HDIMS=64,96,128,192v128 pip install" in msg
    assert "FLASH_DASH_HDIMS=192,192v128 " in checks.not_compiled_message(192, (192,), 128)
    assert variants.bwd_tile(192, 128) == variants.bwd_tile(192)  # launch.py's auto rule is hdim 192's
    assert checks.head_dim_label(192, 192) == 192 and checks.head_dim_label(192, 128) == (192, 128)


def test_fakes_give_out_and_dv_the_v_head_dim():
    with FakeTensorMode():
        q, k, v = torch.empty(2, 9, 4, 192), torch.empty(2, 5, 2, 192), torch.empty(2, 5, 2, 128)
        out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.1, True, 0)
        assert out.shape == (2, 9, 4, 128) and lse.shape == (2, 4, 9)
        dq, dk, dv, _ = torch.ops.flash_attn_dash.bwd(out, q, k, v, out, lse, 0.1, True, True, "auto", 0)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        vq, vk, vv = torch.empty(9, 4, 192), torch.empty(5, 2, 192), torch.empty(5, 2, 128)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(vq, vk, vv, cu, cu, 5, 5, None, None, 0.1, True, 0)
        assert out.shape == (9, 4, 128) and lse.shape == (4, 9)
        grads = torch.ops.flash_attn_dash.varlen_bwd(out, vq, vk, vv, out, lse, cu, cu, 5, 5, None, None, 0.1, True,
                                                     True, "auto", 0)
        assert [g.shape for g in grads[:3]] == [vq.shape, vk.shape, vv.shape]


def test_opcheck_with_a_v_head_dim_of_its_own():
    q, k, v = _qkv(b=1, sq=6, sk=5, h=2, hk=1, dtype=torch.float32)
    torch.library.opcheck(torch.ops.flash_attn_dash.fwd.default, (q, k, v, 0.25, True, 0))
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.25, True, 0)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.25, True, True, "descending", 0))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 5], dtype=torch.int32)
    index = (cu, cu_k, 4, 3, None, None)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_fwd.default, (q[0], k[0], v[0], *index, 0.25, True, 0))
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(q[0], k[0], v[0], *index, 0.25, True, 0)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd.default,
                          (torch.randn_like(out), q[0], k[0], v[0], out, lse, *index, 0.25, True, True, "auto", 0))


def test_torch_compile_fullgraph_with_a_v_head_dim_of_its_own():
    leaves = tuple(t.float().requires_grad_() for t in _qkv())

    def step(q, k, v):
        return flash_attn_func(q, k, v, causal=True, deterministic=True).square().sum()

    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    want = step(*leaves)
    torch.testing.assert_close(loss, want, atol=0, rtol=0)
    for g, w in zip(grads, torch.autograd.grad(want, leaves)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_gpu_tests_name_the_pair_apart_and_keep_the_equal_ids():
    """tests/kernel_head_dims.py: the GPU tests' head dims are ints (q's and k's) with v's head dim; an equal pair is
    the int it was (same value, hash and test id), MLA's is 192v128 and not equal to 192; pairs are only collected
    by the tests that ask for them."""
    from kernel_head_dims import HeadDims, gpu_head_dims, head_dim_v

    same, mla = HeadDims(192, 192), HeadDims(192, 128)
    assert same == 192 and hash(same) == hash(192) and str(same) == "192"
    assert mla != 192 and 192 != mla and mla != same and len({same, mla, 192}) == 2
    assert str(mla) == "192v128" and head_dim_v(mla) == 128 and head_dim_v(64) == 64 and int(mla) ** -0.5 == 192 ** -0.5
    assert all(head_dim_v(d) == d for d in gpu_head_dims())


def test_gpu_tests_cover_the_default_build_unless_built_only(monkeypatch):
    """A build lacking a default-build head dim or a dtype fails those GPU tests, so they are collected whatever was
    built; FLASH_DASH_TEST_BUILT_ONLY=1 (a subset build linked on the device) collects only what was compiled."""
    import kernel_head_dims as khd

    built = {torch.bfloat16: ((192, 128), 128), torch.float16: ()}
    monkeypatch.setattr(khd._ext, "compiled_head_dims", lambda dtype: built[dtype])
    monkeypatch.delenv("FLASH_DASH_TEST_BUILT_ONLY", raising=False)
    defaults = [str(h.build_name) for h in variants.HEAD_DIMS if h.default_build]
    assert [str(d) for d in khd.gpu_head_dims(v_pairs=True)] == defaults + ["192v128"]
    assert khd.gpu_dtypes() == [torch.bfloat16, torch.float16]
    monkeypatch.setenv("FLASH_DASH_TEST_BUILT_ONLY", "1")
    assert [str(d) for d in khd.gpu_head_dims(v_pairs=True)] == ["128", "192v128"]
    assert [str(d) for d in khd.gpu_head_dims()] == ["128"]
    assert khd.gpu_dtypes() == [torch.bfloat16] and khd.dtype_id(torch.float16) == "fp16"
