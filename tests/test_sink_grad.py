"""The learnable sink's gradient from out and lse (features.sink_grad_from_lse, what the CUDA backward adds to the
kernels' dq/dk/dv) against autograd through the reference, on the CPU in fp64: full, causal, a window, GQA, rows that
see no key."""
from __future__ import annotations

import pytest
import torch

from flash_attn_dash import features
from flash_attn_dash.reference import attention_ref


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
    got = features.sink_grad_from_lse(dout, out.detach(), lse.detach(), sink.detach().double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
