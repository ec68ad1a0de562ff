"""Argument checks run before anything is launched. Every error names the argument and what is accepted."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import variants
from .launch import check_schedule_name

SCHEDULES = ("auto",) + variants.SCHEDULE_NAMES
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
REFERENCE_DTYPES = KERNEL_DTYPES + (torch.float32, torch.float64)
# The variant table's head dims as messages name them: ints, and (qk, v) pairs where V's head dim differs (MLA).
KERNEL_HEAD_DIMS = tuple(h.label for h in variants.HEAD_DIMS)
# TMA needs 16-byte aligned bases and strides; CuTe shapes are 32-bit ints.
_ALIGN_BYTES = 16
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class AttnShape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    head_dim: int  # q and k
    head_dim_v: int  # v and the output


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__}")


def _check_deterministic(deterministic: object) -> None:
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError("deterministic must be a bool (True or False) or None (follow "
                        f"torch.are_deterministic_algorithms_enabled()), got {type(deterministic).__name__}")


def resolve_deterministic(deterministic: bool | None) -> bool:
    """``deterministic=None`` follows torch's switch (``torch.use_deterministic_algorithms``); a bool wins."""
    _check_deterministic(deterministic)
    return torch.are_deterministic_algorithms_enabled() if deterministic is None else deterministic


def check_options(
    softmax_scale: float | None,
    causal: bool,
    deterministic: bool | None,
    schedule: str,
    sm_margin: int,
    return_lse: bool,
) -> None:
    """Validate the non-tensor arguments of flash_attn_func (of ``schedule``, its name: whether the mask has that order
    depends on the window and the shape, :func:`flash_attn_dash.features.check_features`)."""
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    _require_bool("causal", causal)
    _check_deterministic(deterministic)
    _require_bool("return_lse", return_lse)
    check_schedule_name(schedule)
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int):
        raise TypeError(f"sm_margin must be an int >= 0, got {type(sm_margin).__name__}")
    if sm_margin < 0:
        raise ValueError(f"sm_margin must be >= 0, got {sm_margin}")


def softmax_scale_or_default(head_dim: int, softmax_scale: float | None) -> float:
    """The scale of q·kᵀ: ``softmax_scale``, or head_dim ** -0.5 when it is None (q's and k's head dim, whatever
    v's)."""
    return head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)


