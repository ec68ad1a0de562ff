"""Core attention disaggregation (CAD, after DistCA) on torch.distributed, bitwise invariant across plans.

Documents are cut on a canonical chunk grid; a pure planner assigns chunks to attention servers to balance
the attention work; :func:`cad_attn_func` ships queries and K/V prefixes there with all_to_all_single,
runs the deterministic kernels per chunk, and folds dK/dV on the owner in chunk order. The planner imports
neither torch nor numpy; the attention modules load on first use.

On every rank of the group, per batch::

    doc_lens = gather_doc_lens(cu_seqlens)             # or known from the data loader
    plan = plan_cad(doc_lens, 2048, 0.05, heads=32, heads_kv=8, head_dim=128)
    out = cad_attn_func(q, k, v, cu_seqlens, plan=plan)  # (total_r, heads, head_dim), differentiable
"""
from __future__ import annotations

import importlib
from typing import Any

from .pingpong import CADPingPongPlan, plan_cad_pingpong
from .plan import CADPlan, CADPlanError, Move, Task, plan_cad

_LAZY = {"cad_attn_func": "attention", "fold_partials": "fold", "gather_doc_lens": "comm"}

__all__ = ["CADPingPongPlan", "CADPlan", "CADPlanError", "Move", "Task", "cad_attn_func", "fold_partials",
           "gather_doc_lens", "plan_cad", "plan_cad_pingpong"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
