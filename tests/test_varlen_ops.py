"""The varlen custom ops trace under fake tensors and torch.compile(fullgraph=True), and pass opcheck."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from varlen_packs import cu_seqlens, make_pack

from flash_attn_dash import flash_attn_varlen_func


def test_fake_tensor_shapes():
    with FakeTensorMode():
        q, k = torch.empty(33, 4, 64, dtype=torch.bfloat16), torch.empty(17, 2, 64, dtype=torch.bfloat16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(q, k, k, cu, cu, 20, 10, None, None, 0.125, True, 0)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (4, 33) and lse.dtype == torch.float32
        used = torch.empty(3, dtype=torch.int32)
        dq, dk, dv, dsink = torch.ops.flash_attn_dash.varlen_bwd(out, q, k, k, out, lse, cu, cu, 20, 10, used, used,
                                                                 0.125, True, True, "auto", 0)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape) and dk.dtype == k.dtype
        assert dsink.shape == (0,) and dsink.dtype == torch.float32


def test_public_function_traces_under_fake_tensors():
    """Its checks read only dtypes, devices and shapes, so fake tensors pass through them."""
    pack = make_pack([3, 0, 5], [2, 4, 5])
    args, real_qkv = pack.args(), [t.detach() for t in (pack.q, pack.k, pack.v)]
    with FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for name, t in args.items()}
        q, k, v = (mode.from_tensor(t) for t in real_qkv)
        out, lse = flash_attn_varlen_func(q, k, v, **fake, causal=True, return_lse=True)
        assert out.shape == q.shape and lse.shape == (4, 8)


@pytest.mark.parametrize("with_seqused", [False, True], ids=["packed", "seqused"])
def test_opcheck(with_seqused):
    pack = make_pack([3, 0, 5, 1], [2, 4, 5, 0], heads=2, heads_k=1)
    if with_seqused:
        pack.used_q, pack.used_k = [2, 0, 5, 1], [2, 1, 3, 0]
    a = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    index = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"], a["seqused_q"],
             a["seqused_k"])
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_fwd.default, (q, k, v, *index, 0.25, True, 0))
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(q, k, v, *index, 0.25, True, 0)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, *index, 0.25, True, True, "descending", 0))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_compile_fullgraph_forward_and_backward(causal):
    torch._dynamo.reset()

    def step(q, k, v, cu_q, cu_k, used_k, max_q, max_k):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used_k, causal=causal,
                                     deterministic=True)
        return out.square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    # two packs of different lengths and bounds: the second call may retrace with dynamic shapes
    for lens_q, lens_k, used_k in (([3, 0, 5], [2, 4, 5], [2, 4, 3]), ([7, 2], [7, 9], [1, 9])):
        pack = make_pack(lens_q, lens_k)
        leaves = (pack.q, pack.k, pack.v)
        index = (cu_seqlens(lens_q), cu_seqlens(lens_k), torch.tensor(used_k, dtype=torch.int32), max(lens_q),
                 max(lens_k))
        loss = compiled(*leaves, *index)
        grads = torch.autograd.grad(loss, leaves)
        want = step(*leaves, *index)
        want_grads = torch.autograd.grad(want, leaves)
        assert loss.item() > 0
        torch.testing.assert_close(loss, want, atol=0, rtol=0)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_compile_with_one_offsets_tensor_for_q_and_k():
    """Self-attention packs pass the same cu_seqlens for q and k; torch.compile must still trace the call."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(10, 2, 16, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)

    def step(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True).square().sum()

    grads = torch.autograd.grad(torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v), (q, k, v))
    for g, r in zip(grads, torch.autograd.grad(step(q, k, v), (q, k, v))):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("with_seqused", [False, True], ids=["packed", "seqused"])
def test_backward_into_writes_every_row(with_seqused):
    """varlen_backward_into takes dq/dk/dv as they come (the ops allocate them without a fill) and writes every row:
    zeros for a sequence without keys or queries and past seqused_*, the same bits as into zero-filled gradients."""
    from flash_attn_dash.varlen_ops import varlen_backward_into

    pack = make_pack([3, 4, 0, 5, 1], [2, 0, 4, 5, 3], heads=2, heads_k=1)
    if with_seqused:
        pack.used_q, pack.used_k = [2, 4, 0, 5, 0], [2, 0, 3, 3, 3]
    a = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    index = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"], a["seqused_q"],
             a["seqused_k"])
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(q, k, v, *index, 0.25, True, 0)
    dout = torch.randn_like(out)
    results = []
    for fill in (0.0, float("nan")):
        dq, dk, dv = (torch.full_like(t, fill) for t in (q, k, v))
        varlen_backward_into(dout, q, k, v, out, lse, dq, dk, dv, *index, 0.25, True, True, "descending", 0)
        results.append((dq, dk, dv))
    for name, zeroed, poisoned in zip(("dq", "dk", "dv"), *results):
        assert torch.equal(poisoned, zeroed), name
    assert torch.equal(results[1][0][3:7], torch.zeros_like(q[3:7])), "the sequence without keys: dq rows not 0"
    for grad in results[1][1:]:
        assert torch.equal(grad[2:6], torch.zeros_like(grad[2:6])), "the sequence without queries: dk/dv rows not 0"