def check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  names: tuple[str, str, str] = ("q", "k", "v")) -> AttnShape:
    """Validate q, k, v for the (batch, seqlen, heads, head_dim) layout; return the problem shape. v's head dim may
    differ from q's and k's (DeepSeek's MLA: 192 and 128); the output has v's.

    ``names`` are what errors call them (views of a packed argument are named as its slices)."""
    qn, kn, vn = names
    for name, t in ((qn, q), (kn, k), (vn, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
    for name, t in ((kn, k), (vn, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype must equal {qn}.dtype ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {qn}'s device ({q.device}), got {t.device}")
    allowed = KERNEL_DTYPES if q.is_cuda else REFERENCE_DTYPES
    if q.dtype not in allowed:
        accepted = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{qn}.dtype must be one of {accepted} on {q.device.type}, got {q.dtype}")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if bk != b:
        raise ValueError(f"{kn}.shape[0] (batch) must equal {qn}.shape[0] = {b}, got {bk}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"{vn}.shape[:3] (batch, seqlen, heads) must equal {kn}.shape[:3] {tuple(k.shape[:3])}, "
                         f"got {tuple(v.shape[:3])} ({vn} may differ from {kn} in head_dim only)")
    if dk != d:
        raise ValueError(f"{kn}.shape[3] (head_dim) must equal {qn}.shape[3] = {d}, got {dk}")
    if hk == 0 or h % hk != 0:
        raise ValueError(f"{qn} heads ({h}) must be a multiple of {kn}/{vn} heads ({hk}) for GQA/MQA")
    return AttnShape(b, sq, sk, h, hk, d, v.shape[3])


def out_shape(q: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    """The attention output's shape: q's (dense 4-D or packed 3-D) with v's head dim."""
    return (*q.shape[:-1], v.shape[-1])


def head_dim_label(head_dim: int, head_dim_v: int | None = None) -> int | tuple[int, int]:
    """How messages and :data:`KERNEL_HEAD_DIMS` name a call's head dims: ``head_dim``, or ``(head_dim, head_dim_v)``
    where v's differs."""
    return head_dim if head_dim_v is None or head_dim_v == head_dim else (head_dim, head_dim_v)


def check_kernel_head_dim(head_dim: int, head_dim_v: int | None = None) -> None:
    """Raise ValueError unless the variant table has kernels for ``head_dim`` (q, k) and ``head_dim_v`` (v; default
    ``head_dim``), on any device: what a GPU build accepts."""
    label = head_dim_label(head_dim, head_dim_v)
    if label not in KERNEL_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {KERNEL_HEAD_DIMS} for the kernels (pairs: (q/k, v) head dims; "
                         f"flash_attn_dash/variants.py lists them; CPU tensors run the reference for any head dims), "
                         f"got {label}")


def not_compiled_message(head_dim: int, compiled_head_dims: tuple, head_dim_v: int | None = None) -> str:
    """Why head dims of the variant table (``head_dim``, ``head_dim_v``) cannot run on this build: which head dims it
    has (:data:`KERNEL_HEAD_DIMS`' names), whether the entry is left out of default builds (``HeadDim.default_build``)
    and the build command that adds it (``FLASH_DASH_HDIMS`` names a pair ``192v128``)."""
    label = head_dim_label(head_dim, head_dim_v)
    built = ", ".join(str(d) for d in compiled_head_dims) or "none"
    wanted = [h.build_name for h in variants.HEAD_DIMS if h.label in set(compiled_head_dims) | {label}]
    why = "" if variants.head_dim(head_dim, head_dim_v).default_build else (
        " (default builds leave it out until its kernels pass the GPU tests)")
    return (f"head_dim {label} was not compiled into this build (built: {built}){why}; build it with "
            f"FLASH_DASH_HDIMS={','.join(wanted)} pip install --no-build-isolation -e .")


def check_kernel_inputs(tensors: dict[str, torch.Tensor], head_dim: int, compiled_head_dims: tuple,
                        head_dim_v: int | None = None) -> None:
    """Constraints of the sm90 kernels: head dims (``compiled_head_dims`` as :data:`KERNEL_HEAD_DIMS` names them),
    strides, alignment, 32-bit sizes, architecture."""
    check_kernel_head_dim(head_dim, head_dim_v)
    if head_dim_label(head_dim, head_dim_v) not in compiled_head_dims:
        raise ValueError(not_compiled_message(head_dim, compiled_head_dims, head_dim_v))
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
        elem = t.element_size()
        for dim in range(3):
            if t.size(dim) > 1 and (t.stride(dim) * elem) % _ALIGN_BYTES != 0:
                raise ValueError(
                    f"{name}.stride({dim}) = {t.stride(dim)} elements is not a multiple of {_ALIGN_BYTES} bytes; "
                    "call .contiguous() first"
                )
        if t.data_ptr() % _ALIGN_BYTES != 0:
            raise ValueError(f"{name} must start at a {_ALIGN_BYTES}-byte aligned address; call .contiguous() first")
        if t.numel() > _INT32_MAX or max(t.shape) > _INT32_MAX:
            raise ValueError(f"{name} has {t.numel()} elements, over the 32-bit indexing limit of {_INT32_MAX}")
    dev = next(iter(tensors.values())).device
    major, minor = torch.cuda.get_device_capability(dev)
    if (major, minor) != (9, 0):
        raise RuntimeError(
            f"flash_attn_dash kernels need an sm90 (Hopper) GPU; {torch.cuda.get_device_name(dev)} is sm{major}{minor}. "
            "Use flash_attn_dash.attention_ref for the PyTorch reference."
        )


H200_SMS = 132  # what CPU tensors model: the GPU the benchmarks and the auto table were measured on


def modeled_grid_size(sm_margin: int) -> int:
    """The persistent grid size CPU tensors model (an H200's 132 SMs - sm_margin), rejecting margins that leave
    no SM."""
    if sm_margin >= H200_SMS:
        raise ValueError(f"sm_margin must be < {H200_SMS} (the H200 SM count modelled for CPU tensors), got {sm_margin}")
    return H200_SMS - sm_margin


def check_sm_margin(sm_margin: int, device: torch.device) -> int:
    """Return the persistent grid size (SM count - sm_margin), rejecting margins that leave no SM."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if sm_margin >= sms:
        raise ValueError(f"sm_margin must be < the SM count ({sms}) of {device}, got {sm_margin}")
    return sms - sm_margin
