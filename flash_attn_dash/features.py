"""The features of issue 19 at the API: ``window_size``, ``softcap`` and ``learnable_sink``.

Semantics (``docs/features.md``, :mod:`flash_attn_dash.reference`): FlashAttention-3's sliding window,
FlashAttention-4's softcap and learnable sink. This module holds what every entry point and op shares: the argument
checks, the mask a window describes for a shape (FlashAttention-3's canonical form,
:func:`.schedule.tiles.canonical_window`), and the decision whether the sm90 kernels run a call's features.

The full-mask kernels run the full mask; the causal kernels run the causal mask and every other window, whose two
sides they take at run time (:func:`kernel_window`); the forward kernels fold a sink into each row's softmax. A
softcap runs on the full, causal and sliding-window kernels with the tanh compiled in (forward and backward), not with
a sink (no kernel is built for that). What the kernels lack is refused on CUDA tensors with a NotImplementedError
naming the arguments, before anything is launched. CPU tensors run
the reference with every feature. Every check here reads Python values, dtypes, devices and shapes only, so it runs on
torch.compile's fake tensors too.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import variants
from .launch import CAUSAL_WINDOW, NO_WINDOW, check_schedule, check_schedule_name
from .schedule.tiles import canonical_window, check_window_size

# FlashAttention-4 accepts these sink dtypes; CPU tensors also take fp64 (gradcheck), as q's dtypes there.
KERNEL_SINK_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
REFERENCE_SINK_DTYPES = KERNEL_SINK_DTYPES + (torch.float64,)


def check_softcap(softcap: object) -> float:
    """``softcap`` as a float: 0 (off) or the cap of ``softcap * tanh(score / softcap)``; TypeError/ValueError
    otherwise."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float >= 0 (0.0 = off), got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be finite and >= 0 (0.0 = off), got {softcap}")
    return float(softcap)


def check_learnable_sink(learnable_sink: object, heads: int, q: torch.Tensor) -> None:
    """``learnable_sink`` is None or a (heads,) tensor on q's device, in a dtype FlashAttention-4 accepts (fp16,
    bf16, fp32; also fp64 on CPU tensors)."""
    if learnable_sink is None:
        return
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be None or a torch.Tensor of shape (heads,), got "
                        f"{type(learnable_sink).__name__}")
    if tuple(learnable_sink.shape) != (heads,):
        raise ValueError(f"learnable_sink must have shape (heads,) = ({heads},) (one logit per query head), got "
                         f"{tuple(learnable_sink.shape)}")
    allowed = KERNEL_SINK_DTYPES if q.is_cuda else REFERENCE_SINK_DTYPES
    if learnable_sink.dtype not in allowed:
        accepted = ", ".join(str(d) for d in allowed)
        raise TypeError(f"learnable_sink.dtype must be one of {accepted} on {q.device.type}, got "
                        f"{learnable_sink.dtype}")
    if learnable_sink.device != q.device:
        raise ValueError(f"learnable_sink must be on q's device ({q.device}), got {learnable_sink.device}")


def kernel_causal(causal: bool, window_size: Sequence[int], seqlen_q: int, seqlen_k: int) -> bool | None:
    """The ``causal`` flag of the kernels' mask that sees exactly the keys of ``(causal, window_size)`` on this shape
    (False: full, True: causal), or None when the window is a band, which no kernel implements yet."""
    return {NO_WINDOW: False, CAUSAL_WINDOW: True}.get(canonical_window(causal, window_size, seqlen_q, seqlen_k))


def kernel_window(causal: bool, window_size: Sequence[int], seqlen_q: int,
                  seqlen_k: int) -> tuple[bool, tuple[int, int]]:
    """The kernels that run ``(causal, window_size)`` on this shape and the window they are given: ``(False, (-1,
    -1))`` (the full-mask kernels), ``(True, (-1, 0))`` (the causal mask) or ``(True, window)`` with the canonical
    window (a sliding window runs on the causal kernels, both sides at run time)."""
    window = canonical_window(causal, window_size, seqlen_q, seqlen_k)
    return (False, NO_WINDOW) if window == NO_WINDOW else (True, window)


