"""FlashAttention-compatible packed entry points: q, k, v in one tensor (qkv) or k, v in one (kv), dense and varlen.

q, k and v are strided views of the packed tensor (the kernels take any 16-byte aligned strides), and the backward
writes dq, dk, dv straight into views of one gradient buffer shaped like the packed input, so neither pass copies.
The packing dimension follows the tokens: 2 in the dense (batch, seqlen, ...) layout, 1 in the varlen (total, ...) one.
The features (``window_size``, ``learnable_sink``, ``softcap``) are those of the unpacked entry points; the backward
ops trail them as the unpacked ops do and also return the sink's gradient, ``dsink`` (empty without a sink).
"""
from __future__ import annotations

import torch

from . import checks, features, interface, ops, varlen  # noqa: F401  (interface/varlen define the forward ops)
from .varlen_checks import check_varlen_args, check_varlen_features
from .varlen_ops import varlen_backward_into

_DENSE, _VARLEN = 2, 1  # the packing dimension of each layout
_TOKENS = {_DENSE: "batch, seqlen", _VARLEN: "total"}


def split_qkv(qkv: torch.Tensor, num_heads_q: int | None,
              dim: int = _DENSE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views q, k, v of ``qkv``: (..., 3, heads, head_dim), or (..., num_heads_q + 2 * heads_k, head_dim) holding q's
    heads, then k's, then v's when num_heads_q is given; ``dim`` is the packing dimension."""
    if num_heads_q is None:
        return qkv.select(dim, 0), qkv.select(dim, 1), qkv.select(dim, 2)
    heads_k = (qkv.shape[dim] - num_heads_q) // 2
    return (qkv.narrow(dim, 0, num_heads_q), qkv.narrow(dim, num_heads_q, heads_k),
            qkv.narrow(dim, num_heads_q + heads_k, heads_k))


def split_kv(kv: torch.Tensor, dim: int = _DENSE) -> tuple[torch.Tensor, torch.Tensor]:
    """Views k, v of ``kv`` (..., 2, heads_k, head_dim)."""
    return kv.select(dim, 0), kv.select(dim, 1)


def _check_qkv(qkv: object, num_heads_q: object, dim: int) -> tuple[str, str, str]:
    """Validate the packed layout; return the names errors give the q, k, v views."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    tokens = _TOKENS[dim]
    if num_heads_q is None:
        if qkv.dim() != dim + 3 or qkv.shape[dim] != 3:
            raise ValueError(f"qkv must be ({tokens}, 3, heads, head_dim), or ({tokens}, num_heads_q + 2 * heads_k, "
                             f"head_dim) with num_heads_q given; got shape {tuple(qkv.shape)}")
        return tuple(f"qkv[{', '.join([':'] * dim)}, {i}]" for i in range(3))  # type: ignore[return-value]
    if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int):
        raise TypeError(f"num_heads_q must be an int or None, got {type(num_heads_q).__name__}")
    if qkv.dim() != dim + 2:
        raise ValueError(f"with num_heads_q, qkv must be ({tokens}, num_heads_q + 2 * heads_k, head_dim), "
                         f"got shape {tuple(qkv.shape)}")
    rest = qkv.shape[dim] - num_heads_q
    if num_heads_q < 1 or rest < 2 or rest % 2 != 0 or num_heads_q % (rest // 2) != 0:
        raise ValueError(f"num_heads_q ({num_heads_q}) must leave qkv.shape[{dim}] ({qkv.shape[dim]}) = num_heads_q + "
                         "2 * heads_k with heads_k >= 1 dividing num_heads_q")
    return "qkv (q heads)", "qkv (k heads)", "qkv (v heads)"


def _check_kv_head_dim(q: object, kv: torch.Tensor) -> None:
    """kv packs k and v with one head dim, which must be q's: a v head dim of its own (MLA) needs k and v apart."""
    if isinstance(q, torch.Tensor) and q.dim() > 0 and kv.shape[-1] != q.shape[-1]:
        raise ValueError(f"kv.shape[-1] (the head_dim of k and v) must equal q.shape[-1] = {q.shape[-1]}, got "
                         f"{kv.shape[-1]}: kv packs k and v with one head dim, so a v head dim of its own (MLA's "
                         "(192, 128)) needs flash_attn_func / flash_attn_varlen_func with separate k and v")


def _check_kv(kv: object, dim: int) -> tuple[str, str]:
    """Validate the packed layout; return the names errors give the k, v views."""
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() != dim + 3 or kv.shape[dim] != 2:
        tokens = "batch, seqlen_k" if dim == _DENSE else "total_k"
        raise ValueError(f"kv must be ({tokens}, 2, heads_k, head_dim), got shape {tuple(kv.shape)}")
    return tuple(f"kv[{', '.join([':'] * dim)}, {i}]" for i in range(2))  # type: ignore[return-value]


# Backward ops: one gradient buffer per packed argument, dq/dk/dv written into its views.

@torch.library.custom_op("flash_attn_dash::bwd_qkvpacked", mutates_args=())
def bwd_qkvpacked(dout: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  num_heads_q: int | None, softmax_scale: float, causal: bool, deterministic: bool, schedule: str,
                  sm_margin: int, window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
                  learnable_sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the dense qkv-packed attention: dqkv shaped like qkv, and dsink."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    dsink = features.sink_grad_buffer(learnable_sink, qkv)
    ops.backward_into(dout, *split_qkv(qkv, num_heads_q), out, lse, *split_qkv(dqkv, num_heads_q), softmax_scale,
                      causal, deterministic, schedule, sm_margin, window_size=(window_size_left, window_size_right),
                      softcap=softcap, learnable_sink=learnable_sink, dsink=dsink)
    return dqkv, dsink


@bwd_qkvpacked.register_fake
def _(dout, qkv, out, lse, num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin,
      window_size_left=-1, window_size_right=-1, softcap=0.0, learnable_sink=None):
    return qkv.new_empty(qkv.shape), features.sink_grad_buffer(learnable_sink, qkv)


@torch.library.custom_op("flash_attn_dash::bwd_kvpacked", mutates_args=())
def bwd_kvpacked(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 softmax_scale: float, causal: bool, deterministic: bool, schedule: str, sm_margin: int,
                 window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
                 learnable_sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of the dense kv-packed attention: dq, dkv shaped like kv, and dsink."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dkv = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    dsink = features.sink_grad_buffer(learnable_sink, q)
    ops.backward_into(dout, q, *split_kv(kv), out, lse, dq, *split_kv(dkv), softmax_scale, causal, deterministic,
                      schedule, sm_margin, window_size=(window_size_left, window_size_right), softcap=softcap,
                      learnable_sink=learnable_sink, dsink=dsink)
    return dq, dkv, dsink


@bwd_kvpacked.register_fake
def _(dout, q, kv, out, lse, softmax_scale, causal, deterministic, schedule, sm_margin, window_size_left=-1,
      window_size_right=-1, softcap=0.0, learnable_sink=None):
    return q.new_empty(q.shape), kv.new_empty(kv.shape), features.sink_grad_buffer(learnable_sink, q)


@torch.library.custom_op("flash_attn_dash::varlen_bwd_qkvpacked", mutates_args=())
def varlen_bwd_qkvpacked(dout: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                         cu_seqlens: torch.Tensor, max_seqlen: int, num_heads_q: int | None, softmax_scale: float,
                         causal: bool, deterministic: bool, schedule: str, sm_margin: int, window_size_left: int = -1,
                         window_size_right: int = -1, softcap: float = 0.0,
                         learnable_sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the varlen qkv-packed attention: dqkv shaped like qkv, zero on rows of no sequence's work, and
    dsink."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)  # every row written (varlen_backward_into)
    dsink = features.sink_grad_buffer(learnable_sink, qkv)
    varlen_backward_into(dout, *split_qkv(qkv, num_heads_q, _VARLEN), out, lse,
                         *split_qkv(dqkv, num_heads_q, _VARLEN), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, None,
                         None, softmax_scale, causal, deterministic, schedule, sm_margin,
                         window_size=(window_size_left, window_size_right), softcap=softcap,
                         learnable_sink=learnable_sink, dsink=dsink)
    return dqkv, dsink


@varlen_bwd_qkvpacked.register_fake
def _(dout, qkv, out, lse, cu_seqlens, max_seqlen, num_heads_q, softmax_scale, causal, deterministic, schedule,
      sm_margin, window_size_left=-1, window_size_right=-1, softcap=0.0, learnable_sink=None):
    return qkv.new_empty(qkv.shape), features.sink_grad_buffer(learnable_sink, qkv)


@torch.library.custom_op("flash_attn_dash::varlen_bwd_kvpacked", mutates_args=())
def varlen_bwd_kvpacked(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                        softmax_scale: float, causal: bool, deterministic: bool, schedule: str, sm_margin: int,
                        window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
                        learnable_sink: torch.Tensor | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of the varlen kv-packed attention: dq, dkv shaped like kv, and dsink."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row written (varlen_backward_into)
    dkv = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    dsink = features.sink_grad_buffer(learnable_sink, q)
    varlen_backward_into(dout, q, *split_kv(kv, _VARLEN), out, lse, dq, *split_kv(dkv, _VARLEN), cu_seqlens_q,
                         cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None, softmax_scale, causal, deterministic,
                         schedule, sm_margin, window_size=(window_size_left, window_size_right), softcap=softcap,
                         learnable_sink=learnable_sink, dsink=dsink)
    return dq, dkv, dsink


@varlen_bwd_kvpacked.register_fake
def _(dout, q, kv, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      deterministic, schedule, sm_margin, window_size_left=-1, window_size_right=-1, softcap=0.0, learnable_sink=None):
    return q.new_empty(q.shape), kv.new_empty(kv.shape), features.sink_grad_buffer(learnable_sink, q)


# Autograd: the forward runs the dense or varlen forward op on the views; the backward the matching op above.

# ``feats`` below is ``(window_size_left, window_size_right, softcap)``, the ops' trailing Python values (the sink is
# a tensor input of each Function, saved for its gradient).

class _QKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, learnable_sink, num_heads_q, softmax_scale, causal, feats, deterministic, schedule,
                sm_margin):
        out, lse = torch.ops.flash_attn_dash.fwd(*split_qkv(qkv, num_heads_q), softmax_scale, causal, sm_margin,
                                                 *feats, learnable_sink)
        ctx.save_for_backward(qkv, out, lse, learnable_sink)
        ctx.args = (num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin, *feats)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        qkv, out, lse, learnable_sink = ctx.saved_tensors
        dqkv, dsink = torch.ops.flash_attn_dash.bwd_qkvpacked(dout.contiguous(), qkv, out, lse, *ctx.args,
                                                              learnable_sink)
        return (dqkv, features.sink_grad(dsink, learnable_sink)) + (None,) * 7


class _KVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, learnable_sink, softmax_scale, causal, feats, deterministic, schedule, sm_margin):
        out, lse = torch.ops.flash_attn_dash.fwd(q, *split_kv(kv), softmax_scale, causal, sm_margin, *feats,
                                                 learnable_sink)
        ctx.save_for_backward(q, kv, out, lse, learnable_sink)
        ctx.args = (softmax_scale, causal, deterministic, schedule, sm_margin, *feats)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, kv, out, lse, learnable_sink = ctx.saved_tensors
        dq, dkv, dsink = torch.ops.flash_attn_dash.bwd_kvpacked(dout.contiguous(), q, kv, out, lse, *ctx.args,
                                                                learnable_sink)
        return (dq, dkv, features.sink_grad(dsink, learnable_sink)) + (None,) * 6


class _VarlenQKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, learnable_sink, cu_seqlens, max_seqlen, num_heads_q, softmax_scale, causal, feats,
                deterministic, schedule, sm_margin):
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(*split_qkv(qkv, num_heads_q, _VARLEN), cu_seqlens, cu_seqlens,
                                                        max_seqlen, max_seqlen, None, None, softmax_scale, causal,
                                                        sm_margin, *feats, learnable_sink)
        ctx.save_for_backward(qkv, out, lse, cu_seqlens, learnable_sink)
        ctx.args = (max_seqlen, num_heads_q, softmax_scale, causal, deterministic, schedule, sm_margin, *feats)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        qkv, out, lse, cu_seqlens, learnable_sink = ctx.saved_tensors
        dqkv, dsink = torch.ops.flash_attn_dash.varlen_bwd_qkvpacked(dout.contiguous(), qkv, out, lse, cu_seqlens,
                                                                     *ctx.args, learnable_sink)
        return (dqkv, features.sink_grad(dsink, learnable_sink)) + (None,) * 9


class _VarlenKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, learnable_sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                causal, feats, deterministic, schedule, sm_margin):
        cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(q, *split_kv(kv, _VARLEN), cu_seqlens_q, cu_seqlens_k,
                                                        max_seqlen_q, max_seqlen_k, None, None, softmax_scale, causal,
                                                        sm_margin, *feats, learnable_sink)
        ctx.save_for_backward(q, kv, out, lse, cu_seqlens_q, cu_seqlens_k, learnable_sink)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic, schedule, sm_margin, *feats)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, kv, out, lse, cu_seqlens_q, cu_seqlens_k, learnable_sink = ctx.saved_tensors
        dq, dkv, dsink = torch.ops.flash_attn_dash.varlen_bwd_kvpacked(dout.contiguous(), q, kv, out, lse,
                                                                       cu_seqlens_q, cu_seqlens_k, *ctx.args,
                                                                       learnable_sink)
        return (dq, dkv, features.sink_grad(dsink, learnable_sink)) + (None,) * 10


