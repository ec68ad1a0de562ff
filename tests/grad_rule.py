"""The tolerance rule the backward kernels are held to (dash.md §7), on any device.

max|x - ref| <= 2 * max|x_pt - ref| + atol, ref = the fp32 gradient, x_pt = input-dtype autograd,
atol = 2 * max|ref + 0.3 - 0.3 - ref| + 1e-5. The kernel's ref is the fp32 gradient of the algorithm it runs:
FlashAttention forms dPsum = rowsum(dO * O) from the stored (rounded) output where autograd uses P and dP, so the
kernel is compared with ref plus that term (:func:`stored_output_shift`). Where gradients are tiny (rows that see one
to three keys) it alone exceeds twice autograd's error: without it an exact fp64 FlashAttention backward fails the
rule at seqlens (799, 3) causal in 10-17% of seeds, at every head dim (benchmarks/results/2026-12-02-gpu-tests-hdim96.txt).
``softcap`` is the forward's (0 = off): the reference caps its scores, and under a cap dS carries 1 - tanh^2.
"""
from __future__ import annotations

import math

import torch

from flash_attn_dash.reference import _lse, _probs, _repeat_kv, _scores, attention_ref


def ref_grads(q, k, v, dout, causal, upcast, window_size=(-1, -1), learnable_sink=None, softcap=0.0):
    """dq, dk, dv of the reference attention: in fp32 (``upcast``) or in the input dtype (autograd's baseline)."""
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    if upcast:
        qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    out, _ = attention_ref(qr, kr, vr, softmax_scale=q.shape[-1] ** -0.5, causal=causal, upcast=upcast,
                           window_size=window_size, softcap=softcap, learnable_sink=learnable_sink)
    grads = torch.autograd.grad(out, (qr, kr, vr), dout.to(out.dtype))
    return [torch.nan_to_num(g_) for g_ in grads]


def stored_output_shift(q, k, v, dout, out, causal, window_size=(-1, -1), learnable_sink=None, softcap=0.0):
    """How the fp32 gradients move when dPsum comes from the stored output ``out`` instead of the exact one:
    dS = P (dP - dPsum) moves by -P dD, dD = rowsum(dO * (out - O_exact)), so dQ moves by -scale dD (P K) and dK by
    -scale P^T (dD Q) (summed over a GQA group); dV does not move. Under a softcap P becomes P (1 - tanh^2)."""
    if softcap:
        return _softcap_stored_output_shift(q, k, v, dout, out, causal, window_size, learnable_sink, softcap)
    scale = q.shape[-1] ** -0.5
    qf, kf, vf = q.float(), k.float(), v.float()
    ref = dict(softmax_scale=scale, causal=causal, window_size=window_size, learnable_sink=learnable_sink)
    o_exact, _ = attention_ref(qf, kf, vf, **ref)
    dd = (dout.float() * (out.float() - o_exact)).sum(-1, keepdim=True)
    pk, _ = attention_ref(qf, kf, kf, **ref)
    kr = kf.clone().requires_grad_(True)
    o_k, _ = attention_ref(qf, kf, kr, **ref)
    (p_t_ddq,) = torch.autograd.grad(o_k, kr, dd * qf)  # P^T (dD Q)
    return [torch.nan_to_num(-scale * dd * pk), torch.nan_to_num(-scale * p_t_ddq), 0.0]


def _softcap_stored_output_shift(q, k, v, dout, out, causal, window_size, learnable_sink, softcap):
    """stored_output_shift under a softcap, from the reference's capped scores: W = P (1 - tanh^2) (b, h, sq, sk) in
    place of P, dQ moves by -scale dD (W K) and dK by -scale W^T (dD Q) (summed over a GQA group)."""
    scale = q.shape[-1] ** -0.5
    heads, heads_k = q.shape[2], k.shape[2]
    qf, kf, vf = q.float(), k.float(), v.float()
    ref = dict(softmax_scale=scale, causal=causal, window_size=window_size, softcap=softcap,
               learnable_sink=learnable_sink)
    o_exact, _ = attention_ref(qf, kf, vf, **ref)
    dd = (dout.float() * (out.float() - o_exact)).sum(-1)  # (b, sq, h)
    kr = _repeat_kv(kf, heads)
    scores, capped = _scores(qf, kr, scale, causal, window_size, softcap, torch.float32)
    w = _probs(scores, _lse(scores, learnable_sink)) * (1 - capped * capped)  # (b, h, sq, sk)
    w = w * dd.transpose(1, 2).unsqueeze(-1)  # rows scaled by dD
    dq = -scale * torch.einsum("bhst,bthd->bshd", w, kr)
    dk = -scale * torch.einsum("bhst,bshd->bthd", w, qf)
    b, sk, d = k.shape[0], k.shape[1], k.shape[3]
    dk = dk.reshape(b, sk, heads_k, heads // heads_k, d).sum(3)
    return [torch.nan_to_num(dq), torch.nan_to_num(dk), 0.0]


def tolerance_rule(q, k, v, dout, out, grads, causal, window_size=(-1, -1), learnable_sink=None, softcap=0.0):
    """Per gradient ``(name, err, bound)``; the rule holds where err <= bound. ``out`` is the stored output the
    backward was given; ``grads`` must have the inputs' shapes and dtype and no NaN (poisoned = unwritten)."""
    feats = dict(window_size=window_size, learnable_sink=learnable_sink, softcap=softcap)
    ref = ref_grads(q, k, v, dout, causal, upcast=True, **feats)
    pt = ref_grads(q, k, v, dout, causal, upcast=False, **feats)
    shift = stored_output_shift(q, k, v, dout, out, causal, **feats)
    floor = 1e-5 * math.sqrt(max(1.0, v.shape[-1] / 64) * (q.shape[2] // k.shape[2]))
    rows = []
    for name, x, r, p, dr in zip(("dq", "dk", "dv"), grads, ref, pt, shift):
        assert x.shape == r.shape and x.dtype == q.dtype, name
        assert not torch.isnan(x).any(), f"{name}: NaN or unwritten (poison) elements"
        # + floor: where the reference gradient is exactly 0 (e.g. one key per row: dS = P(dP - dPsum) = 0) the
        # kernel's dP (an MMA) and dPsum (a row sum) are fp32 dot products over v's head dim rounded in different
        # orders; their difference grows like its square root, and GQA adds `group` such dK/dV tiles. 1e-5 at
        # head dim 64 without GQA, far below any real error.
        atol = 2 * (r + 0.3 - 0.3 - r).abs().max().item() + floor
        err = (x.float() - (r + dr)).abs().max().item()
        err_pt = (p.float() - r).abs().max().item()
        rows.append((name, err, 2 * err_pt + atol))
    return rows


def assert_tolerance_rule(q, k, v, dout, out, grads, causal, **features):
    """Assert :func:`tolerance_rule` holds for every gradient (``features``: its window_size, learnable_sink,
    softcap)."""
    for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, causal, **features):
        assert err <= bound, f"{name}: err {err:.3e} > 2 * pt + atol = {bound:.3e}"
