"""flash-attn-dash: deterministic FlashAttention for Hopper whose backward is bitwise reproducible.

Importing the package is cheap: torch and the custom ops load on first use of the attention API, so
the schedule model and the ``flash-attn-dash plan`` command run without them.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "flash_attn_func": "interface",
    "backward_schedule_used": "interface",
    "flash_attn_qkvpacked_func": "packed",
    "flash_attn_kvpacked_func": "packed",
    "flash_attn_varlen_qkvpacked_func": "packed",
    "flash_attn_varlen_kvpacked_func": "packed",
    "flash_attn_varlen_func": "varlen",
    "varlen_schedule_used": "varlen",
    "attention_ref": "reference",
    "kernels_available": "_ext",
    "build_info": "_ext",
    "SCHEDULES": "checks",
    "set_debug": "debug",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
