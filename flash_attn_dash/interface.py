"""Public entry point: flash_attn_func, in FlashAttention-3's (batch, seqlen, heads, head_dim) layout."""
from __future__ import annotations

import torch

from . import _ext, checks, features, ops  # noqa: F401  (ops defines the custom ops this module calls)
from .launch import bwd_launch

_ext.warn_if_gpu_without_kernels()


def backward_schedule_used(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = False,
    deterministic: bool | None = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    window_size: tuple[int, int] = (-1, -1),
) -> str:
    """The dQ accumulation order the backward of ``flash_attn_func(q, k, v, ...)`` will run with these arguments.

    ``deterministic=None`` follows ``torch.are_deterministic_algorithms_enabled()``, as in ``flash_attn_func``.
    ``q`` and ``k`` are checked exactly as ``flash_attn_func`` checks them (``v`` is taken to be shaped like ``k``:
    the (192, 128) MLA kernel has hdim 192's tiles, so it runs the order this gives for 192).
    The answer is the GPU kernels' on any device: on CPU tensors (where ``flash_attn_func`` runs the reference) it is
    what an H200 (132 SMs) would run, and it raises what a GPU build would raise (a head dim without kernels, an
    ``sm_margin`` that leaves no SM). Deterministic backwards run ``schedule`` (``"auto"``: the committed rule of
    :func:`flash_attn_dash.schedule.auto.auto_schedule`), or its fallback where the shape breaks its assumptions;
    non-deterministic backwards add dQ in no fixed order and walk the fastest balanced order
    (``variants.NONDETERMINISTIC_WALKS``) whatever ``schedule`` says.

    ``window_size`` is ``flash_attn_func``'s: a window that is the full or causal mask on this shape answers for that
    mask (``(-1, 0)`` is the causal mask with or without ``causal``); a sliding window answers with the order its
    kernels run (:func:`.launch.bwd_launch`), or raises what the kernels refuse (:func:`.features.kernel_mask`). Softcap and sinks do not change the order.
    """
    checks.check_options(None, causal, deterministic, schedule, sm_margin, False)
    deterministic = checks.resolve_deterministic(deterministic)
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    shape = checks.check_tensors(q, k, k)
    window, _ = features.check_features(causal, window_size, 0.0, None, schedule, shape.heads, shape.seqlen_q,
                                        shape.seqlen_k, q)
    causal, window = features.kernel_mask(causal, window, 0.0, shape.seqlen_q, shape.seqlen_k)
    checks.check_kernel_head_dim(shape.head_dim)
    num_sms = checks.check_sm_margin(sm_margin, q.device) if q.is_cuda else checks.modeled_grid_size(sm_margin)
    return bwd_launch(causal, shape.head_dim, shape.seqlen_q, shape.seqlen_k, shape.batch, shape.heads, num_sms,
                      deterministic, schedule, window).schedule


class _FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, learnable_sink, softmax_scale, causal, window_size, softcap, deterministic, schedule,
                sm_margin):
        out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, softmax_scale, causal, sm_margin, *window_size, softcap,
                                                 learnable_sink)
        ctx.save_for_backward(q, k, v, out, lse, learnable_sink)
        ctx.options = (softmax_scale, causal, deterministic, schedule, sm_margin, *window_size, softcap)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, learnable_sink = ctx.saved_tensors
        # Incoming gradients can be expanded or strided views; the kernels need TMA-friendly strides.
        dq, dk, dv, dsink = torch.ops.flash_attn_dash.bwd(dout.contiguous(), q, k, v, out, lse, *ctx.options,
                                                          learnable_sink)
        return (dq, dk, dv, features.sink_grad(dsink, learnable_sink)) + (None,) * 7


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    """Scaled dot-product attention with a reproducible-on-request backward.

    Args:
        q: (batch, seqlen_q, heads, head_dim), fp16 or bf16 on an sm90 GPU (CPU tensors, also fp32/fp64,
            run the PyTorch reference).
        k: (batch, seqlen_k, heads_k, head_dim); heads % heads_k == 0 gives GQA/MQA.
        v: (batch, seqlen_k, heads_k, head_dim_v): k's shape, its head dim may differ (DeepSeek's MLA: q/k 192,
            v 128; the kernels exist for the pairs of ``variants.HEAD_DIMS``).
        softmax_scale: scale applied to q·kᵀ; default head_dim ** -0.5 (q's head dim).
        causal: causal mask aligned bottom-right (query i sees key j iff j <= i + seqlen_k - seqlen_q);
            rows that see no key return 0 with lse = -inf. Sets the window's right side to 0 (as FlashAttention).
        window_size: ``(left, right)`` sliding window, ints >= -1 (-1 = unbounded): query i sees key j iff
            ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``. ``(-1, -1)`` is no window,
            ``(-1, 0)`` the causal mask. On CUDA tensors a sliding window runs the causal kernels with the window's
            bounds, skipping the tiles outside the band (deterministic ``auto`` = descending; ascending, descending
            or symmetric_shift on request; ``shift`` refused).
        learnable_sink: None, or (heads,) logits (fp16/bf16/fp32, also fp64 on CPU, on q's device), gpt-oss
            style: each row of head h gains a softmax column of logit ``sink[h]`` (not scaled, not capped) and no
            value; lse includes it (FlashAttention-4). Differentiable: its gradient is summed over batch and rows
            (a fixed-order reduction: the same bits run to run).
        softcap: 0.0 (off) or a finite cap > 0: scores become ``softcap * tanh(softmax_scale * q·k / softcap)``.
            On CUDA tensors the full, causal and sliding-window kernels have a softcap variant (the tanh compiled
            in); with a sink none is built (NotImplementedError).
        deterministic: make dq/dk/dv bitwise reproducible run to run by fixing the order of the dQ
            (and, for GQA, dK/dV) reductions. None (the default) follows torch's switch,
            ``torch.are_deterministic_algorithms_enabled()``, read at call time; a bool wins.
        schedule: the order of those reductions: "auto", "ascending", "descending", "shift" (full masks),
            "symmetric_shift", "split", "diagonal" (causal masks), for the mask ``causal`` and ``window_size`` describe (a band accepts
            every order). It is validated in both modes (so flipping ``deterministic`` never turns a valid call
            into an error) but only deterministic backwards use it.
        sm_margin: SMs to leave free for concurrent work; the backward's persistent grid uses the rest.
        return_lse: also return the log-sum-exp (batch, heads, seqlen_q), fp32, natural log, the sink included
            (not differentiable).

    Returns:
        out (batch, seqlen_q, heads, head_dim_v) in q's dtype, or (out, lse) if return_lse.
    """
    checks.check_options(softmax_scale, causal, deterministic, schedule, sm_margin, return_lse)
    shape = checks.check_tensors(q, k, v)
    window, softcap = features.check_features(causal, window_size, softcap, learnable_sink, schedule, shape.heads,
                                              shape.seqlen_q, shape.seqlen_k, q)
    scale = checks.softmax_scale_or_default(shape.head_dim, softmax_scale)
    out, lse = _FlashAttnFunc.apply(q, k, v, learnable_sink, scale, causal, window, softcap,
                                    checks.resolve_deterministic(deterministic), schedule, sm_margin)
    return (out, lse) if return_lse else out
