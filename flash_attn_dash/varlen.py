"""Variable-length (packed) attention: flash_attn_varlen_func and varlen_schedule_used, FlashAttention-3's layout.

Sequences are packed along the first dimension, (total_tokens, heads, head_dim), with int32 offsets ``cu_seqlens_*``.
On CUDA tensors (:mod:`.varlen_cuda`) the varlen kernels run one launch per pack and pass and check the offsets on
the device; the requests they do not run (deterministic ``shift``/``symmetric_shift``, deterministic GQA on narrow
windows) go through the dense kernels one sequence at a time, which reads the offsets on the host.
"""
from __future__ import annotations

import torch

from . import _ext, checks, features, varlen_cuda, varlen_ops  # noqa: F401  (varlen_ops defines the custom ops this module calls)
from . import interface  # noqa: F401  (loads the extension and the dense ops)
from .varlen_checks import check_varlen_args, check_varlen_features
from .launch import sequence_launch, varlen_kernel_launch, varlen_request
from .varlen_layout import read_layout

_ext.warn_if_gpu_without_kernels()


def k_offsets_arg(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> torch.Tensor | None:
    """``cu_seqlens_k`` as an autograd.Function argument: None when it is ``cu_seqlens_q`` itself (self-attention
    packs usually pass one tensor twice, and torch.compile cannot trace a Function given the same tensor twice)."""
    return None if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k


class _FlashAttnVarlenFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                seqused_k, softmax_scale, causal, window_size, softcap, deterministic, schedule, sm_margin):
        cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                        max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal,
                                                        sm_margin, *window_size, softcap, learnable_sink)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink)
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
        ctx.options = (softmax_scale, causal, deterministic, schedule, sm_margin, *window_size, softcap)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink = ctx.saved_tensors
        # Incoming gradients can be expanded or strided views; the kernels need TMA-friendly strides.
        dq, dk, dv, dsink = torch.ops.flash_attn_dash.varlen_bwd(dout.contiguous(), q, k, v, out, lse, cu_seqlens_q,
                                                                 cu_seqlens_k, *ctx.max_seqlens, seqused_q, seqused_k,
                                                                 *ctx.options, learnable_sink)
        return (dq, dk, dv, features.sink_grad(dsink, learnable_sink)) + (None,) * 13


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    deterministic: bool | None = None,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention within each of a batch of sequences packed along the token dimension, differentiable in q, k, v
    (and ``learnable_sink``).

    Sequence b's queries are rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` of q; they attend to rows
    ``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1`` of k and v, and to nothing of the other sequences.

    Args:
        q: (total_q, heads, head_dim), fp16 or bf16 on an sm90 GPU (CPU tensors, also fp32/fp64 and any head dim,
            run the PyTorch reference with the same semantics).
        k, v: (total_k, heads_k, head_dim) and (total_k, heads_k, head_dim_v) on q's device in q's dtype; heads %
            heads_k == 0 gives GQA/MQA; v's head dim may differ from q's and k's (MLA, as in ``flash_attn_func``).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device, the same batch for both: 0, then the running
            sum of the sequence lengths, ending at total_q (total_k). Lengths may be 0: a sequence without queries
            has no rows; one with queries but no keys gives out = 0 and lse = -inf on its rows.
        max_seqlen_q, max_seqlen_k: positive ints that must bound every sequence's length (``cu_seqlens_*[b+1] -
            cu_seqlens_*[b]``); a bound below a real length raises. The varlen kernels will size their grids from
            them, so tight bounds cost less.
        seqused_q, seqused_k: None, or int32 (batch,) on q's device: sequence b uses only its first
            ``seqused_*[b]`` tokens (each in [0, that sequence's length]); the rest of its rows are ignored (out 0,
            lse -inf, gradients 0), and the used lengths are the sequence's lengths for the causal mask. Unused rows
            must still hold finite values: the varlen kernels read whole tiles, and a masked key's weight is an exact
            0, which keeps finite neighbours out of a sequence's bits but turns an inf or NaN into NaN.
        softmax_scale: scale applied to q·kᵀ; default head_dim ** -0.5.
        causal: causal mask aligned bottom-right per sequence (query i of a sequence sees its key j iff
            j <= i + len_k - len_q); rows that see no key return 0 with lse = -inf. Sets the window's right side
            to 0.
        window_size, learnable_sink, softcap: as in :func:`flash_attn_dash.flash_attn_func`, per sequence: the
            window is aligned bottom-right on each sequence's used lengths (query i sees key j iff
            ``i + len_k - len_q - left <= j <= i + len_k - len_q + right``), and the sink's gradient is summed over
            every sequence's rows (so its bits depend on the whole pack, unlike each document's dq/dk/dv). On CUDA
            tensors whether the window is the full or causal mask is decided on ``max_seqlen_q``/``max_seqlen_k``
            (FlashAttention-3's rule), and what :func:`flash_attn_dash.flash_attn_func` refuses there (a softcap
            with a sink) raises NotImplementedError.
        deterministic: make dq/dk/dv bitwise reproducible run to run, and each sequence's bits independent of the
            pack: of the other sequences, their number, its position, ``sm_margin`` and the SM count (with a
            portable order, below). None (the default) follows ``torch.are_deterministic_algorithms_enabled()``.
        schedule: the order of the backward's reductions, as for :func:`flash_attn_dash.flash_attn_func`: "auto",
            "ascending", "descending", "shift" (full masks), "symmetric_shift", "split", "diagonal" (causal masks),
            validated in both modes, used by deterministic backwards only. Deterministic "auto" picks among the
            orders whose bits do not depend on the grid ("ascending", "descending", "split", "diagonal") by what
            may change bits anyway (head dim, mask, window), never by the pack: "diagonal" on causal masks without
            a window at hdim 64, "descending" elsewhere (:func:`.launch.varlen_request`). "shift" and
            "symmetric_shift" run when asked for but are not portable: their ranks follow the grid's rounds, so a
            sequence's bits depend on what it is packed with. Per sequence, the order that runs:
            :func:`varlen_schedule_used`.
        sm_margin: SMs to leave free for concurrent work; the backward's persistent grid uses the rest.
        return_lse: also return the log-sum-exp (heads, total_q), fp32, natural log, the sink included (not
            differentiable).

    Returns:
        out (total_q, heads, head_dim_v) in q's dtype, or (out, lse) if return_lse.

    Every argument is checked before anything is launched, from dtypes, devices and shapes (including that q, k
    and v stay below 2**31 elements, the varlen kernels' 32-bit offsets). The values of ``cu_seqlens_*`` and
    ``seqused_*`` (starting at 0, non-decreasing, ending at the packed total, lengths within ``max_seqlen_*``, used
    counts within the lengths) are checked where they are read: on CPU tensors at no cost; on CUDA tensors by the
    varlen kernels' prepare CTA on the device (no sync: a bad pack's out and lse are filled with NaN, no tile runs,
    and the next varlen call on the device raises a ValueError naming the argument), or, for the requests that run
    one dense call per sequence (a deterministic ``shift``/``symmetric_shift`` backward, a deterministic GQA
    backward on a window the dense backward folds), on the host copy they make (one device-to-host copy, a stream
    sync, per pass, so those calls cannot be captured in a CUDA graph).
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    shape = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k)
    window, softcap = check_varlen_features(causal, window_size, softcap, learnable_sink, schedule, shape.heads,
                                            max_seqlen_q, max_seqlen_k, q)
    scale = checks.softmax_scale_or_default(shape.head_dim, softmax_scale)
    out, lse = _FlashAttnVarlenFunc.apply(q, k, v, learnable_sink, cu_seqlens_q,
                                          k_offsets_arg(cu_seqlens_q, cu_seqlens_k), max_seqlen_q, max_seqlen_k,
                                          seqused_q, seqused_k, scale, causal, window, softcap,
                                          checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return (out, lse) if return_lse else out


def varlen_schedule_used(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    causal: bool = False,
    deterministic: bool | None = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    window_size: tuple[int, int] = (-1, -1),
) -> list[str | None]:
    """The dQ accumulation order each sequence's backward runs in ``flash_attn_varlen_func(q, k, v, ...)`` with
    these arguments, in pack order; None for a sequence with no backward work (no used query or no used key).

    Arguments are checked as ``flash_attn_varlen_func`` checks them (``v`` is taken to be shaped like ``k``),
    including the values of ``cu_seqlens_*``/``seqused_*`` (on CUDA tensors: one device-to-host copy). As
    :func:`flash_attn_dash.backward_schedule_used`, the answer is the GPU kernels' on any device (on CPU tensors:
    an H200's 132 SMs), and it raises what a GPU build would raise (a head dim without kernels, an ``sm_margin``
    that leaves no SM). Deterministic backwards run ``schedule`` on every sequence ("auto": :func:`.launch.varlen_request`'s
    order, "diagonal" on causal calls without a window at hdim 64, else "descending"), or its
    fallback where a sequence's shape breaks its assumptions (symmetric_shift needs equal used query and key lengths
    and an even K/V tile count); non-deterministic ones walk the fastest balanced order for each sequence's shape.
    Where the varlen backward kernel runs (:data:`.varlen_cuda.BWD_KERNEL_VALIDATED`, a portable request), every
    sequence answers its order (:func:`.launch.varlen_kernel_launch`: non-deterministic packs walk descending).
    ``window_size`` is ``flash_attn_varlen_func``'s, applied to each sequence (aligned bottom-right on its used
    lengths); a sliding window runs its own orders (:func:`.launch.bwd_launch`).
    """
    checks.check_options(None, causal, deterministic, schedule, sm_margin, False)
    deterministic = checks.resolve_deterministic(deterministic)
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    shape = check_varlen_args(q, k, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k)
    window, _ = check_varlen_features(causal, window_size, 0.0, None, schedule, shape.heads, max_seqlen_q,
                                      max_seqlen_k, q)
    _, kernel_window = features.kernel_mask(causal, window, 0.0, max_seqlen_q, max_seqlen_k)
    checks.check_kernel_head_dim(shape.head_dim)
    num_sms = checks.check_sm_margin(sm_margin, q.device) if q.is_cuda else checks.modeled_grid_size(sm_margin)
    seqs = read_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, shape.total_q,
                       shape.total_k)
    # The varlen backward kernel, where it runs, walks one portable order for the whole pack.
    kernel = varlen_cuda.BWD_KERNEL_VALIDATED and varlen_kernel_launch(
        deterministic, schedule, shape.head_dim, shape.total_k, shape.batch, shape.heads, num_sms, shape.heads_k,
        kernel_window, causal)
    request = varlen_request(deterministic, schedule, shape.head_dim, kernel_window)
    used: list[str | None] = []
    for s in seqs:
        if not s.has_work:
            used.append(None)
            continue
        if kernel:
            used.append(kernel.order)
            continue
        seq_causal, seq_window = features.kernel_window(causal, window, s.q_len, s.k_len)
        used.append(sequence_launch(seq_causal, shape.head_dim, s.q_len, s.k_len, shape.heads, num_sms,
                                    deterministic, request, seq_window).schedule)
    return used
