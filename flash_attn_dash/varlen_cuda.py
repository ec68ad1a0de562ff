"""The CUDA implementation of the varlen ops.

The varlen ops (:mod:`.varlen_ops`) call nothing else on CUDA tensors. Two paths:

* the varlen kernels (``flash_attn_dash::varlen_fwd_out`` / ``varlen_bwd_out``: one launch per pack and pass, the
  offsets read and checked on the device, no host sync, so CUDA-graph capturable), where
  :data:`FWD_KERNEL_VALIDATED` / :data:`BWD_KERNEL_VALIDATED` say they passed their GPU tests; the backward kernel
  runs the portable orders (:func:`.launch.varlen_kernel_launch`);
* otherwise (and for a deterministic backward asking for ``shift`` or ``symmetric_shift``), one dense kernel call per
  sequence (:mod:`.varlen_per_sequence`): correct, but reading ``cu_seqlens_*``/``seqused_*`` costs one
  device-to-host copy (a stream sync) per pass (:func:`.varlen_layout.read_layout`), and many short sequences are
  launch-bound.
Both give a sequence the bits of its dense call: the kernel runs its tiles, masks and orders relative to the
sequence (``hopper/common/varlen.hpp``), and each per-sequence backward runs the order the varlen kernels must give
it (:func:`.launch.sequence_launch`).

Bad offsets reach the kernel path's device-side check, not a host one (that would need the sync): the prepare CTA
fills ``out`` and ``lse`` with NaN, launches no tile and records the error in a pinned host word, and the next varlen
call on that device raises it as a ValueError naming the argument (:func:`raise_pending_error`).
"""
from __future__ import annotations

import torch

from . import checks, features, launch, ops, variants, varlen_per_sequence
from .varlen_layout import read_layout

# Whether the varlen kernels run: tests/test_varlen_kernel_gpu.py holds them to the per-sequence path's bits (and its
# log in benchmarks/results says on which commit it passed); a kernel that fails it is switched off here.
FWD_KERNEL_VALIDATED = True
BWD_KERNEL_VALIDATED = True

# What the prepare CTA's status codes mean (hopper/common/varlen.hpp, VarlenError), with the sequence they name.
_STATUS_MESSAGES = {
    1: "cu_seqlens_q[0] must be 0",
    2: "cu_seqlens_q must be non-decreasing (sequence {seq} has a negative length)",
    3: "cu_seqlens_q[-1] must equal total_q = q.shape[0]",
    4: "cu_seqlens_k[0] must be 0",
    5: "cu_seqlens_k must be non-decreasing (sequence {seq} has a negative length)",
    6: "cu_seqlens_k[-1] must equal total_k = k.shape[0]",
    7: "seqused_q[{seq}] must be in [0, cu_seqlens_q[{seq} + 1] - cu_seqlens_q[{seq}]]",
    8: "seqused_k[{seq}] must be in [0, cu_seqlens_k[{seq} + 1] - cu_seqlens_k[{seq}]]",
    9: "max_seqlen_q must be >= every sequence's (used) query length; sequence {seq} is longer",
    10: "max_seqlen_k must be >= every sequence's (used) key length; sequence {seq} is longer",
}
_status_words: dict[int, torch.Tensor] = {}


def status_word(device: torch.device) -> torch.Tensor:
    """The pinned (code, sequence) pair the prepare CTAs of ``device`` write (one per device, kept for the
    process: CUDA graphs capture its address)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _status_words:
        _status_words[index] = torch.zeros(2, dtype=torch.int32, pin_memory=True)
    return _status_words[index]


def status_message(code: int, seq: int) -> str:
    """The error a status code reports (an unknown code is named as such)."""
    what = _STATUS_MESSAGES.get(code, "unknown varlen status code {code}").format(seq=seq, code=code)
    return (f"a varlen call on this device got bad offsets: {what}; its out and lse were filled with NaN and its "
            "kernel ran no tile (the offsets are checked on the device, so the error is raised by the next call)")


def raise_pending_error(device: torch.device) -> None:
    """Raise (and clear) the error a previous call's prepare CTA recorded on ``device``, if its kernel has run."""
    word = status_word(device)
    code, seq = word.tolist()  # host memory: no device sync
    if code != 0:
        word.zero_()
        raise ValueError(status_message(code, seq))


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
    if FWD_KERNEL_VALIDATED:
        return kernel_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                              softmax_scale, causal, sm_margin, window_size, softcap, learnable_sink)
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    return varlen_per_sequence.forward(q, k, v, seqs, softmax_scale, causal, sm_margin, window_size=window_size,
                                       softcap=softcap, learnable_sink=learnable_sink)


def kernel_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, seqused_q: torch.Tensor | None,
                   seqused_k: torch.Tensor | None, softmax_scale: float, causal: bool, sm_margin: int,
                   window_size: tuple[int, int], softcap: float,
                   learnable_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The varlen forward kernel: out and lse as :func:`forward` returns them. The kernels' mask is decided at the
    maximum lengths (FlashAttention-3's rule, :func:`.features.kernel_mask`) and applied to each sequence's own
    lengths; rows past ``seqused_q`` belong to no tile, so with it out starts at 0 and lse at -inf."""
    raise_pending_error(q.device)
    kernel_causal, window = features.kernel_mask(causal, window_size, softcap, max_seqlen_q, max_seqlen_k,
                                                 has_sink=learnable_sink is not None)
    heads, total_q = q.shape[1], q.shape[0]
    if seqused_q is None:
        out = q.new_empty(checks.out_shape(q, v))
        lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)
    else:
        out = q.new_zeros(checks.out_shape(q, v))
        lse = torch.full((heads, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return out, lse
    sink = None if learnable_sink is None else learnable_sink.to(torch.float32).contiguous()
    torch.ops.flash_attn_dash.varlen_fwd_out(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                            max_seqlen_k, out, lse, status_word(q.device), softmax_scale,
                                            kernel_causal, sm_margin, *window, sink, softcap)
    return out, lse


def backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, seqused_q: torch.Tensor | None,
                  seqused_k: torch.Tensor | None, softmax_scale: float, causal: bool, deterministic: bool,
                  schedule: str, sm_margin: int, window_size: tuple[int, int], softcap: float,
                  learnable_sink: torch.Tensor | None, dsink: torch.Tensor | None = None) -> None:
    """``flash_attn_dash::varlen_bwd`` on CUDA tensors: every row of ``dq``/``dk``/``dv`` (which may hold anything)
    is written, zeros where no used key or query is seen; ``dsink`` (with a sink) is zero-filled and receives the
    sink's gradient."""
    _check(q, k, v, max_seqlen_q, max_seqlen_k, causal, window_size, softcap, learnable_sink is not None, sm_margin)
    if BWD_KERNEL_VALIDATED and kernel_backward_into(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale,
                                                     causal, deterministic, schedule, sm_margin, window_size, softcap,
                                                     learnable_sink, dsink):
        return
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q.shape[0],
                       k.shape[0])
    varlen_per_sequence.backward_into(dout, q, k, v, out, lse, dq, dk, dv, seqs, softmax_scale, causal, deterministic,
                                      schedule, sm_margin, window_size=window_size, softcap=softcap,
                                      learnable_sink=learnable_sink, dsink=dsink,
                                      pack_window=features.kernel_window(causal, window_size, max_seqlen_q,
                                                                         max_seqlen_k)[1])


def kernel_backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None, softmax_scale: float,
                         causal: bool, deterministic: bool, schedule: str, sm_margin: int,
                         window_size: tuple[int, int], softcap: float, learnable_sink: torch.Tensor | None,
                         dsink: torch.Tensor | None = None) -> bool:
    """The varlen backward kernel into the gradients as :func:`backward_into` takes them; False (nothing launched)
    when the request's order is not one the kernel runs (:func:`.launch.varlen_kernel_launch`). The offsets cover
    every row, and the kernels write every used one: the dQ postprocess each query row (zeros for a sequence without
    keys), the key tiles each key row (zeros from the tiles of a sequence without queries). Only rows past
    ``seqused_*`` are no kernel's, so only those calls pay for a fill (a pass over the whole gradient)."""
    kernel_causal, window = features.kernel_mask(causal, window_size, softcap, max_seqlen_q, max_seqlen_k,
                                                 has_sink=learnable_sink is not None)
    decided = launch.varlen_kernel_launch(deterministic, schedule, q.shape[-1], k.shape[0], cu_seqlens_q.numel() - 1,
                                          q.shape[1], checks.check_sm_margin(sm_margin, q.device), k.shape[1], window,
                                          causal, head_dim_v=v.shape[-1])
    if decided is None:
        return False
    raise_pending_error(q.device)
    if q.shape[0] == 0 or k.shape[0] == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        return True  # no tile
    if seqused_q is not None:
        dq.zero_()
    if seqused_k is not None:
        dk.zero_()
        dv.zero_()
    wants_dsink = learnable_sink is not None and dsink is not None
    sink = learnable_sink.to(torch.float32).contiguous() if wants_dsink else None
    torch.ops.flash_attn_dash.varlen_bwd_out(
        dout, q, k, v, out, lse.contiguous(), cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
        max_seqlen_k, dq, dk, dv, status_word(q.device), softmax_scale, kernel_causal, deterministic,
        variants.schedule(decided.order).id, decided.grid, sm_margin, *window, softcap, sink,
        dsink if wants_dsink else None, decided.gqa_fold, decided.fold_min_len_q, decided.fold_min_len_k)
    return True
