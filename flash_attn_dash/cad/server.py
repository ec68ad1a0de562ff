"""What an attention server runs: one dense kernel call per chunk, in its plan's canonical task order.

Each task reads rows of the server's receive buffers (see :class:`flash_attn_dash.cad.plan.Task`) and goes
through the public ops ``torch.ops.flash_attn_dash.fwd`` / ``bwd``, so CPU tensors run the PyTorch reference
and CUDA tensors the sm90 kernels. A chunk [a, e) against the K/V prefix [0, e) is a dense causal call with
seqlen_q = e - a and seqlen_k = e (the mask is aligned bottom-right).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import ops  # noqa: F401  (registers torch.ops.flash_attn_dash)
from .plan import Task

# The dQ order of "descending" depends neither on the grid nor on the batch, so a chunk's dQ has the same bits
# whichever server computes it and whatever else that server runs.
SCHEDULE = "descending"


def _rows(buf: torch.Tensor, offset: int, rows: int) -> torch.Tensor:
    return buf[offset:offset + rows].unsqueeze(0)  # (1, rows, heads, d): a contiguous view


def forward_tasks(tasks: Sequence[Task], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                  causal: bool, sm_margin: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Attention output (rows, heads, d) of a server's Q buffer, and each task's LSE (1, heads, rows_t)."""
    out = torch.empty_like(q)
    lses = []
    for t in tasks:
        rows = t.end - t.start
        o, lse = torch.ops.flash_attn_dash.fwd(_rows(q, t.q_offset, rows), _rows(k, t.kv_offset, t.kv_rows),
                                               _rows(v, t.kv_offset, t.kv_rows), softmax_scale, causal, sm_margin)
        out[t.q_offset:t.q_offset + rows] = o[0]
        lses.append(lse)
    return out, lses


def backward_tasks(tasks: Sequence[Task], dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lses: Sequence[torch.Tensor], softmax_scale: float, causal: bool,
                   deterministic: bool, sm_margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dQ (rows, heads, d) of a server's Q buffer and the tasks' dK/dV partials (partial rows, 2, heads_kv, d).

    Partials stay separate (task t at ``t.partial_offset``): summing them here would make the result depend
    on which chunks share a server.
    """
    dq = torch.empty_like(q)
    partials = k.new_empty((sum(t.kv_rows for t in tasks), 2, *k.shape[1:]))
    for t, lse in zip(tasks, lses):
        rows = t.end - t.start
        dq_t, dk_t, dv_t, _ = torch.ops.flash_attn_dash.bwd(
            _rows(dout, t.q_offset, rows), _rows(q, t.q_offset, rows), _rows(k, t.kv_offset, t.kv_rows),
            _rows(v, t.kv_offset, t.kv_rows), _rows(out, t.q_offset, rows), lse, softmax_scale, causal,
            deterministic, SCHEDULE, sm_margin)
        dq[t.q_offset:t.q_offset + rows] = dq_t[0]
        partials[t.partial_offset:t.partial_offset + t.kv_rows, 0] = dk_t[0]
        partials[t.partial_offset:t.partial_offset + t.kv_rows, 1] = dv_t[0]
    return dq, partials
