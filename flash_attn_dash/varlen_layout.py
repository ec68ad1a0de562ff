"""Where each packed sequence lies: its used query and key rows, read from ``cu_seqlens_*`` and ``seqused_*``.

Reading them needs their values on the host. On CPU tensors that is free; on CUDA tensors :func:`read_layout` makes
one device-to-host copy (a stream sync) per call: the cost of the per-sequence CUDA path (:mod:`.varlen_cuda`),
which the varlen kernels, reading the offsets on the device, do not pay.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .varlen_checks import check_layout_values


@dataclass(frozen=True)
class PackedSequence:
    """Rows ``q_start .. q_start + q_len - 1`` of q attend to rows ``k_start .. k_start + k_len - 1`` of k and v
    (the used tokens: ``seqused_*`` where given, else the whole sequence)."""

    q_start: int
    q_len: int
    k_start: int
    k_len: int

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_start + self.q_len)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_start + self.k_len)

    @property
    def has_work(self) -> bool:
        """False when no query sees a key: the sequence's rows keep out = 0, lse = -inf, gradients 0."""
        return self.q_len > 0 and self.k_len > 0


def read_layout(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None, total_q: int,
                total_k: int) -> list[PackedSequence]:
    """The packed sequences, in order, after checking the values (:func:`.varlen_checks.check_layout_values`).

    The four index tensors travel to the host as one tensor: one device-to-host copy on CUDA.
    """
    present = {name: t for name, t in (("cu_q", cu_seqlens_q), ("cu_k", cu_seqlens_k), ("used_q", seqused_q),
                                       ("used_k", seqused_k)) if t is not None}
    flat, host, start = torch.cat(list(present.values())).tolist(), {}, 0
    for name, t in present.items():
        host[name], start = flat[start:start + t.numel()], start + t.numel()
    len_q = check_layout_values("q", host["cu_q"], total_q, max_seqlen_q, host.get("used_q"))
    len_k = check_layout_values("k", host["cu_k"], total_k, max_seqlen_k, host.get("used_k"))
    used_q, used_k = host.get("used_q", len_q), host.get("used_k", len_k)
    # zip stops after the last sequence: cu_seqlens_* have one entry more than the batch.
    return [PackedSequence(q0, nq, k0, nk) for q0, nq, k0, nk in zip(host["cu_q"], used_q, host["cu_k"], used_k)]
