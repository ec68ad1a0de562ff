"""torch custom ops: ``flash_attn_dash::fwd`` and ``flash_attn_dash::bwd``.

They run the sm90 kernels on CUDA tensors and the PyTorch reference on CPU tensors, and have fake
(meta) implementations so ``torch.compile(fullgraph=True)`` and CUDA graphs can trace them.
Both carry the features of issue 19 as trailing arguments with FlashAttention's defaults (``window_size_left``,
``window_size_right``: ints, -1 = unbounded; ``softcap``: float, 0 = off; ``learnable_sink``: Tensor?), so calls
without them keep their meaning. ``bwd`` always returns four tensors, ``(dq, dk, dv, dsink)``: dsink is the sink's
gradient, (heads,) fp32 summed over batch and rows, or an empty (0,) fp32 tensor without a sink (one schema, one fake
kernel, whatever the call). On CUDA tensors the features the kernels lack raise before any launch
(:func:`flash_attn_dash.features.kernel_mask`); sliding windows run on the causal kernels, a softcap on the full or
causal kernels with the tanh compiled in (``fwd_out``/``bwd_out`` take it as their last argument).
The out-variants ``fwd_out`` / ``bwd_out`` (CUDA only, implemented in csrc/flash_api.cpp) write into
caller buffers; ``bwd_out`` takes a resolved launch (:mod:`flash_attn_dash.launch`), which :func:`bwd_into`
decides and passes. Tests use them to poison outputs and to read the dQ accumulation-order trace.
``varlen_fwd_out`` / ``varlen_bwd_out`` are the packed passes' (:mod:`flash_attn_dash.varlen_cuda`).
"""
from __future__ import annotations

import torch

from . import _ext, checks, debug, features
from .launch import BwdLaunch, bwd_launch
from .reference import attention_ref, attention_ref_grads

torch.library.define(
    "flash_attn_dash::fwd_out",
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, float softmax_scale, bool causal, "
    "int sm_margin, int window_left=-1, int window_right=-1, Tensor? sink=None, float softcap=0.0) -> ()",
)
torch.library.define(
    "flash_attn_dash::varlen_fwd_out",
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, "
    "int max_seqlen_q, int max_seqlen_k, Tensor(a!) out, Tensor(b!) lse, Tensor(c!) status, float softmax_scale, "
    "bool causal, int sm_margin, int window_left=-1, int window_right=-1, Tensor? sink=None, float softcap=0.0) -> ()",
)
torch.library.define(
    "flash_attn_dash::varlen_bwd_out",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, Tensor(a!) dq, Tensor(b!) dk, "
    "Tensor(c!) dv, Tensor(d!) status, float softmax_scale, bool causal, bool deterministic, int schedule, int grid, "
    "int sm_margin, int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? sink=None, "
    "Tensor(e!)? dsink=None, bool gqa_fold=False, int fold_min_len_q=0, int fold_min_len_k=0) -> ()",
)
torch.library.define(
    "flash_attn_dash::bwd_out",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, "
    "Tensor(c!) dv, Tensor(d!)? order_trace, float softmax_scale, bool causal, bool deterministic, "
    "int schedule, int grid, int claim_group, int sm_margin, Tensor(e!)? timeline=None, int window_left=-1, "
    "int window_right=-1, float softcap=0.0, bool gqa_fold=False, Tensor? sink=None, Tensor(f!)? dsink=None) -> ()",
)


def launch_for(q: torch.Tensor, k: torch.Tensor, causal: bool, deterministic: bool, schedule: str,
               num_sms: int, window: tuple[int, int] = (-1, -1), *, head_dim_v: int | None = None) -> BwdLaunch:
    """The resolved backward launch of this call (``causal``, ``window``: the kernels', :func:`.features.kernel_window`;
    ``head_dim_v``: v's head dim, default q's); in debug mode also prove its order for the grid it launches on
    (:mod:`flash_attn_dash.debug`)."""
    b, sq, h, d = q.shape
    launch = bwd_launch(causal, d, sq, k.shape[1], b, h, num_sms, deterministic, schedule, tuple(window), k.shape[2],
                        head_dim_v=head_dim_v)
    if debug.debug_enabled():
        debug.check_backward_launch(causal, b, sq, k.shape[1], h, k.shape[2], d, num_sms, launch, tuple(window))
    return launch


def check_cuda_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_margin: int) -> None:
    """Kernel constraints (build, head dim, strides, alignment, 32-bit sizes, arch, grid), checked before launch.

    They run inside the op, not in flash_attn_func, so torch.compile traces nothing device-specific.
    """
    _ext.require_kernels()
    checks.check_kernel_inputs({"q": q, "k": k, "v": v}, q.shape[-1], _ext.compiled_head_dims(q.dtype), v.shape[-1])
    checks.check_sm_margin(sm_margin, q.device)


