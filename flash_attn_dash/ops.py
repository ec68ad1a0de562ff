"""torch custom ops: ``flash_attn_dash::fwd`` and ``flash_attn_dash::bwd``.

They run the sm90 kernels on CUDA tensors and the PyTorch reference on CPU tensors, and have fake
(meta) implementations so ``torch.compile(fullgraph=True)`` and CUDA graphs can trace them.
The out-variants ``fwd_out`` / ``bwd_out`` (CUDA only, implemented in csrc/flash_api.cpp) write into
caller buffers; tests use them to poison outputs and to read the dQ accumulation-order trace, and
``flash_attn_dash.bwd_timeline`` passes ``bwd_out`` a buffer for the store warps' timeline (diagnostic builds).
"""
from __future__ import annotations

import torch

from . import _ext, checks, debug
from .reference import attention_ref, attention_ref_bwd

SCHEDULE_IDS = {"ascending": 0, "descending": 1, "shift": 2, "symmetric_shift": 3}
# Orders the compiled backward implements (hopper/bwd_schedule.hpp), the same the planner models.
KERNEL_SCHEDULES = ("ascending", "descending", "shift", "symmetric_shift")


def resolve_schedule(
    schedule: str, causal: bool, deterministic: bool, q_shape, seqlen_k: int, num_sms: int
) -> str:
    """The dQ order a backward call runs ("auto" asks the schedule model).

    Non-deterministic backwards ignore ``schedule`` (their dQ adds are unordered) and walk the tiles the fastest
    way: for causal masks "symmetric_shift" where it applies (equal work per CTA on the pair grid), else
    "descending"; for full masks "shift". symmetric_shift outside its assumptions (seqlen_q != seqlen_k, odd
    K/V tile count) runs "descending". ``shift`` stays "shift": only (head, wave) groups with more K/V tiles in
    flight than Q tiles fall back. The kernel's launcher applies the same rules (hopper/bwd_schedule.hpp,
    choose_launch).
    """
    if not deterministic or schedule == "symmetric_shift":
        from .schedule.orders import nondeterministic_walk, symmetric_shift_fallback
        from .schedule.tiles import TileGrid, bwd_tile_shape

        block_m, block_n = bwd_tile_shape(q_shape[3], causal)
        grid = TileGrid("causal" if causal else "full", q_shape[1], seqlen_k, block_m, block_n)
        if not deterministic:
            return nondeterministic_walk(grid)
        return "descending" if symmetric_shift_fallback(grid) else schedule
    if schedule != "auto":
        return schedule
    from .schedule.auto import choose_schedule

    b, sq, h, d = q_shape
    name, _reason = choose_schedule(
        "causal" if causal else "full", d, sq, seqlen_k, b, h, num_sms, allowed=KERNEL_SCHEDULES
    )
    return name


def _resolve_for_launch(q: torch.Tensor, k: torch.Tensor, causal: bool, deterministic: bool, schedule: str,
                        num_sms: int) -> str:
    """resolve_schedule for this call; in debug mode also prove the order for its grid (flash_attn_dash.debug)."""
    used = resolve_schedule(schedule, causal, deterministic, q.shape, k.shape[1], num_sms)
    if debug.debug_enabled():
        b, sq, h, d = q.shape
        debug.check_backward_schedule(causal, b, sq, k.shape[1], h, k.shape[2], d, num_sms, used)
    return used


torch.library.define(
    "flash_attn_dash::fwd_out",
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, float softmax_scale, bool causal, "
    "int sm_margin) -> ()",
)
torch.library.define(
    "flash_attn_dash::bwd_out",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, "
    "Tensor(c!) dv, Tensor(d!)? order_trace, float softmax_scale, bool causal, bool deterministic, "
    "int schedule, int sm_margin, Tensor(e!)? timeline=None) -> ()",
)


def check_cuda_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_margin: int) -> None:
    """Kernel constraints (build, head dim, strides, alignment, 32-bit sizes, arch, grid), checked before launch.

    They run inside the op, not in flash_attn_func, so torch.compile traces nothing device-specific.
    """
    _ext.require_kernels()
    checks.check_kernel_inputs({"q": q, "k": k, "v": v}, q.shape[-1], _ext.compiled_head_dims(q.dtype))
    checks.check_sm_margin(sm_margin, q.device)


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("flash_attn_dash::fwd", mutates_args=())
def fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, sm_margin: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention: returns out (b, sq, h, d) in q's dtype and lse (b, h, sq) fp32, natural log."""
    if not q.is_cuda:
        out, lse = attention_ref(q, k, v, softmax_scale, causal)
        return out.to(q.dtype).contiguous(), lse.contiguous()
    check_cuda_inputs(q, k, v, sm_margin)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return out, lse
    if k.shape[1] == 0:  # no keys: every row sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, softmax_scale, causal, sm_margin)
    return out, lse


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, sm_margin):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


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
    if not q.is_cuda:
        if debug.debug_enabled():  # the order an H200 would run
            _resolve_for_launch(q, k, causal, deterministic, schedule, checks.modeled_grid_size(sm_margin))
        return attention_ref_bwd(dout, q, k, v, softmax_scale, causal)
    _ext.require_kernels()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    num_sms = checks.check_sm_margin(sm_margin, q.device)
    used = _resolve_for_launch(q, k, causal, deterministic, schedule, num_sms)
    torch.ops.flash_attn_dash.bwd_out(
        dout, q, k, v, out, lse, dq, dk, dv, None, softmax_scale, causal, deterministic, SCHEDULE_IDS[used], sm_margin
    )
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, schedule, sm_margin):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
