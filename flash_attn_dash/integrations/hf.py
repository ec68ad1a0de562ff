"""Hugging Face transformers integration: flash_attn_dash as an ``attn_implementation``.

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and :func:`padding_mask` to
its ``AttentionMaskInterface`` under one name (default ``"dash_attention"``), after which
``model.set_attn_implementation("dash_attention")`` or ``from_config(..., attn_implementation="dash_attention")``
runs every attention layer of a model written against the attention interface (Llama, Qwen2, Mistral, Gemma, ...) on
:func:`flash_attn_dash.flash_attn_func` and :func:`flash_attn_dash.flash_attn_varlen_func`. A layer's sliding window,
softcap (Gemma2) and sinks (gpt-oss) are passed on as ``window_size``, ``softcap`` and ``learnable_sink`` and run on
the kernels (CPU tensors: the reference); CUDA tensors raise the kernels' NotImplementedError for what they lack (a
softcap with sinks).

transformers is imported only by :func:`register` (and by the mask function it registers), so this module, like
the package, imports without it.

Settings, first one set wins (``None`` = not set at that level):

* ``deterministic=`` / ``schedule=`` keyword arguments of the attention call (``model(..., deterministic=True)``),
* the attributes ``flash_attn_dash_deterministic`` / ``flash_attn_dash_schedule`` of the config the attention layers
  hold (``model.config`` for a causal LM; set them on the config or pass them to its constructor),
* ``register(deterministic=..., schedule=...)`` (register several names for several settings),
* the environment variables ``FLASH_ATTN_DASH_DETERMINISTIC`` (``1``/``0``/``true``/``false``) and
  ``FLASH_ATTN_DASH_SCHEDULE``, read at every call,
* otherwise ``deterministic=None`` (follow ``torch.are_deterministic_algorithms_enabled()``) and ``schedule="auto"``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from typing import Any

import torch

from .. import checks
from ..features import NO_WINDOW
from ..interface import flash_attn_func
from ..launch import check_schedule
from ..varlen import flash_attn_varlen_func

DEFAULT_NAME = "dash_attention"
ENV_DETERMINISTIC = "FLASH_ATTN_DASH_DETERMINISTIC"
ENV_SCHEDULE = "FLASH_ATTN_DASH_SCHEDULE"
CONFIG_DETERMINISTIC = "flash_attn_dash_deterministic"
CONFIG_SCHEDULE = "flash_attn_dash_schedule"
MIN_TRANSFORMERS = (5, 0)
_ENV_BOOLS = {"1": True, "true": True, "0": False, "false": False}


@dataclass(frozen=True)
class Settings:
    """Determinism settings of one level (a registration); ``None`` leaves the choice to the next level."""

    deterministic: bool | None = None
    schedule: str | None = None


def _check_deterministic(source: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{source} must be a bool (True or False) or None (not set), got {type(value).__name__}")


def _check_schedule_name(source: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or value not in checks.SCHEDULES):
        names = ", ".join(repr(s) for s in checks.SCHEDULES)
        raise ValueError(f"{source} must be one of {names} or None (not set), got {value!r}")


def env_settings() -> Settings:
    """The settings of ``FLASH_ATTN_DASH_DETERMINISTIC`` and ``FLASH_ATTN_DASH_SCHEDULE`` (unset or empty: None).

    Raises ValueError naming the variable for a value outside ``1``, ``0``, ``true``, ``false`` (any case) or
    outside the schedule names."""
    raw_det = os.environ.get(ENV_DETERMINISTIC, "").strip()
    if raw_det and raw_det.lower() not in _ENV_BOOLS:
        raise ValueError(f"{ENV_DETERMINISTIC} must be 1, 0, true or false (or unset: follow "
                         f"torch.are_deterministic_algorithms_enabled()), got {raw_det!r}")
    raw_schedule = os.environ.get(ENV_SCHEDULE, "").strip()
    _check_schedule_name(ENV_SCHEDULE, raw_schedule or None)
    return Settings(_ENV_BOOLS[raw_det.lower()] if raw_det else None, raw_schedule or None)


def _resolve(call: Settings, config: object, registered: Settings, causal: bool) -> tuple[bool | None, str]:
    """The (deterministic, schedule) of one attention call: the first level that sets each wins. Values are checked
    under the name of the level they come from, the schedule also against the mask."""
    env = env_settings()
    deterministic = None
    for value, source in ((call.deterministic, "deterministic"),
                          (getattr(config, CONFIG_DETERMINISTIC, None), f"config.{CONFIG_DETERMINISTIC}"),
                          (registered.deterministic, "register(deterministic=)"),
                          (env.deterministic, ENV_DETERMINISTIC)):
        _check_deterministic(source, value)
        if value is not None:
            deterministic = value
            break
    schedule = "auto"
    for value, source in ((call.schedule, "schedule"),
                          (getattr(config, CONFIG_SCHEDULE, None), f"config.{CONFIG_SCHEDULE}"),
                          (registered.schedule, "register(schedule=)"),
                          (env.schedule, ENV_SCHEDULE)):
        _check_schedule_name(source, value)
        if value is not None:
            try:
                check_schedule(value, causal)
            except ValueError as err:  # say where the schedule came from, not only what is wrong with it
                raise ValueError(f"{source}={value!r}: {err}") from err
            schedule = value
            break
    return deterministic, schedule


def _reject_unsupported(dropout: float, position_bias: torch.Tensor | None) -> None:
    """Features the kernels lack raise rather than run as something else."""
    if dropout:
        raise NotImplementedError(f"dropout={dropout} (the model's attention dropout in training, e.g. "
                                  "config.attention_dropout) is not yet supported by flash_attn_dash; set it to 0 "
                                  "or train with another attn_implementation")
    if position_bias is not None:
        raise NotImplementedError("position_bias (an additive attention bias) is not supported by flash_attn_dash")


def _window_size(sliding_window: int | None, k_len: int) -> tuple[int, int]:
    """The ``window_size`` of a layer's ``sliding_window``, as transformers' flash path derives it: the current token
    and ``sliding_window - 1`` before it (as many after on non-causal layers; ``causal`` drops the right side), and no
    window unless the keys outnumber it, so a window that cannot mask runs the plain call."""
    if sliding_window is None or k_len <= sliding_window:
        return NO_WINDOW
    return (sliding_window - 1, sliding_window - 1)


def _sliding_window_layer(local_size: int, config: object) -> bool:
    """Whether a mask of ``local_size`` is a sliding-window layer's: transformers passes ``config.sliding_window``
    there, and ``config.attention_chunk_size`` for chunked attention, which the kernels have no mask for (a size that
    is both cannot be told apart, so it is not taken for a window)."""
    return (local_size == getattr(config, "sliding_window", None)
            and local_size != getattr(config, "attention_chunk_size", None))


def _offsets(name: str, cu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """transformers' ``cu_seq_lens_*`` (int32 or int64, any device) as the int32 offsets the varlen API takes."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of sequence offsets, got {type(cu).__name__}")
    return cu.to(device=device, dtype=torch.int32)


