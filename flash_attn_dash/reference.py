"""PyTorch reference attention: the definition every kernel is tested against.

It materialises the (sq, sk) score matrix, so it is for tests and CPU tensors, not for speed.
"""
from __future__ import annotations

import math

import torch

__all__ = ["attention_ref", "attention_ref_bwd", "causal_mask"]


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (seqlen_q, seqlen_k) mask of visible keys, causal aligned bottom-right.

    Query row i sees key j iff j <= i + seqlen_k - seqlen_q (FlashAttention-2/3 convention), so when
    seqlen_q > seqlen_k the first seqlen_q - seqlen_k rows see no key at all.
    """
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention in the FlashAttention-3 layout, differentiable.

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        k, v: (batch, seqlen_k, heads_k, head_dim) with heads % heads_k == 0 (GQA/MQA).
        softmax_scale: scale of q·kᵀ; default head_dim ** -0.5.
        causal: mask aligned bottom-right (see :func:`causal_mask`).
        upcast: compute in fp32 (fp64 for fp64 inputs) and return ``out`` in that precision (the reference);
            if False the matmuls run in the input dtype and only the softmax in fp32 (the "same math in low
            precision" baseline of the FlashAttention tolerance rule).

    Returns:
        ``(out, lse)``: out (batch, seqlen_q, heads, head_dim); lse (batch, heads, seqlen_q) fp32 (fp64 for
        fp64 inputs), natural log of the softmax denominator. Rows that see no key give out = 0 and lse = -inf.
    """
    compute = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs (gradcheck)
    if upcast:
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    heads, heads_k = q.shape[2], k.shape[2]
    if heads != heads_k:
        k = k.repeat_interleave(heads // heads_k, dim=2)
        v = v.repeat_interleave(heads // heads_k, dim=2)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = torch.einsum("bshd,bthd->bhst", q, k).to(compute) * scale
    if causal:
        visible = causal_mask(q.shape[1], k.shape[1], device=q.device)
        scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    # Rows with no visible key have lse = -inf; subtracting 0 there keeps exp(-inf) = 0 and gradients finite.
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))
    out = torch.einsum("bhst,bthd->bshd", probs.to(v.dtype), v)
    return out, lse


def attention_ref_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Explicit fp32 gradients (dq, dk, dv) of :func:`attention_ref`, in the input dtype.

    The textbook backward (dS = P∘(dP − rowsum(dO∘O))); custom ops run below autograd, so the CPU
    implementation of ``flash_attn_dash::bwd`` cannot differentiate the forward and uses this instead.
    """
    compute = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf, dof = (t.to(compute) for t in (q, k, v, dout))
    heads, heads_k = q.shape[2], k.shape[2]
    group = heads // heads_k
    kf, vf = kf.repeat_interleave(group, dim=2), vf.repeat_interleave(group, dim=2)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = torch.einsum("bshd,bthd->bhst", qf, kf) * scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[1], k.shape[1], device=q.device), -math.inf)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse))
    out = torch.einsum("bhst,bthd->bshd", probs, vf)
    dv = torch.einsum("bhst,bshd->bthd", probs, dof)
    dp = torch.einsum("bshd,bthd->bhst", dof, vf)
    delta = (dof * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    ds = probs * (dp - delta) * scale
    dq = torch.einsum("bhst,bthd->bshd", ds, kf)
    dk = torch.einsum("bhst,bshd->bthd", ds, qf)
    b, sk, d = k.shape[0], k.shape[1], k.shape[3]
    dk = dk.reshape(b, sk, heads_k, group, d).sum(3)
    dv = dv.reshape(b, sk, heads_k, group, d).sum(3)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()