def bwd_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, softmax_scale: float,
             causal: bool, deterministic: bool, schedule: str, sm_margin: int = 0,
             order_trace: torch.Tensor | None = None, timeline: torch.Tensor | None = None,
             window: tuple[int, int] = (-1, -1), softcap: float = 0.0, learnable_sink: torch.Tensor | None = None,
             dsink: torch.Tensor | None = None) -> BwdLaunch:
    """Run the CUDA backward into ``dq``/``dk``/``dv`` (and the optional debug buffers); returns the launch used.
    ``causal``, ``window``: the kernels' (:func:`.features.kernel_window`); ``softcap``: 0 or the forward's cap (the
    softcap kernels run the same order as the plain ones); ``learnable_sink`` with ``dsink`` ((heads,) fp32): the
    sink's gradient summed over batch and rows, from the backward preprocess's row sums (a fixed-order reduction)."""
    num_sms = checks.check_sm_margin(sm_margin, q.device)
    launch = launch_for(q, k, causal, deterministic, schedule, num_sms, window, head_dim_v=v.shape[-1])
    torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, order_trace, softmax_scale, causal,
                                      deterministic, launch.schedule_id, launch.grid, launch.claim_group, sm_margin,
                                      timeline, *window, softcap, launch.gqa_fold,
                                      None if learnable_sink is None else learnable_sink.float().contiguous(), dsink)
    return launch


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def forward_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 softmax_scale: float, causal: bool, sm_margin: int, *, window_size: tuple[int, int] = (-1, -1),
                 softcap: float = 0.0, learnable_sink: torch.Tensor | None = None) -> None:
    """Fill ``out`` (q's shape with v's head dim, any kernel-friendly strides) and ``lse`` (batch, heads, seqlen_q) fp32 on any
    device; callers that must return a layout of their own (torch's SDPA hook) pass views of it. ``lse`` includes
    the sink where there is one (FlashAttention-4's convention)."""
    if not q.is_cuda:
        ref_out, ref_lse = attention_ref(q, k, v, softmax_scale, causal, window_size=window_size, softcap=softcap,
                                         learnable_sink=learnable_sink)
        out.copy_(ref_out)
        lse.copy_(ref_lse)
        return
    causal, window = features.kernel_mask(causal, window_size, softcap, q.shape[1], k.shape[1],
                                          has_sink=learnable_sink is not None)
    check_cuda_inputs(q, k, v, sm_margin)
    if q.numel() == 0:
        return
    if k.shape[1] == 0:  # no keys: every row sees nothing (but the sink)
        out.zero_()
        if learnable_sink is None:
            lse.fill_(float("-inf"))
        else:
            lse.copy_(learnable_sink.to(torch.float32)[None, :, None].expand_as(lse))
        return
    sink = None if learnable_sink is None else learnable_sink.to(torch.float32).contiguous()
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, softmax_scale, causal, sm_margin, *window, sink, softcap)


@torch.library.custom_op("flash_attn_dash::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    sm_margin: int,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention: returns out (b, sq, h, dv) in q's dtype (dv: v's head dim) and lse (b, h, sq) fp32, natural
    log (the sink included)."""
    out = torch.empty(checks.out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    forward_into(q, k, v, out, lse, softmax_scale, causal, sm_margin, window_size=(window_size_left, window_size_right),
                 softcap=softcap, learnable_sink=learnable_sink)
    return out, lse


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, sm_margin, window_size_left=-1, window_size_right=-1, softcap=0.0,
      learnable_sink=None):
    return q.new_empty(checks.out_shape(q, v)), q.new_empty(_lse_shape(q), dtype=torch.float32)


def backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, softmax_scale: float,
                  causal: bool, deterministic: bool, schedule: str, sm_margin: int, *,
                  window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  learnable_sink: torch.Tensor | None = None, dsink: torch.Tensor | None = None) -> None:
    """Fill ``dq``/``dk``/``dv`` on any device; they may be views of one packed gradient buffer. With a sink,
    ``dsink`` (heads,) fp32, if given, receives its gradient summed over batch and rows."""
    if not q.is_cuda:
        if debug.debug_enabled():  # the order an H200 would run (none for an order its kernels refuse there)
            kernel_causal, window = features.kernel_window(causal, window_size, q.shape[1], k.shape[1])
            try:
                launch_for(q, k, kernel_causal, deterministic, schedule, checks.modeled_grid_size(sm_margin), window,
                           head_dim_v=v.shape[-1])
            except NotImplementedError:
                pass
        grads = attention_ref_grads(dout, q, k, v, softmax_scale, causal, window_size=window_size, softcap=softcap,
                                    learnable_sink=learnable_sink)
        for grad, ref in zip((dq, dk, dv), (grads.dq, grads.dk, grads.dv)):
            grad.copy_(ref)
        if dsink is not None and grads.dsink is not None:
            dsink.copy_(grads.dsink)
        return
    causal, window = features.kernel_mask(causal, window_size, softcap, q.shape[1], k.shape[1],
                                          has_sink=learnable_sink is not None)
    _ext.require_kernels()
    if q.numel() == 0 or k.numel() == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        return
    wants_dsink = learnable_sink is not None and dsink is not None
    bwd_into(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, schedule, sm_margin,
             window=window, softcap=softcap, learnable_sink=learnable_sink if wants_dsink else None,
             dsink=dsink if wants_dsink else None)


@torch.library.custom_op("flash_attn_dash::bwd", mutates_args=())
def bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward attention: (dq, dk, dv) in the input dtype and dsink (:func:`.features.sink_grad_buffer`); "auto" is
    resolved here, at run time."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = features.sink_grad_buffer(learnable_sink, q)
    backward_into(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, schedule, sm_margin,
                  window_size=(window_size_left, window_size_right), softcap=softcap, learnable_sink=learnable_sink,
                  dsink=dsink)
    return dq, dk, dv, dsink


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, schedule, sm_margin, window_size_left=-1,
      window_size_right=-1, softcap=0.0, learnable_sink=None):
    dsink = features.sink_grad_buffer(learnable_sink, q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink
