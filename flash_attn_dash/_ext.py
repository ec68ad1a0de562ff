"""Loads the compiled extension, if this install built one, and says what it contains."""
from __future__ import annotations

import functools

import torch

try:
    from . import _C  # noqa: F401  (registers the CUDA implementations of the flash_attn_dash ops)

    _IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # CPU-only install, or a build for another torch
    _C = None
    _IMPORT_ERROR = exc


@functools.lru_cache(maxsize=None)
def compiled_instantiations() -> tuple[str, ...]:
    """Names like ``fwd_hdim128_bf16`` of the kernel instantiations in this build (empty without one)."""
    return tuple(_C.instantiations()) if _C is not None else ()


def compiled_head_dims(dtype: torch.dtype) -> tuple[int, ...]:
    """Head dims with both a forward and a backward kernel for ``dtype``."""
    tag = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    names = set(compiled_instantiations())
    return tuple(
        d for d in (64, 96, 128, 192, 256) if f"fwd_hdim{d}_{tag}" in names and f"bwd_hdim{d}_{tag}" in names
    )


def kernels_available(device: torch.device | int | None = None) -> bool:
    """True when the CUDA kernels were built and ``device`` (default: current) is an sm90 GPU."""
    if _C is None or not compiled_instantiations() or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def require_kernels() -> None:
    """Raise a clear error when CUDA tensors reach a build without kernels."""
    if _C is None:
        raise RuntimeError(
            "flash_attn_dash was installed without its CUDA kernels "
            f"({_IMPORT_ERROR}); reinstall on a machine with nvcc and a CUDA build of torch: "
            "pip install --no-build-isolation -e .  — or use flash_attn_dash.attention_ref for the PyTorch reference"
        )


# The op schemas the extension implements live in ops.py; define them whenever the extension loads.
from . import ops as _ops  # noqa: E402,F401