def _result(out: torch.Tensor, lse: torch.Tensor, return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return (out, lse) if return_lse else out


def _dense_features(causal: bool, window_size: object, softcap: object, learnable_sink: object, schedule: str,
                    shape: checks.AttnShape, like: torch.Tensor) -> tuple[int, int, float]:
    """The feature checks of a dense packed call (:func:`.features.check_features`, on ``like``'s device) as the
    Functions' ``feats``."""
    window, cap = features.check_features(causal, window_size, softcap, learnable_sink, schedule, shape.heads,
                                          shape.seqlen_q, shape.seqlen_k, like)
    return (*window, cap)


def _varlen_features(causal: bool, window_size: object, softcap: object, learnable_sink: object, schedule: str,
                     heads: int, max_seqlen_q: int, max_seqlen_k: int, like: torch.Tensor) -> tuple[int, int, float]:
    """The feature checks of a varlen packed call (:func:`.varlen_checks.check_varlen_features`) as ``feats``."""
    window, cap = check_varlen_features(causal, window_size, softcap, learnable_sink, schedule, heads, max_seqlen_q,
                                        max_seqlen_k, like)
    return (*window, cap)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    num_heads_q: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_func` on one packed tensor (self-attention), as FlashAttention-3's. q, k and v
    share one head dim (a v head dim of its own, MLA's, needs ``flash_attn_func``).

    Args:
        qkv: (batch, seqlen, 3, heads, head_dim); or, with ``num_heads_q``, (batch, seqlen, num_heads_q +
            2 * heads_k, head_dim) holding q's heads, then k's, then v's (GQA/MQA).
        num_heads_q: q's head count in the 4-D GQA layout; None for the 5-D layout.
        softmax_scale, causal, window_size, learnable_sink, softcap, deterministic, schedule, sm_margin, return_lse:
            as in ``flash_attn_func`` (``learnable_sink`` has one logit per q head).

    Returns:
        out (batch, seqlen, heads_q, head_dim), or (out, lse) if return_lse. The gradient reaching ``qkv`` is one
        buffer shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    names = _check_qkv(qkv, num_heads_q, _DENSE)
    shape = checks.check_tensors(*split_qkv(qkv, num_heads_q), names=names)
    feats = _dense_features(causal, window_size, softcap, learnable_sink, schedule, shape, qkv)
    out, lse = _QKVPackedFunc.apply(qkv, learnable_sink, num_heads_q,
                                    checks.softmax_scale_or_default(shape.head_dim, softmax_scale), causal, feats,
                                    checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return _result(out, lse, return_lse)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_func` with k and v packed in one tensor, as FlashAttention-2's: one head dim
    for q, k and v (a v head dim of its own, MLA's, needs ``flash_attn_func``; ValueError names it).

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        kv: (batch, seqlen_k, 2, heads_k, head_dim); heads % heads_k == 0 gives GQA/MQA.
        softmax_scale, causal, window_size, learnable_sink, softcap, deterministic, schedule, sm_margin, return_lse:
            as in ``flash_attn_func``.

    Returns:
        out (batch, seqlen_q, heads, head_dim), or (out, lse) if return_lse. The gradient reaching ``kv`` is one
        buffer shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    names = _check_kv(kv, _DENSE)
    _check_kv_head_dim(q, kv)
    shape = checks.check_tensors(q, *split_kv(kv), names=("q",) + names)
    feats = _dense_features(causal, window_size, softcap, learnable_sink, schedule, shape, q)
    scale = checks.softmax_scale_or_default(shape.head_dim, softmax_scale)
    out, lse = _KVPackedFunc.apply(q, kv, learnable_sink, scale, causal, feats,
                                   checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return _result(out, lse, return_lse)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    num_heads_q: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_varlen_func` on one packed tensor (self-attention), as FlashAttention-2's;
    one head dim for q, k and v.

    Args:
        qkv: (total, 3, heads, head_dim); or, with ``num_heads_q``, (total, num_heads_q + 2 * heads_k, head_dim).
        cu_seqlens: int32 (batch + 1,) offsets of the sequences, for queries and keys alike.
        max_seqlen: a bound of every sequence's length.
        num_heads_q, softmax_scale, causal, window_size, learnable_sink, softcap, deterministic, schedule,
            sm_margin, return_lse: as in ``flash_attn_qkvpacked_func`` / ``flash_attn_varlen_func``.

    Returns:
        out (total, heads_q, head_dim), or (out, lse (heads_q, total)) if return_lse. The gradient reaching ``qkv``
        is one buffer shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    names = _check_qkv(qkv, num_heads_q, _VARLEN)
    shape = check_varlen_args(*split_qkv(qkv, num_heads_q, _VARLEN), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                              None, None, names=names)
    feats = _varlen_features(causal, window_size, softcap, learnable_sink, schedule, shape.heads, max_seqlen,
                             max_seqlen, qkv)
    out, lse = _VarlenQKVPackedFunc.apply(qkv, learnable_sink, cu_seqlens, max_seqlen, num_heads_q,
                                          checks.softmax_scale_or_default(shape.head_dim, softmax_scale), causal,
                                          feats, checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return _result(out, lse, return_lse)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_dash.flash_attn_varlen_func` with k and v packed in one tensor, as FlashAttention-2's: one
    head dim for q, k and v (ValueError names a v head dim of its own, which needs ``flash_attn_varlen_func``).

    Args:
        q: (total_q, heads, head_dim).
        kv: (total_k, 2, heads_k, head_dim).
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
            learnable_sink, softcap, deterministic, schedule, sm_margin, return_lse: as in
            ``flash_attn_varlen_func``.

    Returns:
        out (total_q, heads, head_dim), or (out, lse) if return_lse. The gradient reaching ``kv`` is one buffer
        shaped like it.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    names = _check_kv(kv, _VARLEN)
    _check_kv_head_dim(q, kv)
    shape = check_varlen_args(q, *split_kv(kv, _VARLEN), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              None, None, names=("q",) + names)
    feats = _varlen_features(causal, window_size, softcap, learnable_sink, schedule, shape.heads, max_seqlen_q,
                             max_seqlen_k, q)
    out, lse = _VarlenKVPackedFunc.apply(q, kv, learnable_sink, cu_seqlens_q,
                                         varlen.k_offsets_arg(cu_seqlens_q, cu_seqlens_k), max_seqlen_q, max_seqlen_k,
                                         checks.softmax_scale_or_default(shape.head_dim, softmax_scale), causal,
                                         feats, checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return _result(out, lse, return_lse)
