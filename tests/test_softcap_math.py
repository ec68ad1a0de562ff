"""The softcap kernels' arithmetic, emulated in fp64 on the CPU, against the reference (flash_attn_dash.reference).

The forward kernel sees t = tanh(S * softmax_scale / softcap) (Params::softcap_prescale), masks after the tanh, and
runs the plain online softmax with softcap's units (Params::scale_log2 = softcap * log2 e, lse = max * softcap +
log(sum)). The backward recomputes t, P = exp2(t * softcap * log2 e - lse * log2 e) and dS = P (1 - t^2) (dP - dPsum)
(max(1 - t^2, 0): masked t = -inf gives 0, not NaN), and scales dQ and dK by softmax_scale as the plain kernels.
The emulations follow hopper/fwd/{launch.h,mainloop.hpp,softmax.hpp} and hopper/bwd/{launch.h,mainloop.hpp}; the
tolerance rule (tests/grad_rule.py) then has to pass that algorithm in bf16 and fail a 3% error.
"""
from __future__ import annotations

import math

import pytest
import torch

from grad_rule import tolerance_rule

from flash_attn_dash.reference import attention_ref, attention_ref_grads, visible_mask

LOG2E = 1.0 / math.log(2.0)


def _capped(q, k, scale, softcap, causal):
    """t = tanh(S * softmax_scale / softcap) (b, h, sq, sk), -inf where masked (after the tanh), GQA expanded."""
    h, hk = q.shape[2], k.shape[2]
    kk = k.repeat_interleave(h // hk, 2)
    s = torch.einsum("bshd,bthd->bhst", q, kk)
    t = torch.tanh(s * (scale / softcap))
    if causal:
        t = t.masked_fill(~visible_mask(q.shape[1], k.shape[1], True), -math.inf)
    return t


def _kernel_forward(q, k, v, scale, softcap, causal, block_n=128):
    """The forward kernel's online softmax over K/V blocks (last block first) in softcap's units."""
    q, k, v = q.double(), k.double(), v.double()
    h, hk = q.shape[2], k.shape[2]
    vv = v.repeat_interleave(h // hk, 2).transpose(1, 2)  # (b, h, sk, d)
    t = _capped(q, k, scale, softcap, causal)
    scale_log2, lse_scale = softcap * LOG2E, softcap  # what launch_fwd_kernel passes for kSoftcap
    b, _, sq, sk = t.shape
    row_max = torch.full((b, h, sq), -math.inf, dtype=torch.float64)
    row_sum = torch.zeros(b, h, sq, dtype=torch.float64)
    o = torch.zeros(b, h, sq, v.shape[-1], dtype=torch.float64)
    for n in reversed(range(0, sk, block_n)):
        tb = t[..., n:n + block_n]
        m = torch.maximum(row_max, tb.max(-1).values)
        m_scaled = torch.where(m == -math.inf, torch.zeros_like(m), m * scale_log2)
        o_scale = torch.exp2(row_max * scale_log2 - m_scaled)
        p = torch.exp2(tb * scale_log2 - m_scaled.unsqueeze(-1))
        row_sum = row_sum * o_scale + p.sum(-1)
        o = o * o_scale.unsqueeze(-1) + p @ vv[:, :, n:n + block_n]
        row_max = m
    empty = row_sum == 0
    lse = torch.where(empty, torch.full_like(row_sum, -math.inf), row_max * lse_scale + torch.log(row_sum))
    o = torch.where(empty.unsqueeze(-1), torch.zeros_like(o), o / row_sum.unsqueeze(-1))
    return o.transpose(1, 2), lse


def _kernel_backward(q, k, v, dout, out, lse, scale, softcap, causal, tanh_derivative=True):
    """The backward kernel's dq, dk, dv in fp64 from the stored ``out`` and the forward's ``lse`` (without
    ``tanh_derivative``: a wrong kernel that drops 1 - t^2)."""
    qd, kd, vd, dod, od = (x.double() for x in (q, k, v, dout, out))
    h, hk = q.shape[2], k.shape[2]
    r = h // hk
    t = _capped(qd, kd, scale, softcap, causal)
    lse_log2 = torch.where(lse == -math.inf, torch.zeros_like(lse), lse * LOG2E).double()  # the preprocess
    p = torch.exp2(t * (softcap * LOG2E) - lse_log2.unsqueeze(-1))
    p_dt = p * torch.clamp(1 - t * t, min=0.0) if tanh_derivative else p  # masked t = -inf: 1 - t^2 = -inf
    kk, vv = (x.repeat_interleave(r, 2) for x in (kd, vd))
    dp = torch.einsum("bshd,bthd->bhst", dod, vv)
    dpsum = (dod * od).sum(-1).transpose(1, 2)  # (b, h, sq)
    ds = p_dt * (dp - dpsum.unsqueeze(-1))
    dq = scale * torch.einsum("bhst,bthd->bshd", ds, kk)
    dk = scale * torch.einsum("bhst,bshd->bthd", ds, qd)
    dv = torch.einsum("bhst,bshd->bthd", p, dod)
    b, sk, d = k.shape[0], k.shape[1], k.shape[3]
    dk = dk.reshape(b, sk, hk, r, d).sum(3)
    dv = dv.reshape(b, sk, hk, r, d).sum(3)
    assert not any(torch.isnan(x).any() for x in (dq, dk, dv))
    return dq, dk, dv


def _problem(b, sq, sk, h, hk, d, seed, dtype=torch.float64, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, sq, h, d, generator=g, dtype=torch.float64) * spread).to(dtype)
    k, v = (torch.randn(b, sk, hk, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    dout = torch.randn(b, sq, h, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, dout


SHAPES = [(1, 130, 300, 2, 1), (2, 203, 113, 4, 2), (1, 256, 256, 2, 2), (1, 5, 1, 1, 1)]


@pytest.mark.parametrize("softcap", [5.0, 30.0, 0.7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,sq,sk,h,hk", SHAPES)
def test_kernel_forward_units_match_the_reference(b, sq, sk, h, hk, causal, softcap):
    """softmax_scale -> softcap and scale_log2 -> softcap * log2 e in the softcap kernels give the reference's out and
    lse (rows without a key: out 0, lse -inf); spread 4 drives the scores into the tanh's saturation."""
    q, k, v, _ = _problem(b, sq, sk, h, hk, 32, seed=3, spread=4.0)
    scale = 32 ** -0.5
    out, lse = _kernel_forward(q, k, v, scale, softcap, causal)
    ref_out, ref_lse = attention_ref(q, k, v, softmax_scale=scale, causal=causal, softcap=softcap)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = ~torch.isinf(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("softcap", [5.0, 30.0, 0.7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,sq,sk,h,hk", SHAPES)
def test_kernel_backward_matches_autograd_and_the_reference_grads(b, sq, sk, h, hk, causal, softcap):
    """dS = P (1 - t^2) (dP - dPsum), dQ/dK scaled by softmax_scale: autograd of the reference (fp64) and its explicit
    gradients agree with it, rows without a key included."""
    q, k, v, dout = _problem(b, sq, sk, h, hk, 32, seed=4, spread=3.0)
    scale = 32 ** -0.5
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = attention_ref(*leaves, softmax_scale=scale, causal=causal, softcap=softcap)
    auto = torch.autograd.grad(out, leaves, dout)
    mine = _kernel_backward(q, k, v, dout, out.detach(), lse.detach(), scale, softcap, causal)
    explicit = attention_ref_grads(dout, q, k, v, scale, causal, softcap=softcap)
    for name, a, m, e in zip(("dq", "dk", "dv"), auto, mine, (explicit.dq, explicit.dk, explicit.dv)):
        torch.testing.assert_close(m, a, atol=1e-10, rtol=1e-10, msg=name)
        torch.testing.assert_close(e, a, atol=1e-10, rtol=1e-10, msg=name)


def _bf16_kernel_run(b, sq, sk, h, hk, d, causal, softcap, seed):
    """bf16 inputs, the stored bf16 output of the fp32 forward and the emulated kernel backward rounded to bf16."""
    q, k, v, dout = _problem(b, sq, sk, h, hk, d, seed, dtype=torch.bfloat16)
    scale = d ** -0.5
    out32, lse = attention_ref(q.float(), k.float(), v.float(), softmax_scale=scale, causal=causal, softcap=softcap)
    out = out32.bfloat16()
    grads = [g.to(torch.bfloat16) for g in _kernel_backward(q, k, v, dout, out, lse, scale, softcap, causal)]
    return q, k, v, dout, out, grads


@pytest.mark.parametrize("softcap", [5.0, 30.0, 50.0])
@pytest.mark.parametrize("b,sq,sk,h,hk,causal", [(1, 799, 3, 1, 1, True), (1, 113, 203, 4, 2, True),
                                                 (2, 128, 128, 2, 2, False)])
def test_tolerance_rule_passes_the_softcap_algorithm(b, sq, sk, h, hk, causal, softcap):
    for seed in range(4):
        q, k, v, dout, out, grads = _bf16_kernel_run(b, sq, sk, h, hk, 64, causal, softcap, seed)
        for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, causal, softcap=softcap):
            assert err <= bound, f"seed {seed} {name}: err {err:.3e} > bound {bound:.3e}"


@pytest.mark.parametrize("which", [0, 1, 2])
def test_tolerance_rule_fails_a_three_percent_softcap_error(which):
    q, k, v, dout, out, grads = _bf16_kernel_run(2, 128, 128, 2, 2, 64, False, 5.0, 0)
    grads[which] = (grads[which].float() * 1.03).to(grads[which].dtype)
    failed = [name for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, False, softcap=5.0)
              if err > bound]
    assert failed == [("dq", "dk", "dv")[which]]


def test_tolerance_rule_catches_a_missing_tanh_derivative():
    """A backward that forgets 1 - t^2 (the plain kernels' dS on capped scores) fails the rule at softcap 5 in dq and
    dk; dv does not use dS."""
    q, k, v, dout, out, _ = _bf16_kernel_run(2, 128, 128, 2, 2, 64, False, 5.0, 0)
    scale = 64 ** -0.5
    lse = attention_ref(q.float(), k.float(), v.float(), softmax_scale=scale, softcap=5.0)[1]
    grads = [g.to(torch.bfloat16) for g in _kernel_backward(q, k, v, dout, out, lse, scale, 5.0, False,
                                                            tanh_derivative=False)]
    failed = [name for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, False, softcap=5.0)
              if err > bound]
    assert failed == ["dq", "dk"]


def test_softcap_shift_tends_to_the_plain_shift():
    """The softcap branch of stored_output_shift agrees with the plain one where the cap does nothing (a cap of 1e4:
    tanh is the identity to 1e-9)."""
    from grad_rule import stored_output_shift

    q, k, v, dout = _problem(1, 70, 90, 4, 2, 32, seed=7, dtype=torch.bfloat16)
    out = attention_ref(q.float(), k.float(), v.float(), causal=True)[0].bfloat16()
    plain = stored_output_shift(q, k, v, dout, out, True)
    capped = stored_output_shift(q, k, v, dout, out, True, softcap=1e4)
    for a, b_ in zip(plain[:2], capped[:2]):
        assert a.abs().max() > 0
        torch.testing.assert_close(b_, a, atol=1e-6, rtol=1e-4)
    assert capped[2] == 0.0
