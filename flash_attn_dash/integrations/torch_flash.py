"""flash_attn_dash as PyTorch's flash-attention implementation (``torch.nn.attention.activate_flash_attention_impl``).

torch lets a library replace the CUDA kernels of its flash-attention aten ops. :func:`activate` replaces them with
ours, so ``torch.nn.functional.scaled_dot_product_attention`` on the flash backend and
``torch.nn.attention.varlen.varlen_attn`` (what TorchTitan's ``varlen`` attention calls) run flash_attn_dash, forward
and backward (torch's autograd formulas call the backward ops). ``torch.nn.attention.restore_flash_attention_impl()``
puts torch's own kernels back.

The aten ops carry no determinism flag and no schedule: backwards follow torch's switch
(``torch.use_deterministic_algorithms``) and the orders set with :func:`set_schedule`; the SMs left free follow torch's
SM carveout (``torch._C._set_sm_carveout_experimental``), as torch's own FA3 hook does. Every argument our kernels do
not implement (dropout, the debug mask, ALiBi, paged KV, split-KV, head dims without kernels) raises an error naming
it, never a result computed some other way. Sliding windows (``window_size_left``/``window_size_right``) take
:func:`flash_attn_dash.flash_attn_func`'s path: a window that is the full or causal mask runs those kernels, a band
raises the ops' NotImplementedError on CUDA tensors (no kernel yet) and runs the reference on CPU tensors.
"""
from __future__ import annotations

import contextlib
import functools
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import checks, interface, ops, variants, varlen_ops  # noqa: F401  (interface and varlen_ops define our ops)
from ..launch import check_schedule
from ..varlen_checks import VarlenShape, check_varlen_args

__all__ = [
    "IMPL_NAME",
    "register",
    "activate",
    "set_schedule",
    "get_schedule",
    "scaled_dot_product_flash_attention",
    "scaled_dot_product_flash_attention_backward",
    "flash_attention_forward",
    "flash_attention_forward_no_dropout_inplace",
    "flash_attention_backward",
]

IMPL_NAME = "flash_attn_dash"
MASKS = ("full", "causal")
# The hook's API in torch.nn.attention (torch 2.13.0 has it).
_HOOK_FUNCTIONS = ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl")
_NAMES = ("query", "key", "value")

_schedules: dict[str, str] = {"full": "auto", "causal": "auto"}
# aten op name -> our implementation, filled by @_implements.
_ATEN_IMPLS: dict[str, Callable[..., Any]] = {}


def set_schedule(schedule: str, mask: str | None = None) -> None:
    """Set the dQ accumulation order that deterministic backwards of the aten ops run (``schedule`` of
    :func:`flash_attn_dash.flash_attn_func`; the default is ``"auto"`` for both masks).

    Args:
        schedule: "auto", "ascending", "descending", "shift" (full masks) or "symmetric_shift", "split",
            "diagonal" (causal masks).
        mask: "full" or "causal" sets the order of that mask only; None sets both, so it accepts only the orders
            defined for both masks ("auto", "ascending", "descending").

    Validated here, so no backward fails on it later. Non-deterministic backwards ignore it, as in flash_attn_func.
    """
    if mask is not None and mask not in MASKS:
        raise ValueError(f"mask must be None (both masks), 'full' or 'causal', got {mask!r}")
    if mask is None:
        if schedule in variants.SCHEDULE_NAMES and len(variants.schedule(schedule).masks) == 1:
            only = variants.schedule(schedule).masks[0]
            raise ValueError(f"schedule={schedule!r} is defined for {only} masks only, and mask=None sets both: "
                             f"pass mask={only!r}")
        check_schedule(schedule, causal=False)  # an unknown name: the error lists the accepted ones
        _schedules.update(full=schedule, causal=schedule)
    else:
        check_schedule(schedule, causal=mask == "causal")
        _schedules[mask] = schedule


