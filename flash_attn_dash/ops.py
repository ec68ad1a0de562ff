"""torch custom ops: ``flash_attn_dash::fwd`` and ``flash_attn_dash::bwd``.

They run the sm90 kernels on CUDA tensors and the PyTorch reference on CPU tensors, and have fake
(meta) implementations so ``torch.compile(fullgraph=True)`` and CUDA graphs can trace them.
The out-variants ``fwd_out`` / ``bwd_out`` (CUDA only, implemented in csrc/flash_api.cpp) write into
caller buffers; ``bwd_out`` takes a resolved launch (:mod:`flash_attn_dash.launch`), which :func:`bwd_into`
decides and passes. Tests use them to poison outputs and to read the dQ accumulation-order trace.
"""
from __future__ import annotations

import torch

from . import _ext, checks, debug
from .launch import BwdLaunch, bwd_launch
from .reference import attention_ref, attention_ref_bwd

torch.library.define(
    "flash_attn_dash::fwd_out",
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, float softmax_scale, bool causal, "
    "int sm_margin) -> ()",
)
torch.library.define(
    "flash_attn_dash::bwd_out",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, "
    "Tensor(c!) dv, Tensor(d!)? order_trace, float softmax_scale, bool causal, bool deterministic, "
    "int schedule, int grid, int claim_group, int sm_margin, Tensor(e!)? timeline=None) -> ()",
)


def launch_for(q: torch.Tensor, k: torch.Tensor, causal: bool, deterministic: bool, schedule: str,
               num_sms: int) -> BwdLaunch:
    """The resolved backward launch of this call; in debug mode also prove its order for the grid it launches on
    (:mod:`flash_attn_dash.debug`)."""
    b, sq, h, d = q.shape
    launch = bwd_launch(causal, d, sq, k.shape[1], b, h, num_sms, deterministic, schedule)
    if debug.debug_enabled():
        debug.check_backward_launch(causal, b, sq, k.shape[1], h, k.shape[2], d, num_sms, launch)
    return launch


def check_cuda_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_margin: int) -> None:
    """Kernel constraints (build, head dim, strides, alignment, 32-bit sizes, arch, grid), checked before launch.

    They run inside the op, not in flash_attn_func, so torch.compile traces nothing device-specific.
    """
    _ext.require_kernels()
    checks.check_kernel_inputs({"q": q, "k": k, "v": v}, q.shape[-1], _ext.compiled_head_dims(q.dtype))
    checks.check_sm_margin(sm_margin, q.device)


def bwd_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, softmax_scale: float,
             causal: bool, deterministic: bool, schedule: str, sm_margin: int = 0,
             order_trace: torch.Tensor | None = None, timeline: torch.Tensor | None = None) -> BwdLaunch:
    """Run the CUDA backward into ``dq``/``dk``/``dv`` (and the optional debug buffers); returns the launch used."""
    num_sms = checks.check_sm_margin(sm_margin, q.device)
    launch = launch_for(q, k, causal, deterministic, schedule, num_sms)
    torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, order_trace, softmax_scale, causal,
                                      deterministic, launch.schedule_id, launch.grid, launch.claim_group, sm_margin,
                                      timeline)
    return launch


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def forward_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 softmax_scale: float, causal: bool, sm_margin: int) -> None:
    """Fill ``out`` (shaped like q, any kernel-friendly strides) and ``lse`` (batch, heads, seqlen_q) fp32 on any
    device; callers that must return a layout of their own (torch's SDPA hook) pass views of it."""
    if not q.is_cuda:
        ref_out, ref_lse = attention_ref(q, k, v, softmax_scale, causal)
        out.copy_(ref_out)
        lse.copy_(ref_lse)
        return
    check_cuda_inputs(q, k, v, sm_margin)
    if q.numel() == 0:
        return
    if k.shape[1] == 0:  # no keys: every row sees nothing
        out.zero_()
        lse.fill_(float("-inf"))
        return
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, softmax_scale, causal, sm_margin)


@torch.library.custom_op("flash_attn_dash::fwd", mutates_args=())
def fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, sm_margin: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention: returns out (b, sq, h, d) in q's dtype and lse (b, h, sq) fp32, natural log."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    forward_into(q, k, v, out, lse, softmax_scale, causal, sm_margin)
    return out, lse


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, sm_margin):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


def backward_into(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, softmax_scale: float,
                  causal: bool, deterministic: bool, schedule: str, sm_margin: int) -> None:
    """Fill ``dq``/``dk``/``dv`` on any device; they may be views of one packed gradient buffer."""
    if not q.is_cuda:
        if debug.debug_enabled():  # the order an H200 would run
            launch_for(q, k, causal, deterministic, schedule, checks.modeled_grid_size(sm_margin))
        for grad, ref in zip((dq, dk, dv), attention_ref_bwd(dout, q, k, v, softmax_scale, causal)):
            grad.copy_(ref)
        return
    _ext.require_kernels()
    if q.numel() == 0 or k.numel() == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        return
    bwd_into(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, schedule, sm_margin)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward attention: (dq, dk, dv) in the input dtype; "auto" is resolved here, at run time."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    backward_into(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, schedule, sm_margin)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, schedule, sm_margin):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
