"""The head dims and dtypes the GPU tests cover."""
from __future__ import annotations

import os

import torch

from flash_attn_dash import _ext, variants


class HeadDims(int):
    """A head dim the GPU tests run: as an int, q's and k's (the tests' shapes, scales and, for equal head dims, ids
    as before pairs existed); ``v``, v's and the output's. ``str`` is the build name, ``128`` or ``192v128``, so a
    pair gets its own test ids; equality and hashing tell (192, 128) from 192."""

    v: int

    def __new__(cls, qk: int, v: int) -> HeadDims:
        obj = super().__new__(cls, qk)
        obj.v = v
        return obj

    def __str__(self) -> str:
        return f"{int(self)}" if self.v == int(self) else f"{int(self)}v{self.v}"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HeadDims):
            return (int(self), self.v) == (int(other), other.v)
        return self.v == int(self) and int.__eq__(self, other)

    def __ne__(self, other: object) -> bool:  # int's own __ne__ would ignore v
        return not self == other

    def __hash__(self) -> int:
        return hash(int(self)) if self.v == int(self) else hash((int(self), self.v))


def head_dim_v(d: int) -> int:
    """V's head dim of a test's head dim (a :class:`HeadDims`, or a plain int: the same as q's)."""
    return getattr(d, "v", d)


DTYPES = (torch.bfloat16, torch.float16)


def built_only() -> bool:
    """``FLASH_DASH_TEST_BUILT_ONLY=1``: the tests cover only what this build compiled, for a subset build on the
    device (a variant linked as bf16 hdim 64/128, say; the tests that always run bf16 hdim 64 or 128 are reported as
    skipped when the build lacks them: tests/conftest.py). Without it a build that lacks a default-build head dim or a
    dtype fails those tests instead of leaving them out."""
    return os.environ.get("FLASH_DASH_TEST_BUILT_ONLY") == "1"


def gpu_dtypes() -> list[torch.dtype]:
    """bf16 and fp16 (with :func:`built_only`, those this build compiled)."""
    return [d for d in DTYPES if not built_only() or _ext.compiled_head_dims(d)]


def dtype_id(dtype: torch.dtype) -> str:
    """A dtype's test id: ``bf16`` or ``fp16``."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def gpu_head_dims(v_pairs: bool = False) -> list[HeadDims]:
    """Every default-build entry of the variant table (a build that lacks one fails its tests, unless
    :func:`built_only`) and any other entry this build compiled (``FLASH_DASH_HDIMS``); entries with a V head dim of
    their own (MLA's (192, 128)) only for ``v_pairs``: the tests that give v (and out, dout, dv) :func:`head_dim_v`
    columns."""
    compiled = {label for d in DTYPES for label in _ext.compiled_head_dims(d)}
    return [HeadDims(h.qk, h.v) for h in variants.HEAD_DIMS
            if (h.label in compiled or (h.default_build and not built_only())) and (v_pairs or h.v == h.qk)]


def sanitize_head_dims() -> list[HeadDims]:
    """The head dims the compute-sanitizer scripts run: :func:`gpu_head_dims`, or the subset ``SANITIZE_HDIMS``
    (comma separated build names: ``128``, ``192v128``) names, so that one device call can check the kernels a change
    touched."""
    dims = gpu_head_dims(v_pairs=True)
    wanted = os.environ.get("SANITIZE_HDIMS")
    if not wanted:
        return dims
    picked = [x.strip() for x in wanted.split(",")]
    have = [str(d) for d in dims]
    missing = [p for p in picked if p not in have]
    if missing:
        raise ValueError(f"SANITIZE_HDIMS names head dims this build's tests do not cover: {missing} (have "
                         f"{', '.join(have)})")
    return [d for d in dims if str(d) in picked]

