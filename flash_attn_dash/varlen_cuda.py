"""The CUDA implementation of the varlen ops: interim, one dense kernel call per sequence.

The varlen ops (:mod:`.varlen_ops`) call nothing else on CUDA tensors, so the varlen kernels replace :func:`forward`
and :func:`backward_into` here and nothing else changes. Until then, limitations they will remove:

* reading ``cu_seqlens_*``/``seqused_*`` costs one device-to-host copy (a stream sync) per forward and per backward
  (:func:`.varlen_layout.read_layout`), so a varlen call cannot be captured in a CUDA graph;
* every sequence is its own forward and backward launch, so many short sequences are launch-bound.
Bits do not change when the kernels land: each sequence already runs the order the varlen kernels must give it
(:func:`.launch.sequence_launch`).
"""
from __future__ import annotations

import torch

from . import features, ops, varlen_per_sequence
from .varlen_layout import read_layout


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
           window_size: tuple[int, int], softcap: float, has_sink: bool, sm_margin: int) -> None:
    """Before the first launch: the features the kernels lack and the dense kernels' constraints on the packed tensors
    (every sequence's view shares their strides and alignment). Each sequence's dense call then takes ``(causal,
    window_size)`` as given, so it runs what flash_attn_func runs for that sequence alone (the reproducibility
    contract); a side that clips nothing at the maximum lengths clips nothing in any sequence (FlashAttention-3)."""
    features.kernel_mask(causal, window_size, softcap, max_seqlen_q, max_seqlen_k, has_sink=has_sink)
    ops.check_cuda_inputs(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), sm_margin)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, seqused_q: torch.Tensor | None,
            seqused_k: torch.Tensor | None, softmax_scale: float, causal: bool, sm_margin: int,
            window_size: tuple[int, int], softcap: float,
            learnable_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_dash::varlen_fwd`` on CUDA tensors."""
    _check(q, k, v, max_seqlen_q, max_seqlen_k, causal, window_size, softcap, learnable_sink is not None, sm_margin)
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    return varlen_per_sequence.forward(q, k, v, seqs, softmax_scale, causal, sm_margin, window_size=window_size,
                                       softcap=softcap, learnable_sink=learnable_sink)


def backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, seqused_q: torch.Tensor | None,
                  seqused_k: torch.Tensor | None, softmax_scale: float, causal: bool, deterministic: bool,
                  schedule: str, sm_margin: int, window_size: tuple[int, int], softcap: float,
                  learnable_sink: torch.Tensor | None, dsink: torch.Tensor | None = None) -> None:
    """``flash_attn_dash::varlen_bwd`` on CUDA tensors, into zero-filled gradients (and ``dsink``, zero-filled, with
    a sink)."""
    _check(q, k, v, max_seqlen_q, max_seqlen_k, causal, window_size, softcap, learnable_sink is not None, sm_margin)
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    varlen_per_sequence.backward_into(dout, q, k, v, out, lse, dq, dk, dv, seqs, softmax_scale, causal, deterministic,
                                      schedule, sm_margin, window_size=window_size, softcap=softcap,
                                      learnable_sink=learnable_sink, dsink=dsink)
