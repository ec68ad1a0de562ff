"""PyTorch reference attention: the definition every kernel is tested against.

It materialises the (sq, sk) score matrix, so it is for tests and CPU tensors, not for speed.  The features follow
FlashAttention (FA2/3 for the window, FA4 for softcap and learnable sinks):

* ``window_size=(left, right)``: query row i sees key j iff ``i + sk - sq - left <= j <= i + sk - sq + right``, a side
  of -1 being unbounded (:func:`visible_mask`); ``causal=True`` sets ``right = 0``.
* ``softcap`` > 0: scores ``softcap * tanh(softmax_scale * q·k / softcap)``, then the mask.
* ``learnable_sink`` (heads,): one more softmax column per query head with logit ``sink[h]`` (not scaled) and no
  value: it enlarges every row's denominator by ``exp(sink[h])`` and takes its share of the probability away from the
  keys.  ``lse`` includes it, as FlashAttention-4's kernels and reference return it, so a row that sees no key gets
  ``out = 0`` and ``lse = sink[h]`` (without a sink: ``lse = -inf``), and the backward needs only ``lse``:
  ``dsink[h] = -sum over batch and rows of exp(sink[h] - lse) * rowsum(dout * out)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .features import check_softcap
from .schedule.tiles import check_window_size

__all__ = ["RefGrads", "attention_ref", "attention_ref_bwd", "attention_ref_grads", "causal_mask", "visible_mask"]


def visible_mask(seqlen_q: int, seqlen_k: int, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (seqlen_q, seqlen_k) mask of the keys each query row sees, aligned bottom-right.

    Row i sees key j iff ``j >= i + seqlen_k - seqlen_q - left`` (when ``left >= 0``) and ``j <= i + seqlen_k -
    seqlen_q + right`` (when ``right >= 0``), with ``(left, right) = window_size`` and ``right = 0`` if ``causal``
    (FlashAttention's convention).  When seqlen_q > seqlen_k + right the first rows see no key at all.
    """
    left, right = check_window_size(window_size)
    if causal:
        right = 0
    diagonal = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= cols >= diagonal - left
    if right >= 0:
        visible &= cols <= diagonal + right
    return visible


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The causal :func:`visible_mask`: row i sees key j iff ``j <= i + seqlen_k - seqlen_q``."""
    return visible_mask(seqlen_q, seqlen_k, causal=True, device=device)


def _check_features(heads: int, softcap: float, learnable_sink: torch.Tensor | None) -> None:
    check_softcap(softcap)
    if learnable_sink is not None and (not isinstance(learnable_sink, torch.Tensor)
                                       or learnable_sink.shape != (heads,) or not learnable_sink.is_floating_point()):
        got = (f"shape {tuple(learnable_sink.shape)} {learnable_sink.dtype}"
               if isinstance(learnable_sink, torch.Tensor) else repr(learnable_sink))
        raise ValueError(f"learnable_sink must be a floating-point tensor of shape (heads,) = ({heads},), got {got}")


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool, window_size: tuple[int, int],
            softcap: float, compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Masked scores (b, h, sq, sk) in ``compute`` precision (-inf where hidden) and, with a softcap, ``tanh`` of the
    capped argument (its derivative is what the backward needs)."""
    scores = torch.einsum("bshd,bthd->bhst", q, k).to(compute) * scale
    capped = None
    if softcap > 0:
        capped = torch.tanh(scores / softcap)
        scores = softcap * capped
    if causal or tuple(window_size) != (-1, -1):
        scores = scores.masked_fill(~visible_mask(q.shape[1], k.shape[1], causal, window_size, q.device), -math.inf)
    return scores, capped


def _lse(scores: torch.Tensor, learnable_sink: torch.Tensor | None) -> torch.Tensor:
    """Natural log of each row's softmax denominator (b, h, sq), the sink's column included."""
    if learnable_sink is None:
        return torch.logsumexp(scores, dim=-1)
    b, h, sq, _ = scores.shape
    sink = learnable_sink.to(scores.dtype).view(1, h, 1, 1).expand(b, h, sq, 1)
    return torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)


