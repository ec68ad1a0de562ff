"""The custom ops trace under fake tensors and torch.compile(fullgraph=True)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flash_attn_dash import flash_attn_func
from flash_attn_dash.reference import attention_ref


def test_fake_tensor_shapes():
    with FakeTensorMode():
        q, k, v = torch.empty(2, 33, 4, 64), torch.empty(2, 17, 2, 64), torch.empty(2, 17, 2, 64)
        out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.125, True, 0)
        assert out.shape == q.shape and lse.shape == (2, 4, 33) and lse.dtype == torch.float32
        dq, dk, dv, dsink = torch.ops.flash_attn_dash.bwd(out, q, k, v, out, lse, 0.125, True, True, "auto", 0)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        assert dsink.shape == (0,) and dsink.dtype == torch.float32


def test_opcheck():
    q, k, v = torch.randn(1, 9, 2, 16), torch.randn(1, 5, 1, 16), torch.randn(1, 5, 1, 16)
    torch.library.opcheck(torch.ops.flash_attn_dash.fwd.default, (q, k, v, 0.25, True, 0))
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.25, True, 0)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.flash_attn_dash.bwd.default, (dout, q, k, v, out, lse, 0.25, True, True, "ascending", 0)
    )


@pytest.mark.parametrize("causal", [False, True])
def test_torch_compile_fullgraph_forward_and_backward(causal):
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 12, 4, 16, requires_grad=True) for _ in range(3))

    def step(q, k, v):
        return flash_attn_func(q, k, v, causal=causal, deterministic=True).square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    ref = attention_ref(q, k, v, causal=causal)[0].square().sum()
    ref_grads = torch.autograd.grad(ref, (q, k, v))
    torch.testing.assert_close(loss, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_fp64_forward_agrees_with_its_fake():
    """The fake promises an fp32 lse for every dtype; the CPU path must return one for fp64 inputs too."""
    q, k, v = (torch.randn(1, 6, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.3, False, 0)
    assert out.dtype == torch.float64 and lse.dtype == torch.float32
    torch.library.opcheck(torch.ops.flash_attn_dash.fwd.default, (q, k, v, 0.3, False, 0))
