"""The formula the CUDA backward's sink-gradient kernel computes (hopper/bwd/sink_grad.hpp, from the preprocess's
row sums of dout * out and the forward's lse) against autograd through the reference, on the CPU in fp64: full,
causal, a window, GQA, rows that see no key."""
from __future__ import annotations

import pytest
import torch

from flash_attn_dash.reference import attention_ref


def sink_grad_from_lse(dout, out, lse, sink):
    """Every row's output is scaled by 1 - p_sink, p_sink = exp(sink[h] - lse): dsink[h] = -sum over batch and rows
    of p_sink * rowsum(dout * out)."""
    dpsum = (dout * out).sum(-1)  # (b, sq, h)
    return -(torch.exp(sink[None, :, None] - lse) * dpsum.transpose(1, 2)).sum(dim=(0, 2))


@pytest.mark.parametrize("sq,sk,h,hk,causal,window", [(37, 53, 4, 2, False, (-1, -1)), (64, 40, 2, 1, True, (-1, -1)),
                                                       (50, 50, 3, 3, False, (7, 0)), (1, 9, 2, 2, True, (2, 2))])
def test_sink_gradient_from_out_and_lse(sq, sk, h, hk, causal, window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, h, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, sk, hk, 16, generator=g, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(h, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, sq, h, 16, generator=g, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, learnable_sink=sink)
    (want,) = torch.autograd.grad(out, sink, dout)
    got = sink_grad_from_lse(dout, out.detach(), lse.detach(), sink.detach())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