def _probs(scores: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    # Rows with no visible key and no sink have lse = -inf; subtracting 0 there keeps exp(-inf) = 0 and gradients
    # finite.
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(scores - safe_lse.unsqueeze(-1))


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t if t.shape[2] == heads else t.repeat_interleave(heads // t.shape[2], dim=2)


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    upcast: bool = True,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention in the FlashAttention-3 layout, differentiable (also in ``learnable_sink``).

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        k, v: (batch, seqlen_k, heads_k, head_dim) and (batch, seqlen_k, heads_k, head_dim_v) with heads % heads_k
            == 0 (GQA/MQA); v's head dim may differ (MLA).
        softmax_scale: scale of q·kᵀ; default head_dim ** -0.5 (q's head dim).
        causal: mask aligned bottom-right (see :func:`visible_mask`); sets the window's right side to 0.
        upcast: compute in fp32 (fp64 for fp64 inputs) and return ``out`` in that precision (the reference);
            if False the matmuls run in the input dtype and only the softcap and softmax in fp32 (the "same math in
            low precision" baseline of the FlashAttention tolerance rule).
        window_size: ``(left, right)`` sliding window, -1 = unbounded (module docstring).
        softcap: 0 (off) or the cap of ``softcap * tanh(score / softcap)``.
        learnable_sink: None or (heads,) sink logits (module docstring).

    Returns:
        ``(out, lse)``: out (batch, seqlen_q, heads, head_dim_v); lse (batch, heads, seqlen_q) fp32 (fp64 for
        fp64 inputs), natural log of the softmax denominator, the sink included. Rows that see no key give out = 0
        and lse = -inf (lse = sink[h] with a sink).
    """
    window_size = check_window_size(window_size)
    _check_features(q.shape[2], softcap, learnable_sink)
    compute = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs (gradcheck)
    if upcast:
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    k, v = _repeat_kv(k, q.shape[2]), _repeat_kv(v, q.shape[2])
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores, _ = _scores(q, k, scale, causal, window_size, softcap, compute)
    lse = _lse(scores, learnable_sink)
    probs = _probs(scores, lse)
    out = torch.einsum("bhst,bthd->bshd", probs.to(v.dtype), v)
    return out, lse


@dataclass(frozen=True)
class RefGrads:
    """Gradients of :func:`attention_ref`: dq, dk, dv in the input dtypes; dsink (heads,) summed over batch and rows,
    fp32 (fp64 for fp64 inputs), or None without a sink."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dsink: torch.Tensor | None


def attention_ref_grads(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> RefGrads:
    """Explicit fp32 gradients of :func:`attention_ref` (arguments as there).

    The textbook backward: ``dS = P∘(dP − rowsum(dO∘O))``, times ``1 − tanh²`` under a softcap; the sink's column has
    no value, so its ``dP`` is 0 and ``dsink = −Σ P_sink · rowsum(dO∘O)`` with ``P_sink = exp(sink − lse)``.  Custom
    ops run below autograd, so the CPU implementation of ``flash_attn_dash::bwd`` cannot differentiate the forward and
    uses this instead.
    """
    window_size = check_window_size(window_size)
    _check_features(q.shape[2], softcap, learnable_sink)
    compute = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf, dof = (t.to(compute) for t in (q, k, v, dout))
    heads, heads_k = q.shape[2], k.shape[2]
    group = heads // heads_k
    kf, vf = _repeat_kv(kf, heads), _repeat_kv(vf, heads)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores, capped = _scores(qf, kf, scale, causal, window_size, softcap, compute)
    lse = _lse(scores, learnable_sink)
    probs = _probs(scores, lse)
    out = torch.einsum("bhst,bthd->bshd", probs, vf)
    dv = torch.einsum("bhst,bshd->bthd", probs, dof)
    dp = torch.einsum("bshd,bthd->bhst", dof, vf)
    delta = (dof * out).sum(-1).transpose(1, 2)  # (b, h, sq)
    ds = probs * (dp - delta.unsqueeze(-1))
    if capped is not None:
        ds = ds * (1 - capped * capped)
    ds = ds * scale
    dq = torch.einsum("bhst,bthd->bshd", ds, kf)
    dk = torch.einsum("bhst,bshd->bthd", ds, qf)
    b, sk, d = k.shape[0], k.shape[1], k.shape[3]
    dk = dk.reshape(b, sk, heads_k, group, d).sum(3)
    dv = dv.reshape(b, sk, heads_k, group, v.shape[3]).sum(3)
    dsink = None
    if learnable_sink is not None:
        sink_probs = torch.exp(learnable_sink.to(compute).view(1, heads, 1) - lse)
        dsink = -(sink_probs * delta).sum(dim=(0, 2))
    return RefGrads(dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous(), dsink)


def attention_ref_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`attention_ref_grads` (which also gives ``dsink``), in the input dtypes."""
    grads = attention_ref_grads(dout, q, k, v, softmax_scale, causal, window_size=window_size, softcap=softcap,
                                learnable_sink=learnable_sink)
    return grads.dq, grads.dk, grads.dv