def get_schedule(causal: bool) -> str:
    """The order deterministic backwards of the aten ops run for this mask (set with :func:`set_schedule`)."""
    return _schedules["causal" if causal else "full"]


def _sm_margin(device: torch.device) -> int:
    """torch's SM carveout: how torch's FA3 hook and inductor leave SMs to concurrent work (the aten ops have no
    knob). Checked against the SMs of ``device`` (CPU tensors: the modelled H200), as a GPU build would."""
    margin = torch._C._get_sm_carveout_experimental() or 0
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else checks.H200_SMS
    if not 0 <= margin < sms:
        raise ValueError(f"torch's SM carveout (torch._C._set_sm_carveout_experimental) is flash_attn_dash's "
                         f"sm_margin: it must be in [0, {sms}) for {sms} SMs, got {margin}")
    return margin


def _implements(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as our kernel of ``aten::op``; its errors name the op and this implementation, since the
    caller called F.scaled_dot_product_attention or varlen_attn and should see who refused what."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def impl(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError, NotImplementedError, RuntimeError) as e:
                if e.args and isinstance(e.args[0], str):
                    e.args = (f"aten::{op} on {IMPL_NAME}: {e.args[0]}",) + e.args[1:]
                raise
        _ATEN_IMPLS[op] = impl
        return impl
    return wrap


class _Handle:
    """What torch's registry keeps while we are active; ``remove()`` (restore_flash_attention_impl) drops our
    kernels."""

    def __init__(self, library: torch.library.Library) -> None:
        self._library: torch.library.Library | None = library

    def remove(self) -> None:
        if self._library is not None:
            # A Library unregisters when destroyed; destroy it now rather than whenever it is garbage-collected.
            self._library._destroy()
            self._library = None


def _register_kernels(dispatch_key: str = "CUDA") -> _Handle:
    """Our implementations as the ``dispatch_key`` kernels of the aten ops (torch calls this on activation)."""
    library = torch.library.Library("aten", "IMPL", dispatch_key)
    for op, impl in _ATEN_IMPLS.items():
        if hasattr(torch.ops.aten, op):  # torch versions differ in which of these ops they define
            library.impl(op, impl, dispatch_key)
    return _Handle(library)


def _hook() -> types.ModuleType:
    import torch.nn.attention as attention

    missing = [name for name in _HOOK_FUNCTIONS if not hasattr(attention, name)]
    if missing:
        raise RuntimeError(f"torch {torch.__version__} has no {', '.join('torch.nn.attention.' + m for m in missing)}: "
                           "the flash-attention hook flash_attn_dash registers with (torch 2.13.0 has it). Upgrade "
                           "torch, or call flash_attn_dash.flash_attn_func directly.")
    return attention


def register() -> None:
    """Register flash_attn_dash under :data:`IMPL_NAME` ("flash_attn_dash") with torch's flash-attention registry
    (``torch.nn.attention.list_flash_attention_impls()`` then lists it). Activates nothing; idempotent.

    Raises RuntimeError naming the installed torch version if it has no flash-attention hook.
    """
    _hook().register_flash_attention_impl(IMPL_NAME, register_fn=_register_kernels)


def activate() -> None:
    """:func:`register`, then make flash_attn_dash torch's flash-attention implementation
    (``torch.nn.attention.activate_flash_attention_impl``): the flash backend of ``F.scaled_dot_product_attention``
    and ``varlen_attn`` run our kernels, forward and backward, until
    ``torch.nn.attention.restore_flash_attention_impl()``.

    Only CUDA kernels are replaced: CPU tensors keep torch's CPU attention.
    """
    register()
    _hook().activate_flash_attention_impl(IMPL_NAME)


# --- argument checks ---------------------------------------------------------------------------------------------


def _check_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 (flash_attn_dash has no attention dropout), got {dropout_p}")


def _check_forward_options(dropout_p: float, return_debug_mask: bool, alibi_slopes: torch.Tensor | None = None,
                           block_table: torch.Tensor | None = None, num_splits: int | None = None) -> None:
    _check_dropout(dropout_p)
    if return_debug_mask:
        raise ValueError("return_debug_mask must be False (flash_attn_dash returns no debug attention mask), got True")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes must be None (flash_attn_dash has no ALiBi bias), got a tensor")
    if block_table is not None:
        raise ValueError("block_table must be None (flash_attn_dash has no paged KV cache), got a tensor")
    if num_splits not in (None, 0, 1):
        raise ValueError(f"num_splits must be None, 0 or 1 (flash_attn_dash's forward does not split the keys), "
                         f"got {num_splits}")


def _mask(is_causal: bool, window_size_left: int | None,
          window_size_right: int | None) -> tuple[bool, tuple[int, int]]:
    """``(causal, window_size)`` of the aten arguments, FlashAttention's semantics (None = -1 = unbounded side).
    ``right == 0`` hides the keys after the diagonal, so it sets ``causal``: the window (-1, 0) that varlen_attn
    passes for its causal mask runs as the causal mask, and the backward's order is the causal mask's
    (:func:`get_schedule`)."""
    left, right = (-1 if side is None else side for side in (window_size_left, window_size_right))
    for name, side in (("window_size_left", left), ("window_size_right", right)):
        if side < -1:
            raise ValueError(f"{name} must be None, -1 (unbounded) or >= 0, got {side}")
    return is_causal or right == 0, (left, right)


def _is_ragged(cum_seq_q: torch.Tensor | None, cum_seq_k: torch.Tensor | None) -> bool:
    if (cum_seq_q is None) != (cum_seq_k is None):
        given = "cum_seq_q" if cum_seq_q is not None else "cum_seq_k"
        raise ValueError("cum_seq_q and cum_seq_k must both be None (dense (batch, seqlen, heads, head_dim) inputs) "
                         f"or both be tensors (ragged (total, heads, head_dim) inputs); got only {given}")
    return cum_seq_q is not None


def _check_sdpa_layout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """SDPA's (batch, heads, seqlen, head_dim) layout, checked before the views in our layout are (so no error
    quotes a transposed shape)."""
    for name, t in zip(_NAMES, (query, key, value)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
    if value.shape != key.shape:
        raise ValueError(f"value.shape must equal key.shape {tuple(key.shape)}, got {tuple(value.shape)}")


def _check_like(like: torch.Tensor, like_name: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{name} must match {like_name} in shape, dtype and device ({tuple(like.shape)}, "
                             f"{like.dtype}, {like.device}), got {tuple(t.shape)}, {t.dtype}, {t.device}")


def _check_lse(lse: torch.Tensor, shape: tuple[int, ...]) -> None:
    if lse.dtype != torch.float32 or tuple(lse.shape) != shape:
        raise ValueError(f"logsumexp must be float32 of shape {shape}, as the forward returns it; got {lse.dtype} "
                         f"of shape {tuple(lse.shape)}")


def _options(scale: float | None, causal: bool, head_dim: int, device: torch.device) -> tuple[float, int]:
    """Validate what every call shares; return the softmax scale and the SM margin to run with."""
    sm_margin = _sm_margin(device)
    checks.check_options(scale, causal, None, get_schedule(causal), sm_margin, False)
    # Head dims are checked on every device, as a GPU build would: the ops we replace are CUDA kernels.
    checks.check_kernel_head_dim(head_dim)
    return checks.softmax_scale_or_default(head_dim, scale), sm_margin


# --- layouts -----------------------------------------------------------------------------------------------------


def _kernel_ready(t: torch.Tensor) -> bool:
    """Whether the kernels read or write ``t`` in place: last dim contiguous, 16-byte aligned base and strides
    (TMA; checks.check_kernel_inputs), no broadcast (stride 0) dims: flash_attn_func never passes those either."""
    align = checks._ALIGN_BYTES
    strides_ok = all(size <= 1 or (stride != 0 and (stride * t.element_size()) % align == 0)
                     for size, stride in zip(t.shape[:-1], t.stride()[:-1]))
    return t.stride(-1) == 1 and strides_ok and t.data_ptr() % align == 0


def _in_kernel_layout(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy where the kernels cannot read it in place: aten callers pass any strides (an
    expanded grad_out, a slice of a packed projection)."""
    return t if _kernel_ready(t) else t.clone(memory_format=torch.contiguous_format)


def _output(like: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(result, target)`` of an output the kernels write: result is ``out``, or a new tensor laid out like ``like``
    (empty_like, as torch's meta kernels lay outputs out, which torch.compile checks); target is result, or a
    contiguous scratch tensor where result's strides do not suit the kernels (:func:`_finish` copies it in)."""
    result = torch.empty_like(like) if out is None else out
    target = result if _kernel_ready(result) else torch.empty(result.shape, dtype=result.dtype, device=result.device)
    return result, target


def _finish(result: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target is not result:
        result.copy_(target)
    return result


def _returned_like(t: torch.Tensor, like: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A result of our varlen forward op (which allocates its own) as the aten op returns it: copied into ``out`` if
    given, else itself where it is laid out as torch's meta kernels lay it out (empty_like), else a copy that is."""
    if out is not None:
        return out.copy_(t)
    if t.stride() == torch.empty_like(like, device="meta").stride():
        return t
    return torch.empty_like(like).copy_(t)


def _bshd(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views in our (batch, seqlen, heads, head_dim) layout of SDPA-layout (batch, heads, seqlen, head_dim) tensors."""
    return tuple(t.transpose(1, 2) for t in tensors)


def _rng_placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rng_state, unused) pair the schemas return, shaped as torch's meta kernels shape them; without dropout
    nothing reads them."""
    return (torch.zeros((2,), dtype=torch.uint64, device=device),
            torch.zeros((), dtype=torch.uint64, device=device))


def _no_debug_mask(query: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=query.dtype, device=query.device)


# --- the passes, in our layouts ----------------------------------------------------------------------------------


def _dense_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float | None,
                   causal: bool, window: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """Forward of (batch, seqlen, heads, head_dim) tensors in kernel layout into ``out``; returns lse (batch, heads,
    seqlen_q) fp32."""
    shape = checks.check_tensors(q, k, v, names=_NAMES)
    scale, sm_margin = _options(scale, causal, shape.head_dim, q.device)
    lse = torch.empty((shape.batch, shape.heads, shape.seqlen_q), dtype=torch.float32, device=q.device)
    ops.forward_into(q, k, v, out, lse, scale, causal, sm_margin, window_size=window)
    return lse


def _dense_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, scale: float | None,
                    causal: bool, window: tuple[int, int] = (-1, -1)) -> None:
    """Backward of (batch, seqlen, heads, head_dim) tensors in kernel layout into ``dq``/``dk``/``dv``;
    deterministic when torch's switch is on, in the order :func:`get_schedule` gives."""
    shape = checks.check_tensors(q, k, v, names=_NAMES)
    _check_lse(lse, (shape.batch, shape.heads, shape.seqlen_q))
    scale, sm_margin = _options(scale, causal, shape.head_dim, q.device)
    ops.backward_into(dout, q, k, v, out, lse.contiguous(), dq, dk, dv, scale, causal,
                      checks.resolve_deterministic(None), get_schedule(causal), sm_margin, window_size=window)


# Our varlen checks name flash_attn_varlen_func's arguments; an aten caller passed aten's.
_ATEN_VARLEN_NAMES = {"cu_seqlens_q": "cum_seq_q", "cu_seqlens_k": "cum_seq_k", "max_seqlen_q": "max_q",
                      "max_seqlen_k": "max_k", "q": "query", "k": "key", "v": "value"}


@contextlib.contextmanager
def _aten_argument_names() -> Iterator[None]:
    try:
        yield
    except (TypeError, ValueError) as e:
        if e.args and isinstance(e.args[0], str):
            renamed = re.sub(r"\b(cu_seqlens_[qk]|max_seqlen_[qk]|[qkv])\b", lambda m: _ATEN_VARLEN_NAMES[m[1]],
                             e.args[0])
            e.args = (renamed,) + e.args[1:]
        raise


def _check_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cum_seq_q: torch.Tensor,
                  cum_seq_k: torch.Tensor, max_q: int, max_k: int, seqused_k: torch.Tensor | None) -> VarlenShape:
    with _aten_argument_names():
        return check_varlen_args(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, None, seqused_k)


def _flash_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cum_seq_q: torch.Tensor | None,
                   cum_seq_k: torch.Tensor | None, max_q: int, max_k: int, out: torch.Tensor | None,
                   scale: float | None, causal: bool, window: tuple[int, int],
                   seqused_k: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_flash_attention_forward``'s two cases, into ``out`` or a new tensor laid out like query; returns (out,
    lse): dense (batch, seqlen, heads, head_dim) tensors through the dense kernels, lse (batch, heads, seqlen_q);
    ragged (total, heads, head_dim) ones through our varlen op, lse (heads, total_q)."""
    q, k, v = (_in_kernel_layout(t) for t in (query, key, value))
    if _is_ragged(cum_seq_q, cum_seq_k):
        shape = _check_ragged(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, seqused_k)
        scale, sm_margin = _options(scale, causal, shape.head_dim, q.device)
        with _aten_argument_names():  # the values of cum_seq_* are checked where the op reads them
            result, lse = torch.ops.flash_attn_dash.varlen_fwd(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, None,
                                                               seqused_k, scale, causal, sm_margin, *window)
        return _returned_like(result, query, out), lse
    if seqused_k is not None:
        raise ValueError("seqused_k must be None with dense (batch, seqlen, heads, head_dim) inputs (flash_attn_dash "
                         "has no per-sequence key counts there), got a tensor")
    result, target = _output(query, out)
    lse = _dense_forward(q, k, v, target, scale, causal, window)
    return _finish(result, target), lse


# --- the aten ops ------------------------------------------------------------------------------------------------


@_implements("_scaled_dot_product_flash_attention")
def scaled_dot_product_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, None, None, int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::_scaled_dot_product_flash_attention``: SDPA's (batch, heads, seqlen, head_dim) layout; key/value may
    have fewer heads (GQA). A causal mask is aligned bottom-right when seqlen_q != seqlen_k, as torch's flash kernel
    aligns it.

    Returns the schema's (output, logsumexp (batch, heads, seqlen_q) fp32, cum_seq_q = cum_seq_k = undefined, max_q,
    max_k, rng_state, unused, debug_attn_mask = empty); output is laid out like query.
    """
    _check_forward_options(dropout_p, return_debug_mask)
    _check_sdpa_layout(query, key, value)
    out, target = _output(query)
    q, k, v = (_in_kernel_layout(t) for t in (query, key, value))
    lse = _dense_forward(*_bshd(q, k, v, target), scale, is_causal)
    return (_finish(out, target), lse, None, None, query.size(2), key.size(2), *_rng_placeholders(query.device),
            _no_debug_mask(query))


@_implements("_scaled_dot_product_flash_attention_backward")
def scaled_dot_product_flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::_scaled_dot_product_flash_attention_backward``: (grad_query, grad_key, grad_value), each laid out like
    its input; bitwise reproducible when ``torch.are_deterministic_algorithms_enabled()``."""
    _check_dropout(dropout_p)
    if _is_ragged(cum_seq_q, cum_seq_k):
        raise ValueError("cum_seq_q and cum_seq_k must be None (SDPA's inputs are dense), got tensors")
    _check_sdpa_layout(query, key, value)
    _check_like(query, "query", grad_out=grad_out, out=out)
    grads = [_output(t) for t in (query, key, value)]
    dout, q, k, v, o = (_in_kernel_layout(t) for t in (grad_out, query, key, value, out))
    _dense_backward(*_bshd(dout, q, k, v, o), logsumexp, *_bshd(*(target for _, target in grads)), scale, is_causal)
    return tuple(_finish(*g) for g in grads)


@_implements("_flash_attention_forward")
def flash_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    return_debug_mask: bool,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
    seqused_k: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::_flash_attention_forward``: dense (batch, seqlen, heads, head_dim) inputs with cum_seq_q = cum_seq_k =
    None (max_q/max_k unused), or ragged (total, heads, head_dim) ones with int32 offsets cum_seq_q/cum_seq_k and
    bounds max_q/max_k (varlen_attn: :func:`flash_attn_dash.flash_attn_varlen_func`'s semantics, seqused_k
    included). Key/value may have fewer heads (GQA).

    Returns the schema's (output laid out like query, logsumexp (batch, heads, seqlen_q) fp32 dense or (heads,
    total_q) ragged, rng_state, unused, debug_attn_mask = empty).
    """
    _check_forward_options(dropout_p, return_debug_mask, alibi_slopes, block_table, num_splits)
    causal, window = _mask(is_causal, window_size_left, window_size_right)
    out, lse = _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, None, scale, causal, window,
                              seqused_k)
    return (out, lse, *_rng_placeholders(query.device), _no_debug_mask(query))


@_implements("_flash_attention_forward_no_dropout_inplace")
def flash_attention_forward_no_dropout_inplace(
    out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    return_debug_mask: bool,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
    seqused_k: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """``aten::_flash_attention_forward_no_dropout_inplace`` (``varlen_attn_out``): :func:`flash_attention_forward`
    writing into ``out`` (shaped like query, any strides); returns logsumexp."""
    _check_forward_options(dropout_p, return_debug_mask, alibi_slopes, block_table, num_splits)
    causal, window = _mask(is_causal, window_size_left, window_size_right)
    _check_like(query, "query", out=out)
    return _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, out, scale, causal, window,
                          seqused_k)[1]


@_implements("_flash_attention_backward")
def flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    rng_state: torch.Tensor,
    unused: torch.Tensor,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::_flash_attention_backward``: (grad_query, grad_key, grad_value) laid out like the inputs, dense or
    ragged as the forward; bitwise reproducible when ``torch.are_deterministic_algorithms_enabled()``."""
    _check_dropout(dropout_p)
    causal, window = _mask(is_causal, window_size_left, window_size_right)
    _check_like(query, "query", grad_out=grad_out, out=out)
    dout, q, k, v, o = (_in_kernel_layout(t) for t in (grad_out, query, key, value, out))
    if _is_ragged(cum_seq_q, cum_seq_k):
        shape = _check_ragged(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, None)
        _check_lse(logsumexp, (shape.heads, shape.total_q))
        scale, sm_margin = _options(scale, causal, shape.head_dim, q.device)
        grads = [_output(t) for t in (query, key, value)]
        with _aten_argument_names():
            varlen_ops.varlen_backward_into(dout, q, k, v, o, logsumexp.contiguous(), *(t for _, t in grads),
                                            cum_seq_q, cum_seq_k, max_q, max_k, None, None, scale, causal,
                                            checks.resolve_deterministic(None), get_schedule(causal), sm_margin,
                                            window_size=window)
        return tuple(_finish(*g) for g in grads)
    grads = [_output(t) for t in (query, key, value)]
    _dense_backward(dout, q, k, v, o, logsumexp, *(target for _, target in grads), scale, causal, window)
    return tuple(_finish(*g) for g in grads)
