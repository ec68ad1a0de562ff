"""The head dims the GPU tests cover."""
from __future__ import annotations

import os

import torch

from flash_attn_dash import _ext, variants


def gpu_head_dims() -> list[int]:
    """Every default-build entry of the variant table (a build that lacks one fails its tests) and any other entry
    this build compiled (``FLASH_DASH_HDIMS``)."""
    compiled = set(_ext.compiled_head_dims(torch.bfloat16)) | set(_ext.compiled_head_dims(torch.float16))
    return [h.qk for h in variants.HEAD_DIMS if h.default_build or h.qk in compiled]


def sanitize_head_dims() -> list[int]:
    """The head dims the compute-sanitizer scripts run: :func:`gpu_head_dims`, or the subset ``SANITIZE_HDIMS``
    (comma separated) names, so that one device call can check the kernels a change touched."""
    dims = gpu_head_dims()
    wanted = os.environ.get("SANITIZE_HDIMS")
    if not wanted:
        return dims
    picked = [int(x) for x in wanted.split(",")]
    missing = sorted(set(picked) - set(dims))
    if missing:
        raise ValueError(f"SANITIZE_HDIMS names head dims this build's tests do not cover: {missing} (have {dims})")
    return [d for d in dims if d in picked]
