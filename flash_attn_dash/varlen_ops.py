"""torch custom ops of varlen attention: ``flash_attn_dash::varlen_fwd`` and ``flash_attn_dash::varlen_bwd``.

CPU tensors run the reference (one dense reference call per sequence, :mod:`.varlen_per_sequence`); CUDA tensors run
:mod:`.varlen_cuda`. The fake implementations let ``torch.compile(fullgraph=True)`` trace them. The values of
``cu_seqlens_*``/``seqused_*`` are checked inside the ops, where they are read: a traced graph has no values to read.
The features (``window_size_left``, ``window_size_right``, ``softcap``, ``learnable_sink``) trail with their
defaults as in the dense ops (:mod:`.ops`), and ``varlen_bwd`` returns ``(dq, dk, dv, dsink)`` likewise, dsink summed
over every sequence's rows.
"""
from __future__ import annotations

import torch

from . import checks, features, varlen_cuda, varlen_per_sequence
from .varlen_layout import read_layout


@torch.library.custom_op("flash_attn_dash::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    softmax_scale: float,
    causal: bool,
    sm_margin: int,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed forward: out (total_q, heads, dv) in q's dtype (dv: v's head dim) and lse (heads, total_q) fp32, natural log (the sink
    included)."""
    window_size = (window_size_left, window_size_right)
    if q.is_cuda:
        return varlen_cuda.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                   seqused_k, softmax_scale, causal, sm_margin, window_size, softcap, learnable_sink)
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    return varlen_per_sequence.forward(q, k, v, seqs, softmax_scale, causal, sm_margin, window_size=window_size,
                                       softcap=softcap, learnable_sink=learnable_sink)


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal,
      sm_margin, window_size_left=-1, window_size_right=-1, softcap=0.0, learnable_sink=None):
    return q.new_empty(checks.out_shape(q, v)), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def varlen_backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None, softmax_scale: float,
                         causal: bool, deterministic: bool, schedule: str, sm_margin: int, *,
                         window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                         learnable_sink: torch.Tensor | None = None, dsink: torch.Tensor | None = None) -> None:
    """Write every row of the gradients ``dq``/``dk``/``dv`` (shaped like q, k, v; possibly views of one packed
    buffer; they may hold anything) on any device: zeros on rows no used query or key covers. With a sink, the
    zero-initialised ``dsink`` (heads,) fp32, if given, receives its gradient summed over every sequence's rows."""
    if q.is_cuda:
        varlen_cuda.backward_into(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal, deterministic, schedule,
                                  sm_margin, window_size, softcap, learnable_sink, dsink)
        return
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    varlen_per_sequence.backward_into(dout, q, k, v, out, lse, dq, dk, dv, seqs, softmax_scale, causal, deterministic,
                                      schedule, sm_margin, window_size=window_size, softcap=softcap,
                                      learnable_sink=learnable_sink, dsink=dsink,
                                      pack_window=features.kernel_window(causal, window_size, max_seqlen_q,
                                                                         max_seqlen_k)[1])


@torch.library.custom_op("flash_attn_dash::varlen_bwd", mutates_args=())
def varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed backward: (dq, dk, dv) shaped like (q, k, v) in their dtype, zero on rows no used query or key covers;
    and dsink (:func:`.features.sink_grad_buffer`)."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # every row written
    dsink = features.sink_grad_buffer(learnable_sink, q)
    varlen_backward_into(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         seqused_q, seqused_k, softmax_scale, causal, deterministic, schedule, sm_margin,
                         window_size=(window_size_left, window_size_right), softcap=softcap,
                         learnable_sink=learnable_sink, dsink=dsink)
    return dq, dk, dv, dsink


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
      softmax_scale, causal, deterministic, schedule, sm_margin, window_size_left=-1, window_size_right=-1,
      softcap=0.0, learnable_sink=None):
    dsink = features.sink_grad_buffer(learnable_sink, q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink
