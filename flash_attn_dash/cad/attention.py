"""cad_attn_func: attention within packed documents, computed where a CAD plan says, differentiable.

Forward, per plan (one, or the two halves of a ping-pong plan): each owner sends its chunks' queries and each
document's K/V prefix (once per server) with all_to_all_single; each server runs its tasks in canonical
order; the outputs come back. Backward: dO goes out, dQ and every chunk's dK/dV partial come back, and the
owner folds each document's partials in fp32 in chunk order and casts once. Every chunk's kernel calls and
the fold order depend only on the document and the chunk size, so out, dq, dk and dv are bitwise the same
for every plan and world size at that chunk size.

With a ping-pong plan the second half's dispatch is in flight while the first half computes, and the first
half's results travel back while the second computes.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import checks, kernels_available
from . import comm
from .fold import fold_partials
from .layout import OwnerLayout, owner_layout
from .pingpong import CADPingPongPlan
from .plan import CADPlan, Task
from .server import backward_tasks, forward_tasks

__all__ = ["cad_attn_func"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class _Stage:
    """One planned (half) batch: this rank's owner layout, and its tasks as a server."""

    plan: CADPlan
    owner: OwnerLayout
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class _Options:
    group: dist.ProcessGroup | None
    rank: int
    causal: bool
    deterministic: bool
    softmax_scale: float
    sm_margin: int


def _stages(plan: CADPlan | CADPingPongPlan, rank: int, cu: list[int], device: torch.device) -> list[_Stage]:
    halves = plan.halves if isinstance(plan, CADPingPongPlan) else (plan,)
    stages, first = [], 0
    for half in halves:
        n = len(half.doc_lens[rank])
        stages.append(_Stage(half, owner_layout(half, rank, cu[first:first + n], device), half.tasks[rank]))
        first += n
    return stages


def _forward(stages: list[_Stage], opt: _Options, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    def send(x, index, phase, plan):
        return comm.start_all_to_all(x.index_select(0, index), *plan.splits(phase, opt.rank), opt.group)

    # Dispatch every stage first: stage i+1's transfer overlaps stage i's compute.
    inbound = [(send(q, s.owner.q_index, "q", s.plan), send(k, s.owner.kv_index, "kv", s.plan),
                send(v, s.owner.kv_index, "kv", s.plan)) for s in stages]
    saved, outbound = [], []
    for s, pending in zip(stages, inbound):
        qb, kb, vb = (p.wait() for p in pending)
        ob, lses = forward_tasks(s.tasks, qb, kb, vb, opt.softmax_scale, opt.causal, opt.sm_margin)
        saved.append((qb, kb, vb, ob, lses))
        outbound.append(comm.start_all_to_all(ob, *s.plan.splits("out", opt.rank), opt.group))
    out = torch.empty_like(q)
    for s, pending in zip(stages, outbound):
        out.index_copy_(0, s.owner.q_index, pending.wait())
    return out, saved


def _backward(stages: list[_Stage], opt: _Options, saved, dout: torch.Tensor, kv_shape: torch.Size):
    inbound = [comm.start_all_to_all(dout.index_select(0, s.owner.q_index), *s.plan.splits("dout", opt.rank),
                                     opt.group) for s in stages]
    outbound = []
    for s, pending, (qb, kb, vb, ob, lses) in zip(stages, inbound, saved):
        dq_b, partials = backward_tasks(s.tasks, pending.wait(), qb, kb, vb, ob, lses, opt.softmax_scale,
                                        opt.causal, opt.deterministic, opt.sm_margin)
        outbound.append((comm.start_all_to_all(dq_b, *s.plan.splits("dq", opt.rank), opt.group),
                         comm.start_all_to_all(partials, *s.plan.splits("dkv", opt.rank), opt.group)))
    dq = torch.empty_like(dout)
    dk = dout.new_empty(kv_shape)
    dv = dout.new_empty(kv_shape)
    for s, (dq_pending, partial_pending) in zip(stages, outbound):
        dq.index_copy_(0, s.owner.q_index, dq_pending.wait())
        received = partial_pending.wait()
        for start, length, slots in zip(s.owner.doc_starts, s.owner.doc_lens, s.owner.partials):
            acc = fold_partials([received[o:o + rows] for o, rows in slots], length, dk.dtype)
            dk[start:start + length] = acc[:, 0]
            dv[start:start + length] = acc[:, 1]
    return dq, dk, dv


class _CADAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, stages, opt):
        out, saved = _forward(stages, opt, q, k, v)
        # This rank's server buffers, saved so autograd frees them after backward (unless retain_graph).
        ctx.save_for_backward(*(t for qb, kb, vb, ob, lses in saved for t in (qb, kb, vb, ob, *lses)))
        ctx.cad = (stages, opt, k.shape)
        return out

    @staticmethod
    def backward(ctx, dout):
        stages, opt, kv_shape = ctx.cad
        flat, saved = list(ctx.saved_tensors), []
        for s in stages:
            qb, kb, vb, ob = flat[:4]
            saved.append((qb, kb, vb, ob, flat[4:4 + len(s.tasks)]))
            del flat[:4 + len(s.tasks)]
        dq, dk, dv = _backward(stages, opt, saved, dout.contiguous(), kv_shape)
        return dq, dk, dv, None, None


