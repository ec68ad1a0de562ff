"""Packed batches for the varlen tests, and the per-sequence reference they are checked against."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from flash_attn_dash.reference import attention_ref


def cu_seqlens(lengths: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


@dataclass
class Pack:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lens_q: list[int]
    lens_k: list[int]
    used_q: list[int] | None = None
    used_k: list[int] | None = None

    def args(self) -> dict:
        """The packing arguments of flash_attn_varlen_func (tight max_seqlen_*)."""
        device = self.q.device
        return dict(cu_seqlens_q=cu_seqlens(self.lens_q, device), cu_seqlens_k=cu_seqlens(self.lens_k, device),
                    max_seqlen_q=max(self.lens_q, default=0) or 1, max_seqlen_k=max(self.lens_k, default=0) or 1,
                    seqused_q=None if self.used_q is None else torch.tensor(self.used_q, dtype=torch.int32,
                                                                            device=device),
                    seqused_k=None if self.used_k is None else torch.tensor(self.used_k, dtype=torch.int32,
                                                                            device=device))

    def spans(self) -> list[tuple[slice, slice]]:
        """Each sequence's used (query rows, key rows)."""
        used_q = self.lens_q if self.used_q is None else self.used_q
        used_k = self.lens_k if self.used_k is None else self.used_k
        starts_q = [0, *itertools.accumulate(self.lens_q)]
        starts_k = [0, *itertools.accumulate(self.lens_k)]
        return [(slice(a, a + n), slice(b, b + m)) for a, n, b, m in zip(starts_q, used_q, starts_k, used_k)]


def make_pack(lens_q: list[int], lens_k: list[int], heads: int = 4, heads_k: int = 2, head_dim: int = 16,
              dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0, used_q: list[int] | None = None,
              used_k: list[int] | None = None, head_dim_v: int | None = None) -> Pack:
    """A pack of random q, k, v (v with ``head_dim_v`` columns, default ``head_dim``)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device).requires_grad_()

    total_q, total_k = sum(lens_q), sum(lens_k)
    return Pack(rand(total_q, heads, head_dim), rand(total_k, heads_k, head_dim),
                rand(total_k, heads_k, head_dim if head_dim_v is None else head_dim_v), list(lens_q), list(lens_k),
                used_q, used_k)


def per_sequence_reference(pack: Pack, dout: torch.Tensor, causal: bool, softmax_scale: float | None = None,
                           learnable_sink: torch.Tensor | None = None, **features):
    """(out, lse, dq, dk, dv, dsink) from attention_ref on each sequence's used rows alone (autograd gradients), with
    attention_ref's ``features`` (window_size, softcap) and sink; dsink sums the sequences' sink gradients (None
    without a sink). Rows no sequence uses hold out 0, lse -inf and zero gradients."""
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    sink = None if learnable_sink is None else learnable_sink.detach().clone().requires_grad_()
    dsink = None if sink is None else torch.zeros_like(sink)
    for rows_q, rows_k in pack.spans():
        leaves = [t[rows].unsqueeze(0).clone().requires_grad_() for t, rows in ((q, rows_q), (k, rows_k),
                                                                               (v, rows_k))]
        o, l = attention_ref(*leaves, softmax_scale=softmax_scale, causal=causal, learnable_sink=sink, **features)
        inputs = leaves if sink is None else leaves + [sink]
        grads = torch.autograd.grad(o, inputs, dout[rows_q].unsqueeze(0).to(o.dtype), allow_unused=True)
        out[rows_q], lse[:, rows_q] = o[0].to(q.dtype), l[0].double()
        for packed, rows, g in zip((dq, dk, dv), (rows_q, rows_k, rows_k), grads):
            if g is not None:
                packed[rows] = g[0].to(packed.dtype)
        if sink is not None and grads[3] is not None:
            dsink += grads[3]
    return out, lse, dq, dk, dv, dsink


# The small GQA pack of the compute-sanitizer scripts (tests/sanitize_fwd.py, tests/sanitize_bwd.py): an empty
# sequence, queries without keys, ragged and one-block lengths, sq != sk.
SANITIZE_LENS_Q, SANITIZE_LENS_K = [0, 1, 300, 129, 64, 700], [5, 0, 517, 129, 200, 700]


def sanitize_pack(head_dim: int, head_dim_v: int | None = None):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of that pack on the GPU, bf16, 2/1 heads (v
    with ``head_dim_v`` columns, default ``head_dim``)."""
    q = torch.randn(sum(SANITIZE_LENS_Q), 2, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(SANITIZE_LENS_K), 1, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(SANITIZE_LENS_K), 1, head_dim if head_dim_v is None else head_dim_v, device="cuda",
                    dtype=torch.bfloat16)
    return (q, k, v, cu_seqlens(SANITIZE_LENS_Q, "cuda"), cu_seqlens(SANITIZE_LENS_K, "cuda"),
            max(SANITIZE_LENS_Q), max(SANITIZE_LENS_K))

