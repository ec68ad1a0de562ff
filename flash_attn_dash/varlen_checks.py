"""Argument checks of the varlen (packed) API. Every error names the argument and what is accepted.

Two kinds: :func:`check_varlen_args` and :func:`check_varlen_features` read only dtypes, devices, shapes and Python
values, so they run before anything is launched on any device (and under torch.compile's fake tensors);
:func:`check_layout_values` reads the values of ``cu_seqlens_*`` and ``seqused_*``, so it runs on host copies, where
the ops read them anyway (:mod:`.varlen_layout`).
The layout-independent tensor rules (dtypes, devices, GQA ratio) are :func:`flash_attn_dash.checks.check_tensors`'s.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import checks, features

# The varlen kernels address packed tensors with 32-bit element offsets.
INDEX_LIMIT = 2**31


@dataclass(frozen=True)
class VarlenShape:
    batch: int
    total_q: int
    total_k: int
    heads: int
    heads_k: int
    head_dim: int  # q and k
    head_dim_v: int  # v and the output


def _check_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: tuple[str, str, str]) -> checks.AttnShape:
    """The packed layout's own rules; then check_tensors on batch-1 views for the rules shared with flash_attn_func
    (the packed shape checks come first so no error quotes the views' 4-D shapes)."""
    qn, kn, vn = names
    for name, t, dims in ((qn, q, "total_q, heads, head_dim"), (kn, k, "total_k, heads_k, head_dim"),
                          (vn, v, "total_k, heads_k, head_dim_v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D ({dims}), got shape {tuple(t.shape)}")
    if tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError(f"{vn}.shape[:2] (total_k, heads_k) must equal {kn}.shape[:2] {tuple(k.shape[:2])}, got "
                         f"{tuple(v.shape[:2])} ({vn} may differ from {kn} in head_dim only)")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{kn}.shape[2] (head_dim) must equal {qn}.shape[2] = {q.shape[2]}, got {k.shape[2]}")
    return checks.check_tensors(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), names=names)


def _check_index_range(tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if t.numel() >= INDEX_LIMIT:
            tokens, heads, dim = t.shape
            raise ValueError(f"{name} has {tokens} tokens x {heads} heads x {dim} head_dim = {t.numel()} elements; "
                             f"the varlen kernels index with 32-bit offsets, so it must be < 2**31 = {INDEX_LIMIT}")


def _check_cu_seqlens(name: str, cu: object, device: torch.device) -> int:
    """Return the batch size ``cu`` describes."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (int32, shape (batch + 1,)), got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name}.dtype must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() == 0:
        raise ValueError(f"{name} must be 1-D of length batch + 1 >= 1, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {cu.device}")
    return cu.numel() - 1


def _check_max_seqlen(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int (>= 1), got {value}")


def _check_seqused(name: str, used: object, batch: int, device: torch.device) -> None:
    if used is None:
        return
    if not isinstance(used, torch.Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor (int32, shape (batch,)), got {type(used).__name__}")
    if used.dtype != torch.int32:
        raise TypeError(f"{name}.dtype must be torch.int32, got {used.dtype}")
    if tuple(used.shape) != (batch,):
        raise ValueError(f"{name} must have shape (batch,) = ({batch},), got {tuple(used.shape)}")
    if used.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {used.device}")


def _check_totals(side: str, total: int, batch: int, max_seqlen: int) -> None:
    """A bound that needs no values: cu_seqlens ends at the total, so batch x max_seqlen must reach it."""
    if total > batch * max_seqlen:
        raise ValueError(f"max_seqlen_{side} = {max_seqlen} must bound every sequence's length, but {side} packs "
                         f"{total} tokens into {batch} sequences (more than batch x max_seqlen_{side} = "
                         f"{batch * max_seqlen})")


def check_varlen_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    names: tuple[str, str, str] = ("q", "k", "v"),
) -> VarlenShape:
    """Validate the tensors and lengths of a varlen call from dtypes, devices and shapes alone (no device sync);
    return the problem shape. ``names`` are what errors call q, k, v (views of a packed argument: its slices)."""
    shape = _check_packed(q, k, v, names)
    _check_index_range(dict(zip(names, (q, k, v))))
    batch = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    batch_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if batch_k != batch:
        raise ValueError(f"cu_seqlens_k must have the length of cu_seqlens_q (batch + 1 = {batch + 1}: the same "
                         f"sequences), got {batch_k + 1}")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    _check_seqused("seqused_q", seqused_q, batch, q.device)
    _check_seqused("seqused_k", seqused_k, batch, q.device)
    _check_totals("q", shape.seqlen_q, batch, max_seqlen_q)
    _check_totals("k", shape.seqlen_k, batch, max_seqlen_k)
    return VarlenShape(batch, shape.seqlen_q, shape.seqlen_k, shape.heads, shape.heads_k, shape.head_dim,
                       shape.head_dim_v)


def check_varlen_features(causal: bool, window_size: object, softcap: object, learnable_sink: object, schedule: str,
                          heads: int, max_seqlen_q: int, max_seqlen_k: int,
                          q: torch.Tensor) -> tuple[tuple[int, int], float]:
    """:func:`flash_attn_dash.features.check_features` for a varlen call: the mask a window describes, and what the
    kernels support, are decided on the maximum lengths (FlashAttention-3's rule; a window side that clips nothing
    there clips nothing in any sequence). Returns ``(window_size, softcap)``."""
    return features.check_features(causal, window_size, softcap, learnable_sink, schedule, heads, max_seqlen_q,
                                   max_seqlen_k, q)


def check_layout_values(side: str, cu: Sequence[int], total: int, max_seqlen: int,
                        used: Sequence[int] | None) -> list[int]:
    """Validate the host values of ``cu_seqlens_{side}`` (and ``seqused_{side}``); return each sequence's length."""
    name = f"cu_seqlens_{side}"
    if cu[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {cu[0]}")
    if cu[-1] != total:
        raise ValueError(f"{name}[-1] must equal {side}.shape[0] = {total} (the packed tokens), got {cu[-1]}")
    lengths = [end - start for start, end in zip(cu[:-1], cu[1:])]
    for i, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing, got {name}[{i + 1}] = {cu[i + 1]} < "
                             f"{name}[{i}] = {cu[i]}")
        if length > max_seqlen:
            raise ValueError(f"max_seqlen_{side} = {max_seqlen} must bound every sequence's length, but sequence {i} "
                             f"has {length} tokens ({name}[{i + 1}] - {name}[{i}])")
    if used is not None:
        for i, (n, length) in enumerate(zip(used, lengths)):
            if not 0 <= n <= length:
                raise ValueError(f"seqused_{side}[{i}] must be in [0, {length}] (sequence {i}'s length in {name}), "
                                 f"got {n}")
    return lengths
