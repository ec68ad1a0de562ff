"""Debug mode: before each backward launch, prove its dQ order correct and deadlock-free for the launched grid.

The kernels trust the schedule model's guarantees (every visible (m, n) tile visited once, ranks 0..K_m-1 per dQ
tile, no CTA waiting on a contribution that can only come after it); debug mode re-checks them with
:meth:`flash_attn_dash.schedule.Plan.check` for the exact shape, schedule and grid size (SM count - sm_margin) of each
call and raises :class:`flash_attn_dash.schedule.ScheduleError` instead of launching a kernel that would hang.
Non-deterministic backwards wait only for the first (rank 0) contribution of each dQ tile, a subset of the
deterministic waits of the same walk, so the same check covers them. The launch itself (order, grid size, claim group)
must also equal what the model plans for the call.

Enable with ``FLASH_ATTN_DASH_DEBUG=1`` in the environment or :func:`set_debug`. Checks cost a model walk over all
steps of the call (about a second per 10^7 steps) and are cached per shape.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launch import BwdLaunch

ENV_VAR = "FLASH_ATTN_DASH_DEBUG"
_override: bool | None = None


def set_debug(enabled: bool | None) -> None:
    """Turn debug mode on (True) or off (False); None follows ``FLASH_ATTN_DASH_DEBUG`` again."""
    global _override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True, False or None, got {enabled!r}")
    _override = enabled


def debug_enabled() -> bool:
    """Whether backwards are checked before launch (:func:`set_debug`, else ``FLASH_ATTN_DASH_DEBUG`` not in
    ("", "0"))."""
    if _override is not None:
        return _override
    return os.environ.get(ENV_VAR, "") not in ("", "0")


@lru_cache(maxsize=256)
def check_backward_launch(causal: bool, batch: int, seqlen_q: int, seqlen_k: int, heads: int, heads_kv: int,
                          head_dim: int, num_sms: int, launch: BwdLaunch,
                          window: tuple[int, int] = (-1, -1)) -> None:
    """Raise ScheduleError unless ``launch`` (what the kernel will run) is the model's plan for this call and that plan
    is complete, consistently ranked and deadlock-free on its grid."""
    from .launch import model_mask
    from .schedule import ScheduleError, build_plan, bwd_tile_shape

    block_m, block_n = bwd_tile_shape(head_dim, causal)
    plan = build_plan(model_mask(causal, window), seqlen_q, seqlen_k, block_m, block_n, batch, heads, num_sms,
                      launch.schedule, heads_kv=heads_kv, claim_heads=launch.claim_group, window=window,
                      fold=launch.gqa_fold)
    if (plan.schedule_used, plan.num_ctas) != (launch.schedule, launch.grid):
        raise ScheduleError(f"launch {launch} disagrees with the model's plan ({plan.schedule_used} on {plan.num_ctas} "
                            "CTAs)")
    plan.check()