def _check_tensors(plan: CADPlan | CADPingPongPlan, rank: int, q, k, v, cu_seqlens) -> list[int]:
    """Validate the tensors against each other and the plan; return cu_seqlens as ints."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q.dtype must be one of {', '.join(map(str, _DTYPES))}, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), "
                             f"got {t.dtype} on {t.device}")
    halves = plan.halves if isinstance(plan, CADPingPongPlan) else (plan,)
    p = halves[0]
    if q.element_size() != p.dtype_bytes:
        raise ValueError(f"q.dtype {q.dtype} has {q.element_size()} bytes per element, but the plan was built "
                         f"with dtype_bytes={p.dtype_bytes}")
    if tuple(q.shape[1:]) != (p.heads, p.head_dim):
        raise ValueError(f"q.shape must be (total_tokens, {p.heads}, {p.head_dim}) as planned "
                         f"(heads, head_dim), got {tuple(q.shape)}")
    if tuple(k.shape) != (q.shape[0], p.heads_kv, p.head_dim) or v.shape != k.shape:
        raise ValueError(f"k and v must have shape ({q.shape[0]}, {p.heads_kv}, {p.head_dim}) (q's tokens, the "
                         f"planned heads_kv and head_dim), got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.is_cuda:
        if not kernels_available():
            raise RuntimeError("CUDA tensors need the compiled flash_attn_dash kernels; this install has none")
        if q.dtype not in checks.KERNEL_DTYPES or p.head_dim not in checks.KERNEL_HEAD_DIMS:
            raise ValueError(f"on CUDA, q.dtype must be one of {checks.KERNEL_DTYPES} and head_dim one of "
                             f"{checks.KERNEL_HEAD_DIMS}; got {q.dtype} and {p.head_dim}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        got = f"{cu_seqlens.dtype} tensor of shape {tuple(cu_seqlens.shape)}" \
            if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise TypeError(f"cu_seqlens must be a 1-D int32 tensor (n_docs + 1 offsets), got {got}")
    lens = [n for half in halves for n in half.doc_lens[rank]]
    cu = cu_seqlens.tolist()
    if len(cu) != len(lens) + 1:
        raise ValueError(f"cu_seqlens must have {len(lens) + 1} entries: the plan has {len(lens)} documents on "
                         f"rank {rank}; got {len(cu)}")
    if cu[0] != 0 or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens must run from 0 to q.shape[0] = {q.shape[0]} (this rank's tokens), got "
                         f"{cu[0]} .. {cu[-1]}")
    got = [b - a for a, b in zip(cu, cu[1:])]
    if got != lens:
        raise ValueError(f"cu_seqlens gives document lengths {got} on rank {rank}, but the plan has {lens}")
    return cu


def _check_options(plan, world: int, group, causal, deterministic, softmax_scale, sm_margin, device) -> None:
    if not isinstance(plan, (CADPlan, CADPingPongPlan)):
        raise TypeError("plan must be a CADPlan or CADPingPongPlan (from plan_cad / plan_cad_pingpong), "
                        f"got {type(plan).__name__}")
    if plan.world_size != world:
        raise ValueError(f"plan was built for world size {plan.world_size}, but the group has {world} ranks; "
                         "plan with one doc_lens entry per rank of the group")
    for name, flag in (("causal", causal), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    planned = (plan.halves[0] if isinstance(plan, CADPingPongPlan) else plan).causal
    if causal != planned:
        raise ValueError(f"causal={causal}, but the plan was built with causal={planned}")
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                      or not math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite float or None, got {softmax_scale!r}")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin!r}")
    if device.type == "cuda":
        checks.check_sm_margin(sm_margin, device)
    if isinstance(plan, CADPingPongPlan) and device.type == "cuda" and not comm.host_transport(group) \
            and deterministic:
        # The deterministic backward's persistent CTAs wait on each other; NCCL kernels of the other half in
        # flight hold SMs, so the grid must leave them at least NCCL's CTA limit or it can deadlock.
        limit = os.environ.get("NCCL_MAX_CTAS")
        if limit is None or not limit.isdigit() or sm_margin < int(limit):
            raise ValueError(f"sm_margin={sm_margin}: a ping-pong plan on a device backend overlaps NCCL with "
                             "the deterministic backward, which needs NCCL_MAX_CTAS set and "
                             f"sm_margin >= NCCL_MAX_CTAS (NCCL_MAX_CTAS={limit})")


def cad_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    plan: CADPlan | CADPingPongPlan,
    group: dist.ProcessGroup | None = None,
    causal: bool = True,
    deterministic: bool = True,
    softmax_scale: float | None = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """Attention over each rank's packed documents, computed on the servers ``plan`` assigns.

    Every rank of ``group`` calls it with its own tokens and the same plan (and, later, runs backward).

    Args:
        q: (total_r, heads, head_dim), this rank's packed documents (after RoPE); k, v: (total_r, heads_kv,
            head_dim). fp16/bf16 on an sm90 GPU; CPU tensors (also fp32/fp64) run the PyTorch reference.
        cu_seqlens: int32 (n_docs_r + 1) document offsets of this rank; must match the plan's lengths.
        plan: from :func:`plan_cad` on the whole batch's ``doc_lens``, or :func:`plan_cad_pingpong` to
            overlap the two halves' communication with compute.
        group: the process group of the attention servers (default: the world).
        causal: must equal the plan's (bottom-right aligned mask per document).
        deterministic: pass True for bits that do not depend on the run, the plan or the world size (the
            backward runs the "descending" schedule); False lets the kernels add dQ in any order.
        softmax_scale: scale of q·kᵀ (default head_dim ** -0.5).
        sm_margin: SMs each kernel leaves free.

    Returns:
        (total_r, heads, head_dim), this rank's attention output, differentiable w.r.t. q, k and v.

    Raises:
        TypeError, ValueError: a bad argument on this rank (named), raised on every rank of the group (the
            others get RuntimeError) before any data moves; RuntimeError: the ranks' plans (fingerprints),
            dtypes or grad modes differ.
    """
    if not dist.is_initialized():
        raise RuntimeError("cad_attn_func needs torch.distributed initialised (torch.distributed.init_process_group)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    error, cu = None, None
    try:
        _check_options(plan, world, group, causal, deterministic, softmax_scale, sm_margin, device)
        cu = _check_tensors(plan, rank, q, k, v, cu_seqlens)
    except (TypeError, ValueError, RuntimeError) as exc:
        error = exc
    needs_grad = torch.is_grad_enabled() and error is None and any(t.requires_grad for t in (q, k, v))
    comm.handshake(group, error, {
        "the plan (fingerprint)": comm.fingerprint_words(plan.fingerprint) if error is None else [0] * 4,
        "q.dtype": [_DTYPES.index(q.dtype) if error is None else 0],
        "the grad mode (some ranks need a backward, others not)": [int(needs_grad)],
    })
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    opt = _Options(group, rank, causal, deterministic, scale, sm_margin)
    return _CADAttnFunc.apply(q, k, v, _stages(plan, rank, cu, q.device), opt)