def kernel_refusal(softcap: float, sliding_window: tuple[int, int] | None = None, *,
                   has_sink: bool = False) -> str | None:
    """Why the sm90 kernels cannot run these features, naming each argument they do not support; None if they can.
    ``sliding_window``: the kernels' window when it is a sliding window (not the full or causal mask). A softcap runs
    on the full and causal kernels, with a sliding window or a learnable sink (``has_sink``) only where the variant
    table builds that combination (``variants.SOFTCAP_WITH``). The decision reads Python values only, so it is tested on any machine."""
    reasons = []
    if softcap != 0:
        present = [(what, key) for what, here, key in (("a sliding window", sliding_window is not None, "window"),
                                                       ("a learnable_sink", has_sink, "sink")) if here]
        unbuilt = [what for what, key in present if key not in variants.SOFTCAP_WITH]
        if unbuilt:
            reasons.append(f"softcap={softcap} with {' and '.join(unbuilt)} (no softcap kernel is built for it)")
    if not reasons:
        return None
    return ("the sm90 kernels do not support " + "; ".join(reasons) + " yet. CPU tensors run the PyTorch reference "
            "with every feature.")


def kernel_mask(causal: bool, window_size: Sequence[int], softcap: float, seqlen_q: int, seqlen_k: int, *,
                has_sink: bool = False) -> tuple[bool, tuple[int, int]]:
    """The kernels' ``(causal, window)`` for these features (:func:`kernel_window`; a softcap runs with the mask
    this names, on the same shape); NotImplementedError (:func:`kernel_refusal`'s message) where they cannot run
    them. ``has_sink``: the call has a learnable sink."""
    kernels = kernel_window(causal, window_size, seqlen_q, seqlen_k)
    sliding = kernels[1] if kernels[1] not in (NO_WINDOW, CAUSAL_WINDOW) else None
    why = kernel_refusal(softcap, sliding, has_sink=has_sink)
    if why is not None:
        raise NotImplementedError(why)
    return kernels


def check_schedule_on_mask(schedule: str, causal: bool, window_size: Sequence[int], seqlen_q: int,
                           seqlen_k: int) -> None:
    """Validate ``schedule`` against the mask the window describes on this shape: the full or causal mask's orders,
    or, on a band, any order (the schedule model defines every order on bands, ``schedule.orders.applicable``)."""
    mask_causal = kernel_causal(causal, window_size, seqlen_q, seqlen_k)
    if mask_causal is None:
        check_schedule_name(schedule)
    else:
        check_schedule(schedule, mask_causal)


def check_features(causal: bool, window_size: object, softcap: object, learnable_sink: object, schedule: str,
                   heads: int, seqlen_q: int, seqlen_k: int, q: torch.Tensor) -> tuple[tuple[int, int], float]:
    """Every feature check of an attention call, before anything runs: the values (``window_size`` a pair of ints
    >= -1, ``softcap`` a finite float >= 0, ``learnable_sink`` None or (heads,) on q's device), ``schedule`` against
    the mask the window describes (:func:`check_schedule_on_mask`), and on CUDA tensors what the kernels support
    (:func:`kernel_mask`). Returns ``(window_size, softcap)`` as ``((int, int), float)``."""
    window = check_window_size(window_size)
    cap = check_softcap(softcap)
    check_learnable_sink(learnable_sink, heads, q)
    check_schedule_on_mask(schedule, causal, window, seqlen_q, seqlen_k)
    if q.is_cuda:
        kernel_mask(causal, window, cap, seqlen_q, seqlen_k, has_sink=learnable_sink is not None)
    return window, cap


def sink_grad_buffer(learnable_sink: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The ``dsink`` output of the backward ops: zeros (heads,) fp32 with a sink, else an empty (0,) fp32 tensor (the
    ops always return one, so their schemas and fake kernels do not depend on the sink's presence beyond its
    None-ness)."""
    size = 0 if learnable_sink is None else learnable_sink.shape[0]
    return torch.zeros(size, dtype=torch.float32, device=like.device)


def sink_grad(dsink: torch.Tensor, learnable_sink: torch.Tensor | None) -> torch.Tensor | None:
    """What an autograd backward returns for ``learnable_sink``: None without a sink, else the ops' fp32 ``dsink`` in
    the sink's dtype (as FlashAttention-4 returns it)."""
    return None if learnable_sink is None else dsink.to(learnable_sink.dtype)
