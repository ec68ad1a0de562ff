"""The backward tolerance rule (tests/grad_rule.py) on the CPU: an exact FlashAttention backward, which forms dPsum
from the stored bf16 output, passes it on the tiny-gradient shapes where it used to fail by chance, and a backward
that is wrong by 3% (a few bf16 steps) does not."""
from __future__ import annotations

import pytest
import torch

from grad_rule import tolerance_rule

from flash_attn_dash.reference import attention_ref


def _exact_flash_backward(q, k, v, dout, out, causal):
    """FlashAttention's backward in fp64 (dS = P (dP - rowsum(dO * out)) with the stored ``out``), rounded to the
    input dtype once at the end, GQA by expanding K/V over the group and summing dK/dV back."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    r = h // hk
    scale = d ** -0.5
    qd, kd, vd, dod, od = (x.double().transpose(1, 2) for x in
                           (q, k.repeat_interleave(r, 2), v.repeat_interleave(r, 2), dout, out))
    s = scale * qd @ kd.transpose(-1, -2)
    if causal:
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    ds = p * (dod @ vd.transpose(-1, -2) - (dod * od).sum(-1, keepdim=True))
    dq = scale * ds @ kd
    dk = (scale * ds.transpose(-1, -2) @ qd).view(b, hk, r, sk, d).sum(2)
    dv = (p.transpose(-1, -2) @ dod).view(b, hk, r, sk, d).sum(2)
    return [x.transpose(1, 2).to(q.dtype).contiguous() for x in (dq, dk, dv)]


def _problem(b, sq, sk, h, hk, d, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).bfloat16()
    k, v = (torch.randn(b, sk, hk, d, generator=g).bfloat16() for _ in range(2))
    dout = torch.randn(b, sq, h, d, generator=g).bfloat16()
    out, _ = attention_ref(q.float(), k.float(), v.float(), softmax_scale=d ** -0.5, causal=causal)
    return q, k, v, dout, out.bfloat16()


@pytest.mark.parametrize("b,sq,sk,h,hk,causal", [(1, 799, 3, 1, 1, True), (1, 799, 3, 2, 1, True),
                                                 (1, 113, 203, 4, 2, True), (2, 128, 128, 2, 2, False)])
@pytest.mark.parametrize("d", [64, 128])
def test_exact_flash_backward_passes_over_seeds(b, sq, sk, h, hk, causal, d):
    for seed in range(12):
        q, k, v, dout, out = _problem(b, sq, sk, h, hk, d, causal, seed)
        grads = _exact_flash_backward(q, k, v, dout, out, causal)
        for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, causal):
            assert err <= bound, f"seed {seed} {name}: err {err:.3e} > bound {bound:.3e}"


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_three_percent_error_fails(which):
    q, k, v, dout, out = _problem(2, 128, 128, 2, 2, 64, False, 0)
    grads = _exact_flash_backward(q, k, v, dout, out, False)
    grads[which] = (grads[which].float() * 1.03).to(grads[which].dtype)
    failed = [name for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, False) if err > bound]
    assert failed == [("dq", "dk", "dv")[which]]
