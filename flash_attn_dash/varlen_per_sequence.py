"""Varlen attention as one dense call per packed sequence, on batch-1 views of the packed tensors.

Each sequence with work runs through the dense forward op ``flash_attn_dash::fwd`` (results copied into the packed
outputs) and the dense backward (:func:`.ops.backward_into`, writing into the packed gradients' rows); every other row
keeps out = 0, lse = -inf (lse = sink for the queries of a sequence without keys, with a sink) and zero gradients. On
CPU tensors the dense ops run the reference, so this is the varlen reference; on CUDA tensors it runs the requests the
varlen kernels do not (:mod:`.varlen_cuda`), and it is what the kernels' GPU tests hold them to.
"""
from __future__ import annotations

import torch

from . import checks, ops
from .launch import varlen_request
from .varlen_layout import PackedSequence


def _rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows of a packed (total, heads, d) tensor as a dense (1, len, heads, d) view."""
    return t[rows].unsqueeze(0)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: list[PackedSequence], softmax_scale: float,
            causal: bool, sm_margin: int, *, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
            learnable_sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out (total_q, heads, dv) in q's dtype (dv: v's head dim) and lse (heads, total_q) fp32; the window applies to
    each sequence (aligned bottom-right on its used lengths)."""
    out = torch.zeros(checks.out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for s in seqs:
        if s.has_work:
            o, l = torch.ops.flash_attn_dash.fwd(_rows(q, s.q), _rows(k, s.k), _rows(v, s.k), softmax_scale, causal,
                                                 sm_margin, *window_size, softcap, learnable_sink)
            out[s.q] = o[0]
            lse[:, s.q] = l[0]
        elif s.q_len and learnable_sink is not None:
            # Queries without keys see only the sink: out 0 and lse = sink, as the dense reference gives them.
            lse[:, s.q] = learnable_sink.to(torch.float32).unsqueeze(1)
    return out, lse


def backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, seqs: list[PackedSequence],
                  softmax_scale: float, causal: bool, deterministic: bool, schedule: str, sm_margin: int, *,
                  window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  learnable_sink: torch.Tensor | None = None, dsink: torch.Tensor | None = None,
                  pack_window: tuple[int, int] = (-1, -1)) -> None:
    """Write each sequence's gradients into its rows of ``dq``/``dk``/``dv`` (shaped like q, k, v; they may be views
    of one packed buffer and hold anything: they are zero-filled first, as sequences without work write no rows);
    each sequence's backward asks for :func:`.varlen_request`'s order (``pack_window``: the kernels' window at the
    pack's maximum lengths, :func:`.features.kernel_window`). With a sink, each sequence's sink gradient is
    added into the zero-filled ``dsink`` (if given), in pack order."""
    for grad in (dq, dk, dv):
        grad.zero_()
    request = varlen_request(deterministic, schedule, q.shape[-1], pack_window)
    accumulate_sink = learnable_sink is not None and dsink is not None
    for s in seqs:
        if s.has_work:
            # A row slice of the (heads, total_q) lse is strided; the dense kernels take a contiguous one.
            seq_lse = lse[:, s.q].unsqueeze(0).contiguous()
            seq_dsink = torch.zeros_like(dsink) if accumulate_sink else None
            ops.backward_into(_rows(dout, s.q), _rows(q, s.q), _rows(k, s.k), _rows(v, s.k), _rows(out, s.q), seq_lse,
                              _rows(dq, s.q), _rows(dk, s.k), _rows(dv, s.k), softmax_scale, causal, deterministic,
                              request, sm_margin, window_size=window_size, softcap=softcap,
                              learnable_sink=learnable_sink, dsink=seq_dsink)
            if accumulate_sink:
                dsink += seq_dsink
