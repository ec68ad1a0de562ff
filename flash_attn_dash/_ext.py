"""Loads the compiled extension, if this install built one, and says what it contains."""
from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from . import variants

try:
    from . import _C  # noqa: F401  (registers the CUDA implementations of the flash_attn_dash ops)

    _IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # CPU-only install, or a build for another torch
    _C = None
    _IMPORT_ERROR = exc

_DTYPE_TAG = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@functools.lru_cache(maxsize=None)
def compiled_instantiations() -> tuple[str, ...]:
    """Names like ``fwd_hdim128_bf16`` of the kernel instantiations in this build (empty without one)."""
    return tuple(_C.instantiations()) if _C is not None else ()


def compiled_head_dims(dtype: torch.dtype) -> tuple:
    """Head dims of the variant table with both a forward and a backward kernel for ``dtype`` in this build, named as
    ``checks.KERNEL_HEAD_DIMS`` names them (``(192, 128)`` for a V head dim of its own)."""
    tag = _DTYPE_TAG.get(dtype)
    names = set(compiled_instantiations())
    return tuple(h.label for h in variants.HEAD_DIMS
                 if f"fwd_{h.tag}_{tag}" in names and f"bwd_{h.tag}_{tag}" in names)


def build_info() -> dict[str, Any]:
    """What this install built: ``kernels`` (instantiation names), ``no_kernels_reason`` (why none were built, or
    None), as setup.py recorded them, plus ``loaded`` (the extension imported) and ``import_error``."""
    path = Path(__file__).with_name("_build_info.json")
    info = json.loads(path.read_text()) if path.is_file() else {"kernels": [], "no_kernels_reason": "not recorded"}
    return {**info, "loaded": _C is not None, "import_error": None if _C is not None else str(_IMPORT_ERROR)}


@functools.lru_cache(maxsize=None)
def warn_if_gpu_without_kernels() -> None:
    """Once per process: an sm90 GPU is visible but this install has no kernels (a CPU-only build, whose message
    pip hides), so CUDA tensors will be refused."""
    if _C is None and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        reason = build_info()["no_kernels_reason"]
        warnings.warn(f"flash_attn_dash: an sm90 GPU is present but no CUDA kernels were built ({reason}); "
                      "reinstall with: pip install --no-build-isolation -e .", RuntimeWarning, stacklevel=3)


def kernels_available(device: torch.device | int | None = None) -> bool:
    """True when the CUDA kernels were built and ``device`` (default: current) is an sm90 GPU."""
    if _C is None or not compiled_instantiations() or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def require_kernels() -> None:
    """Raise a clear error when CUDA tensors reach a build without kernels."""
    if _C is None:
        reason = build_info()["no_kernels_reason"]
        raise RuntimeError(
            f"flash_attn_dash was installed without its CUDA kernels (build: {reason}; import: {_IMPORT_ERROR}); "
            "reinstall on a machine with nvcc and a CUDA build of torch: "
            "pip install --no-build-isolation -e .  — or use flash_attn_dash.attention_ref for the PyTorch reference"
        )
