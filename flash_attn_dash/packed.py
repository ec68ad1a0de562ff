"""FlashAttention-compatible packed entry points: ``flash_attn_qkvpacked_func`` and ``flash_attn_kvpacked_func``.

q, k and v are strided views of the packed tensor (the kernels take any 16-byte aligned strides), and the backward
writes dq, dk, dv straight into views of one gradient buffer shaped like the packed input, so neither pass copies.
"""
from __future__ import annotations

import torch

from . import checks, ops
from . import interface  # noqa: F401  (loads the extension and the fwd op)


def split_qkv(qkv: torch.Tensor, num_heads_q: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views q, k, v of ``qkv``: (b, s, 3, h, d), or (b, s, num_heads_q + 2 * heads_k, d) when num_heads_q is given."""
    if num_heads_q is None:
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    heads_k = (qkv.shape[2] - num_heads_q) // 2
    return (qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + heads_k],
            qkv[:, :, num_heads_q + heads_k:])


def _check_qkv(qkv: torch.Tensor, num_heads_q: int | None) -> None:
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if num_heads_q is None:
        if qkv.dim() != 5 or qkv.shape[2] != 3:
            raise ValueError("qkv must be (batch, seqlen, 3, heads, head_dim), or (batch, seqlen, num_heads_q + "
                             f"2 * heads_k, head_dim) with num_heads_q given; got shape {tuple(qkv.shape)}")
        return
    if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int):
        raise TypeError(f"num_heads_q must be an int or None, got {type(num_heads_q).__name__}")
    if qkv.dim() != 4:
        raise ValueError("with num_heads_q, qkv must be (batch, seqlen, num_heads_q + 2 * heads_k, head_dim), "
                         f"got shape {tuple(qkv.shape)}")
    rest = qkv.shape[2] - num_heads_q
    if num_heads_q < 1 or rest < 2 or rest % 2 != 0 or num_heads_q % (rest // 2) != 0:
        raise ValueError(f"num_heads_q ({num_heads_q}) must leave qkv.shape[2] ({qkv.shape[2]}) = num_heads_q + "
                         "2 * heads_k with heads_k >= 1 dividing num_heads_q")


def _check_kv(kv: torch.Tensor) -> None:
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be (batch, seqlen_k, 2, heads_k, head_dim), got shape {tuple(kv.shape)}")


@torch.library.custom_op("flash_attn_dash::bwd_qkvpacked", mutates_args=())
def bwd_qkvpacked(dout: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  num_heads_q: int | None, softmax_scale: float, causal: bool, deterministic: bool, schedule: str,
                  sm_margin: int) -> torch.Tensor:
    """Backward of the qkv-packed attention: dqkv shaped like qkv, dq/dk/dv written into its views."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    ops.backward_into(dout, *split_qkv(qkv, num_heads_q), out, lse, *split_qkv(dqkv, num_heads_q), softmax_scale,
                      causal, deterministic, schedule, sm_margin)
    return dqkv


@bwd_qkvpacked.register_fake
def _(dout, qkv, out, lse, num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin):
    return qkv.new_empty(qkv.shape)


@torch.library.custom_op("flash_attn_dash::bwd_kvpacked", mutates_args=())
def bwd_kvpacked(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 softmax_scale: float, causal: bool, deterministic: bool, schedule: str,
                 sm_margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the kv-packed attention: dq, and dkv shaped like kv with dk/dv written into its views."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dkv = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    ops.backward_into(dout, q, kv[:, :, 0], kv[:, :, 1], out, lse, dq, dkv[:, :, 0], dkv[:, :, 1], softmax_scale,
                      causal, deterministic, schedule, sm_margin)
    return dq, dkv


@bwd_kvpacked.register_fake
def _(dout, q, kv, out, lse, softmax_scale, causal, deterministic, schedule, sm_margin):
    return q.new_empty(q.shape), kv.new_empty(kv.shape)


class _QKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin):
        out, lse = torch.ops.flash_attn_dash.fwd(*split_qkv(qkv, num_heads_q), softmax_scale, causal, sm_margin)
        ctx.save_for_backward(qkv, out, lse)
        ctx.args = (num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        qkv, out, lse = ctx.saved_tensors
        dqkv = torch.ops.flash_attn_dash.bwd_qkvpacked(dout.contiguous(), qkv, out, lse, *ctx.args)
        return dqkv, None, None, None, None, None, None


class _KVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, softmax_scale, causal, deterministic, schedule, sm_margin):
        out, lse = torch.ops.flash_attn_dash.fwd(q, kv[:, :, 0], kv[:, :, 1], softmax_scale, causal, sm_margin)
        ctx.save_for_backward(q, kv, out, lse)
        ctx.args = (softmax_scale, causal, deterministic, schedule, sm_margin)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, kv, out, lse = ctx.saved_tensors
        dq, dkv = torch.ops.flash_attn_dash.bwd_kvpacked(dout.contiguous(), q, kv, out, lse, *ctx.args)
        return dq, dkv, None, None, None, None, None


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    num_heads_q: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_func` on one packed tensor (self-attention), as FlashAttention-3's.

    Args:
        qkv: (batch, seqlen, 3, heads, head_dim); or, with ``num_heads_q``, (batch, seqlen, num_heads_q +
            2 * heads_k, head_dim) holding q's heads, then k's, then v's (GQA/MQA).
        num_heads_q: q's head count in the 4-D GQA layout; None for the 5-D layout.
        softmax_scale, causal, deterministic, schedule, sm_margin, return_lse: as in ``flash_attn_func``.

    Returns:
        out (batch, seqlen, heads_q, head_dim), or (out, lse) if return_lse. The gradient reaching ``qkv`` is one
        buffer shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    _check_qkv(qkv, num_heads_q)
    names = ("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]") if num_heads_q is None else ("qkv", "qkv", "qkv")
    shape = checks.check_tensors(*split_qkv(qkv, num_heads_q), names=names)
    scale = checks.softmax_scale_or_default(shape.head_dim, softmax_scale)
    out, lse = _QKVPackedFunc.apply(qkv, num_heads_q, scale, causal, checks.resolve_deterministic(deterministic),
                                    schedule, sm_margin)
    return (out, lse) if return_lse else out


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_func` with k and v packed in one tensor, as FlashAttention-2's.

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        kv: (batch, seqlen_k, 2, heads_k, head_dim); heads % heads_k == 0 gives GQA/MQA.
        softmax_scale, causal, deterministic, schedule, sm_margin, return_lse: as in ``flash_attn_func``.

    Returns:
        out (batch, seqlen_q, heads, head_dim), or (out, lse) if return_lse. The gradient reaching ``kv`` is one
        buffer shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    _check_kv(kv)
    shape = checks.check_tensors(q, kv[:, :, 0], kv[:, :, 1], names=("q", "kv[:, :, 0]", "kv[:, :, 1]"))
    scale = checks.softmax_scale_or_default(shape.head_dim, softmax_scale)
    out, lse = _KVPackedFunc.apply(q, kv, scale, causal, checks.resolve_deterministic(deterministic), schedule,
                                   sm_margin)
    return (out, lse) if return_lse else out