def _max_length(cu: torch.Tensor, given: int | torch.Tensor | None) -> int:
    if given is not None:
        return int(given)
    return max(1, int((cu[1:] - cu[:-1]).max())) if cu.numel() > 1 else 1


def _unpad_index(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flat indices of the kept tokens of a (batch, seqlen) bool mask, their int32 offsets and longest length."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    offsets = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return mask.flatten().nonzero().flatten(), offsets, max(1, int(lengths.max()))


def _packed_offsets(position_ids: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor | None:
    """Offsets of the sequences packed in each row of ``position_ids``, or None when every row holds one.

    A sequence starts at each row's start and wherever a position is not the previous one + 1 (restarts at 0),
    the rule transformers' sdpa and eager masks read packed position ids with."""
    if position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != seqlen:
        raise ValueError(f"position_ids must be (batch, seqlen) = ({batch}, {seqlen}) or (1, {seqlen}) to find "
                         f"packed sequences, got shape {tuple(position_ids.shape)}")
    pos = position_ids.expand(batch, seqlen)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    if not bool(starts[:, 1:].any()):
        return None
    first = starts.flatten().nonzero().flatten().to(torch.int32)
    return torch.cat([first, first.new_tensor([batch * seqlen])])


def _pad(out: torch.Tensor, index: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Scatter the packed rows back into (batch, seqlen, heads, head_dim); padded positions get 0."""
    padded = out.new_zeros(batch * seqlen, *out.shape[1:]).index_put((index,), out)
    return padded.view(batch, seqlen, *out.shape[1:])


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    is_causal: bool | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | torch.Tensor | None = None,
    max_length_k: int | torch.Tensor | None = None,
    deterministic: bool | None = None,
    schedule: str | None = None,
    registered: Settings = Settings(),
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract on flash_attn_dash; returns (out (batch, seqlen_q, heads,
    head_dim), None: no attention weights).

    Args:
        module: the attention layer; its ``is_causal`` (unless ``is_causal`` is given) and ``config`` (settings)
            are read.
        query, key, value: (batch, heads, seqlen, head_dim) as transformers passes them; key/value may have fewer
            heads (GQA/MQA), which the kernels take as they are.
        attention_mask: None, or the (batch, kv_length) bool padding mask of :func:`padding_mask` (True = token),
            or a bool (batch, 1, seqlen_q, kv_length) mask that must be this layer's causal or full pattern with key
            padding (ValueError otherwise). With a mask the kept tokens are packed, run through
            ``flash_attn_varlen_func`` and scattered back (padded query positions return 0); the queries are the
            last ``seqlen_q`` mask positions, and keys past the mask (a static cache's unused slots) are dropped.
        dropout, position_bias: raise NotImplementedError naming them (dropout only when > 0).
        sliding_window: the layer's window, run as ``window_size=(sliding_window - 1, sliding_window - 1)`` (right
            side 0 on causal layers) when the keys outnumber it, as transformers' flash path does: each query sees
            itself and the ``sliding_window - 1`` tokens before it, per sequence when padded or packed.
        softcap: Gemma2's ``attn_logit_softcapping`` (None: off), passed as ``softcap``.
        s_aux: gpt-oss's per-head sinks, passed as ``learnable_sink`` as they are (their gradient reaches them).
            On CUDA tensors what no kernel is built for (a softcap with sinks) raises the kernels'
            NotImplementedError naming both arguments (a window that masks nothing runs the plain kernels).
        scaling: softmax scale (None: head_dim ** -0.5).
        is_causal: overrides ``module.is_causal``.
        position_ids: without a mask or ``cu_seq_lens_*``, rows whose positions break (restart at 0) hold packed
            sequences, which run as one varlen call (one host sync per layer to read them).
        cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k: explicit packing (as transformers'
            ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` makes): offsets into the (batch * seqlen)
            flattened tokens; the max lengths are read from the offsets when not given.
        deterministic, schedule: this call's settings (module docstring: which level wins).
        registered: the settings :func:`register` bound.
        **kwargs: the model's other keyword arguments (``cache_position``, ...), unused.
    """
    q_len, k_len = query.shape[2], key.shape[2]
    _reject_unsupported(dropout, position_bias)
    causal = module.is_causal if is_causal is None else is_causal
    det, sched = _resolve(Settings(deterministic, schedule), getattr(module, "config", None), registered, causal)
    window = _window_size(sliding_window, k_len)
    # Sinks go as they are: every dtype a model gives them (its own: bf16/fp16/fp32, fp64 on CPU) is one
    # flash_attn_dash takes, so no cast stands between the sinks parameter and its gradient.
    options = {"softmax_scale": scaling, "causal": causal, "window_size": window,
               "softcap": 0.0 if softcap is None else softcap, "learnable_sink": s_aux, "deterministic": det,
               "schedule": sched}
    # transformers' (batch, heads, seqlen, head_dim) -> FlashAttention's (batch, seqlen, heads, head_dim): views.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    batch = q.shape[0]

    if (cu_seq_lens_q is None) != (cu_seq_lens_k is None):
        missing = "cu_seq_lens_k" if cu_seq_lens_k is None else "cu_seq_lens_q"
        raise ValueError(f"cu_seq_lens_q and cu_seq_lens_k come together (packed sequences), got {missing}=None")
    if attention_mask is not None:
        if cu_seq_lens_q is not None:
            raise ValueError("pass either attention_mask (padding) or cu_seq_lens_q/cu_seq_lens_k (packing), not "
                             "both")
        keys = attention_mask if attention_mask.dim() == 2 else _key_padding(attention_mask, causal, window)
        return _padded(q, k, v, keys, options), None
    if cu_seq_lens_q is not None:
        cu_q, cu_k = _offsets("cu_seq_lens_q", cu_seq_lens_q, q.device), _offsets("cu_seq_lens_k", cu_seq_lens_k,
                                                                                  q.device)
        return _packed(q, k, v, cu_q, cu_k, _max_length(cu_q, max_length_q), _max_length(cu_k, max_length_k),
                       options), None
    # Positions only say how the queries split when keys and queries are the same tokens (no cache prefix).
    if position_ids is not None and q_len == k_len and q_len > 1:
        cu = _packed_offsets(position_ids, batch, q_len)
        if cu is not None:
            longest = _max_length(cu, None)
            return _packed(q, k, v, cu, cu, longest, longest, options), None
    return flash_attn_func(q, k, v, **options), None


def _key_padding(mask: torch.Tensor, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """The (batch, kv_length) key mask of a 4-D bool mask (batch, 1, seqlen_q, kv_length) that is exactly what the
    varlen call on its kept keys runs: the layer's causal (bottom-right) or full pattern, within ``window`` counted
    in kept tokens, restricted to the kept keys; ValueError for any other pattern, which the kernels cannot run. Rows
    of padding queries are not compared (their outputs are 0)."""
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.dtype != torch.bool:
        raise ValueError("attention_mask must be a (batch, kv_length) padding mask or a bool (batch, 1, seqlen_q, "
                         f"kv_length) mask, got {mask.dim()}-D {mask.dtype} of shape {tuple(mask.shape)}")
    q_len, kv_len = mask.shape[2], mask.shape[3]
    keys = mask[:, 0].any(dim=1)
    real_queries = keys[:, kv_len - q_len:] if q_len <= kv_len else None
    if real_queries is not None:
        # The varlen call sees the kept tokens only: a key's place there is its rank among them, and each query is
        # the key at its own position (the queries are the last kept tokens).
        rank = keys.cumsum(dim=1)[:, None, :]
        own = rank[:, 0, kv_len - q_len:, None]
        left, right = window[0], 0 if causal else window[1]
        pattern = keys[:, None, :].expand(-1, q_len, -1)
        if right >= 0:
            pattern = pattern & (rank <= own + right)
        if left >= 0:
            pattern = pattern & (rank >= own - left)
    if real_queries is None or not torch.equal(mask[:, 0][real_queries], pattern[real_queries]):
        kind = "causal" if causal else "full (non-causal)"
        within = "" if window == NO_WINDOW else f" within its sliding window (window_size={window})"
        raise ValueError(f"attention_mask (4-D) must be the {kind} pattern of this layer{within} restricted to "
                         "unpadded keys; other patterns (bidirectional image-token blocks, custom overlays, windows "
                         "other than the layer's, packed sequences under an overlay) are not supported by "
                         "flash_attn_dash")
    return keys


def _padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            options: dict[str, Any]) -> torch.Tensor:
    batch, q_len, kv_len = q.shape[0], q.shape[1], mask.shape[1]
    if mask.shape[0] != batch or not q_len <= kv_len <= k.shape[1]:
        raise ValueError(f"attention_mask must be (batch, kv_length) with batch = {batch} and seqlen_q = {q_len} <= "
                         f"kv_length <= the {k.shape[1]} keys, got shape {tuple(mask.shape)}")
    mask = mask.bool()
    k, v = k[:, :kv_len], v[:, :kv_len]
    k_index, cu_k, max_k = _unpad_index(mask)
    q_index, cu_q, max_q = (k_index, cu_k, max_k) if q_len == kv_len else _unpad_index(mask[:, -q_len:])
    out = flash_attn_varlen_func(q.flatten(0, 1)[q_index], k.flatten(0, 1)[k_index], v.flatten(0, 1)[k_index],
                                 cu_q, cu_k, max_q, max_k, **options)
    return _pad(out, q_index, batch, q_len)


def _packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
            max_k: int, options: dict[str, Any]) -> torch.Tensor:
    out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, max_q, max_k,
                                 **options)
    return out.view(q.shape)


def padding_mask(
    batch_size: int,
    kv_length: int,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    use_vmap: bool = False,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' mask-function contract for :func:`attention_forward`: the (batch, kv_length) bool padding mask,
    or None when there is no padding (the causal or full pattern and packing come from the attention call).

    Masks combined with overlays (``or_mask_function``/``and_mask_function``, which transformers marks with
    ``use_vmap``; e.g. Gemma3's ``use_bidirectional_attention``) are built in full (transformers' ``sdpa_mask``), and
    :func:`attention_forward` runs them if they are the layer's causal or full pattern (within its sliding window)
    with key padding, else raises. Sliding-window layers (``local_size`` = ``config.sliding_window``) get their
    padding mask like any other: their window reaches :func:`attention_forward` as ``sliding_window``. Other local
    patterns (chunked attention, ``local_size`` = ``config.attention_chunk_size``) long enough to mask a key raise
    NotImplementedError. Bidirectional image-token blocks (``block_sequence_ids``, passed by multimodal wrappers that
    declare ``_supports_flash_attn = False`` for this reason) never reach this function and are not supported.
    """
    if (local_size is not None and kv_offset + kv_length > local_size
            and not _sliding_window_layer(local_size, kwargs.get("config"))):
        raise NotImplementedError(f"a local attention mask of local_size={local_size} that is not the layer "
                                  "config's sliding_window (chunked attention: config.attention_chunk_size) is not "
                                  f"yet supported by flash_attn_dash: it masks keys at {kv_offset + kv_length} tokens")
    if use_vmap:
        from transformers.masking_utils import sdpa_mask

        # The query side is described by q_length/q_offset (transformers >= 5.x) or cache_position (5.0): passed on.
        return sdpa_mask(batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
                         attention_mask=attention_mask, local_size=local_size, use_vmap=True,
                         **{**kwargs, "allow_is_causal_skip": False})
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:].bool()
    # A mask narrower than the keys (a static cache) is kept: it says how many keys exist.
    if mask.shape[1] == kv_length and bool(mask.all()):
        return None
    return mask


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    # transformers routes any implementation whose name contains "flash" to its own flash-attention loader
    # (flash_attn packages or Hub kernels), which rejects a name it cannot load.
    if "flash" in name:
        raise ValueError(f"name must not contain 'flash' (transformers takes such names for its own flash-attention "
                         f"packages and tries to load them), got {name!r}; the default is {DEFAULT_NAME!r}")


def _interfaces() -> tuple[Any, Any]:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as err:
        raise ImportError("flash_attn_dash.integrations.hf.register needs transformers >= 5.0: "
                          "pip install 'flash-attn-dash[hf]'") from err
    found = version("transformers")
    major_minor = re.match(r"(\d+)\.(\d+)", found)
    if major_minor is None or tuple(int(part) for part in major_minor.groups()) < MIN_TRANSFORMERS:
        raise ImportError(f"flash_attn_dash.integrations.hf.register needs transformers >= 5.0, found {found}")
    return AttentionInterface, AttentionMaskInterface


def register(name: str = DEFAULT_NAME, deterministic: bool | None = None, schedule: str | None = None) -> str:
    """Register flash_attn_dash with transformers as the attention implementation ``name``; return ``name``.

    After it, ``model.set_attn_implementation(name)`` or ``AutoModel*.from_config(config, attn_implementation=name)``
    (``from_pretrained`` alike) runs the model's attention on flash_attn_dash. Registering a name again replaces it.

    Args:
        name: the implementation name; it must not contain "flash" (transformers claims those names for its own
            flash-attention packages).
        deterministic: this registration's default (None: not set, later levels decide); see the module docstring
            for the call kwargs and config attributes that win over it and the environment variable under it.
        schedule: this registration's default backward schedule (None: not set), one of
            ``flash_attn_dash.SCHEDULES``.

    Raises TypeError/ValueError naming the bad argument (also a bad ``FLASH_ATTN_DASH_*`` environment value, so a
    typo fails at setup), ImportError without transformers >= 5.0.
    """
    _check_name(name)
    _check_deterministic("deterministic", deterministic)
    _check_schedule_name("schedule", schedule)
    env_settings()
    attention_interface, mask_interface = _interfaces()
    attention_interface.register(name, partial(attention_forward, registered=Settings(deterministic, schedule)))
    mask_interface.register(name, padding_mask)
    return name
