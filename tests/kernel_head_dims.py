"""The head dims the GPU tests cover."""
from __future__ import annotations

import torch

from flash_attn_dash import _ext, variants


def gpu_head_dims() -> list[int]:
    """Every default-build entry of the variant table (a build that lacks one fails its tests) and any other entry
    this build compiled (``FLASH_DASH_HDIMS``)."""
    compiled = set(_ext.compiled_head_dims(torch.bfloat16)) | set(_ext.compiled_head_dims(torch.float16))
    return [h.qk for h in variants.HEAD_DIMS if h.default_build or h.qk in compiled]
