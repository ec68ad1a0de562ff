"""Shared helpers for the flash-attn-dash benchmarks.

Used by bench_attn.py, bench_varlen.py, bench_block.py, plot.py and fwd_variants.py as ``benchmarks.common``.

Contents: FLOP formulas, grid construction, the attention implementation registry
(ours / torch SDPA backends / FlashAttention-4), CUDA-event timing, reference
attention + the tolerance rule of dash.md, run metadata, an incremental JSON
writer, a hang watchdog, a time budget and text-table printing.

torch is imported lazily everywhere so that ``--help``, ``--dry-run`` and plot.py
work on machines without torch / CUDA.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

SCHEMA = "flash-attn-dash-bench"
SCHEMA_VERSION = 1

# --------------------------------------------------------------------------- grid
TOKENS_PER_BATCH = 16384
HIDDEN = 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_SEQLENS = [2048, 8192]
HDIMS = [64, 128]
MASKS = ["full", "causal"]
MIN_ITERS = 20  # never fewer timed iterations than this
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
DEFAULT_SETS = 3  # input sets rotated so L2 (60 MB on H200) cannot hold them
DEFAULT_REPEATS = 5  # repeated backwards for the bitwise check
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seqlen_label(s: int) -> str:
    """512 -> '512', 2048 -> '2k', 16384 -> '16k'."""
    s = int(s)
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def parse_seqlen(tok: str) -> int:
    tok = str(tok).strip().lower()
    if tok.endswith("k"):
        return int(float(tok[:-1]) * 1024)
    return int(tok)


def parse_list(values: Optional[Sequence[str]], conv=str) -> Optional[list]:
    """argparse helper: accepts ['2k,8k', '16k'] -> [2048, 8192, 16384]."""
    if not values:
        return None
    out = []
    for v in values:
        for tok in str(v).split(","):
            tok = tok.strip()
            if tok:
                out.append(conv(tok))
    return out


def attn_grid(seqlens: Iterable[int] = SEQLENS, hdims: Iterable[int] = HDIMS,
              masks: Iterable[str] = MASKS, tokens: int = TOKENS_PER_BATCH,
              hidden: int = HIDDEN) -> List[dict]:
    """The DASH grid: batch = tokens/seqlen, heads = hidden/hdim. Order: hdim, mask, seqlen."""
    grid = []
    for d in hdims:
        if hidden % d:
            raise ValueError(f"hidden {hidden} not divisible by hdim {d}")
        for mask in masks:
            if mask not in MASKS:
                raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
            for s in seqlens:
                if tokens % s:
                    raise ValueError(f"tokens {tokens} not divisible by seqlen {s}")
                grid.append(dict(batch=tokens // s, seqlen=int(s), heads=hidden // d,
                                 heads_kv=hidden // d, hdim=int(d), mask=mask,
                                 causal=(mask == "causal")))
    return grid


# --------------------------------------------------------------------------- FLOPs
def attn_fwd_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int,
                   causal: bool, hdim_v: Optional[int] = None) -> float:
    """FlashAttention convention: 2*b*h*sq*avg_sk*(d+dv); causal (bottom-right aligned)
    avg_sk = (max(0, sk-sq) + sk)/2, i.e. exactly half of 4*b*h*s^2*d when sq == sk."""
    dv = hdim if hdim_v is None else hdim_v
    avg_sk = (max(0, seqlen_k - seqlen_q) + seqlen_k) / 2.0 if causal else float(seqlen_k)
    return 2.0 * batch * heads * seqlen_q * avg_sk * (hdim + dv)


def attn_bwd_flops(*args, **kw) -> float:
    """Backward = 2.5 x forward (FlashAttention convention)."""
    return 2.5 * attn_fwd_flops(*args, **kw)


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    if not ms or ms <= 0 or not math.isfinite(ms):
        return None
    return flops / (ms * 1e-3) / 1e12


def block_flops(cfg: dict, batch: int, seqlen: int) -> Dict[str, float]:
    """Matmul FLOPs of one decoder block (linear layers + attention). Norms, RoPE and
    activations are ignored. bwd = 2 x fwd for linears, 2.5 x fwd for attention."""
    hidden, h, hk, d = cfg["hidden"], cfg["heads"], cfg["heads_kv"], cfg["hdim"]
    inter = cfg["intermediate"]
    tok = batch * seqlen
    qkv = hidden * (h + 2 * hk) * d
    o = h * d * hidden
    mlp = (3 if cfg.get("mlp", "swiglu") == "swiglu" else 2) * hidden * inter
    lin_fwd = 2.0 * tok * (qkv + o + mlp)
    att_fwd = attn_fwd_flops(batch, h, seqlen, seqlen, d, cfg["causal"])
    fwd = lin_fwd + att_fwd
    bwd = 2.0 * lin_fwd + 2.5 * att_fwd
    return dict(fwd=fwd, bwd=bwd, step=fwd + bwd, attn_fwd=att_fwd, linear_fwd=lin_fwd)


# --------------------------------------------------------------------------- implementations
@dataclass
class Impl:
    key: str
    label: str
    family: str  # "dash" | "sdpa" | "fa4"
    deterministic: bool
    schedule: Optional[str] = None  # ours only
    backend: Optional[str] = None  # SDPA backend name, None = torch default selection
    torch_deterministic: bool = False  # run the row under torch.use_deterministic_algorithms(True)
    masks: Sequence[str] = ("full", "causal")  # masks the schedule is meant for

    def applies_to(self, mask: str) -> bool:
        return mask in self.masks

    def describe(self) -> dict:
        return dict(impl=self.key, label=self.label, family=self.family,
                    deterministic=self.deterministic, schedule=self.schedule,
                    backend=self.backend, torch_deterministic=self.torch_deterministic)


IMPLS: Dict[str, Impl] = {i.key: i for i in [
    Impl("dash", "dash non-det", "dash", False, "auto"),
    Impl("dash-det", "dash det auto", "dash", True, "auto"),
    Impl("dash-det-ascending", "dash det ascending", "dash", True, "ascending"),
    Impl("dash-det-descending", "dash det descending", "dash", True, "descending"),
    Impl("dash-det-shift", "dash det shift", "dash", True, "shift", masks=("full",)),
    Impl("dash-det-symshift", "dash det symmetric_shift", "dash", True, "symmetric_shift",
         masks=("causal",)),
    Impl("dash-det-split", "dash det split", "dash", True, "split", masks=("causal",)),
    Impl("dash-det-diagonal", "dash det diagonal", "dash", True, "diagonal", masks=("causal",)),
    Impl("sdpa-cudnn", "cuDNN non-det", "sdpa", False, backend="CUDNN_ATTENTION"),
    Impl("sdpa-flash", "SDPA-flash (FA2) non-det", "sdpa", False, backend="FLASH_ATTENTION"),
    Impl("sdpa-efficient", "SDPA-efficient non-det", "sdpa", False, backend="EFFICIENT_ATTENTION"),
    Impl("sdpa-flash-det", "SDPA-flash (FA2) det", "sdpa", True, backend="FLASH_ATTENTION",
         torch_deterministic=True),
    Impl("sdpa-efficient-det", "SDPA-efficient det", "sdpa", True, backend="EFFICIENT_ATTENTION",
         torch_deterministic=True),
    Impl("sdpa", "SDPA default", "sdpa", False),
    Impl("fa4", "FA4 non-det", "fa4", False),
    Impl("fa4-det", "FA4 det", "fa4", True),
]}

IMPL_GROUPS = {
    "ours": ["dash", "dash-det", "dash-det-ascending", "dash-det-descending", "dash-det-shift",
             "dash-det-symshift"],
    "sdpa-all": ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient"],
    "sdpa-det": ["sdpa-flash-det", "sdpa-efficient-det"],
    "fa4-all": ["fa4", "fa4-det"],
}
IMPL_GROUPS["default"] = IMPL_GROUPS["ours"] + IMPL_GROUPS["sdpa-all"] + IMPL_GROUPS["fa4-all"]
IMPL_GROUPS["all"] = [k for k in IMPLS if k != "sdpa"] + ["sdpa"]


def select_impls(spec: Optional[Sequence[str]], default: Sequence[str],
                 impls: Optional[Dict[str, Impl]] = None,
                 groups: Optional[Dict[str, List[str]]] = None) -> List[str]:
    """Resolve --impl values: keys (exact keys win: 'sdpa' is SDPA's default backend),
    group names (ours, sdpa-all, sdpa-det, fa4-all, default, all) or fnmatch patterns
    ('dash-det*'); comma separated. Keeps registry order, no duplicates.
    impls/groups: another registry (bench_varlen.py's); default IMPLS and IMPL_GROUPS."""
    impls = IMPLS if impls is None else impls
    groups = IMPL_GROUPS if groups is None else groups
    toks = parse_list(spec) if spec else list(default)
    chosen = set()
    for t in toks:
        if t in impls:
            chosen.add(t)
            continue
        if t in groups:
            chosen.update(groups[t])
            continue
        hits = [k for k in impls if fnmatch.fnmatchcase(k, t)]
        if not hits:
            raise ValueError(f"unknown implementation {t!r}; known: {', '.join(impls)}; "
                             f"groups: {', '.join(groups)}")
        chosen.update(hits)
    return [k for k in impls if k in chosen]


class ImplUnavailable(Exception):
    """The implementation cannot run here (import failed, no kernels...): row is skipped."""


def import_flash_attn_dash():
    """import flash_attn_dash; if it is not importable, retry with the repository root
    appended to sys.path (an in-place build that is not pip-installed)."""
    try:
        import flash_attn_dash as fad
        if hasattr(fad, "flash_attn_func") or REPO_ROOT in sys.path:
            return fad
    except ImportError:
        if REPO_ROOT in sys.path:
            raise
    # not found, or only an empty namespace package (e.g. running from benchmarks/)
    sys.modules.pop("flash_attn_dash", None)
    sys.path.append(REPO_ROOT)
    import flash_attn_dash as fad
    return fad


def _import_dash():
    try:
        fad = import_flash_attn_dash()
    except Exception as e:  # ImportError, or a broken extension raising anything
        raise ImplUnavailable(f"import flash_attn_dash failed: {type(e).__name__}: {e}")
    ka = getattr(fad, "kernels_available", None)
    try:
        ok = bool(ka()) if callable(ka) else False
    except Exception as e:
        raise ImplUnavailable(f"flash_attn_dash.kernels_available() raised {type(e).__name__}: {e}")
    if not ok:
        raise ImplUnavailable("flash_attn_dash.kernels_available() is False (extension not built "
                              "or GPU is not sm90)" if callable(ka) else
                              "flash_attn_dash has no kernels_available()")
    if not hasattr(fad, "flash_attn_func"):
        raise ImplUnavailable("flash_attn_dash has no flash_attn_func")
    return fad


def dash_module():
    """flash_attn_dash with its kernels (ImplUnavailable without them); in the CPU self-test (FAD_BENCH_CPU=1) its
    CPU reference path, so that every stage of our rows runs there."""
    return import_flash_attn_dash() if bench_device() == "cpu" else _import_dash()


def _first(r):
    return r[0] if isinstance(r, (tuple, list)) else r


def make_attn_fn(impl: Impl, causal: bool, sm_margin: int = 0,
                 gqa: str = "repeat") -> Callable:
    """Return fn(q, k, v) -> out for (b, s, h, d) tensors (k/v may have fewer heads: GQA).
    Raises ImplUnavailable when the implementation cannot be used on this machine."""
    if impl.family == "dash":
        fad = dash_module()
        kw = dict(causal=causal, deterministic=impl.deterministic, schedule=impl.schedule)
        if sm_margin:
            kw["sm_margin"] = sm_margin

        def fn(q, k, v):
            return _first(fad.flash_attn_func(q, k, v, **kw))
        return fn

    if impl.family == "fa4":
        try:
            from flash_attn.cute import flash_attn_func as fa4_func
        except Exception as e:
            raise ImplUnavailable(f"from flash_attn.cute import flash_attn_func failed: "
                                  f"{type(e).__name__}: {e}")
        det = impl.deterministic

        def fn(q, k, v):
            return _first(fa4_func(q, k, v, causal=causal, deterministic=det))
        return fn

    if impl.family == "sdpa":
        import torch.nn.functional as F
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except Exception as e:
            raise ImplUnavailable(f"torch.nn.attention.sdpa_kernel unavailable: {e}")
        backend = getattr(SDPBackend, impl.backend) if impl.backend else None

        def fn(q, k, v):
            h, hk = q.shape[2], k.shape[2]
            extra = {}
            if hk != h:
                if gqa == "native":
                    extra["enable_gqa"] = True
                else:
                    k = k.repeat_interleave(h // hk, dim=2)
                    v = v.repeat_interleave(h // hk, dim=2)
            ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
            with ctx:
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2), is_causal=causal, **extra)
            return o.transpose(1, 2)
        return fn

    raise ValueError(f"unknown family {impl.family}")


def schedule_used(impl: Impl, q, k, v, causal: bool, sm_margin: int = 0) -> Optional[str]:
    """What flash_attn_dash.backward_schedule_used reports (optional API): tries
    fn(q, k, causal=, deterministic=, schedule=[, sm_margin=]), then with v as third positional,
    then without deterministic. None when absent; 'error: ...' when every call form failed."""
    if impl.family != "dash":
        return None
    try:
        fad = import_flash_attn_dash()
        fn = getattr(fad, "backward_schedule_used", None)
    except Exception:
        return None
    if not callable(fn):
        return None
    base = dict(causal=causal, schedule=impl.schedule)
    if sm_margin:
        base["sm_margin"] = sm_margin
    last = None
    for kw in (dict(base, deterministic=impl.deterministic), base):
        for args in ((q, k), (q, k, v)):
            try:
                return str(fn(*args, **kw))
            except Exception as e:  # signature mismatch or refusal: try the next form
                last = e
    return f"error: {type(last).__name__}: {last}"[:300]


@contextlib.contextmanager
def torch_deterministic(flag: bool):
    """Temporarily set torch.use_deterministic_algorithms(flag) (strict mode)."""
    import torch
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if flag != prev:
        torch.use_deterministic_algorithms(flag)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)


# --------------------------------------------------------------------------- reference + tolerance
def attention_ref(q, k, v, causal: bool, scale: Optional[float] = None, upcast: bool = True,
                  rows=None, window_left: Optional[int] = None, sink=None):
    """Plain attention on (b, s, h, d) tensors; causal is bottom-right aligned; GQA by repeat.
    upcast=True: fp32 math (the reference); False: same math in the input dtype (scores and
    P@V in the input dtype, softmax in fp32), the 'x_pt' of the dash.md tolerance rule.
    rows: optional LongTensor of query positions to evaluate (cheap slice check).
    window_left: with causal, a sliding window: query i also sees no key before i + sk - sq - window_left.
    sink: optional (h,) learnable sink logits (gpt-oss: each row's softmax denominator gains exp(sink_h)).
    Returns (b, len(rows) or sq, h, d) in the input dtype when upcast=False, fp32 otherwise."""
    import torch
    sq, sk, h, hk, d = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    scale = d ** -0.5 if scale is None else scale
    if hk != h:
        k = k.repeat_interleave(h // hk, dim=2)
        v = v.repeat_interleave(h // hk, dim=2)
    if rows is None:
        rows = torch.arange(sq, device=q.device)
    qs = q[:, rows]
    if upcast:
        qs, k, v = qs.float(), k.float(), v.float()
    scores = torch.einsum("brhd,bshd->bhrs", qs, k) * scale
    if causal:
        kpos = torch.arange(sk, device=q.device)
        diag = rows[:, None] + (sk - sq)
        masked = kpos[None, :] > diag
        if window_left is not None:
            masked = masked | (kpos[None, :] < diag - window_left)
        scores = scores.masked_fill(masked, float("-inf"))
    scores = scores.float()
    if sink is not None:  # one more column per row that takes no value
        column = sink.float().view(1, h, 1, 1).expand(*scores.shape[:3], 1)
        p = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1].to(v.dtype)
    else:
        p = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.einsum("bhrs,bshd->brhd", p, v)


def visible_pairs(seqlen_q: int, seqlen_k: int, window: tuple) -> int:
    """Query-key pairs a bottom-right aligned window (FlashAttention's window_size, -1 = unbounded side) lets
    through."""
    import numpy as np

    i = np.arange(seqlen_q, dtype=np.int64) + (seqlen_k - seqlen_q)
    lo = np.zeros_like(i) if window[0] < 0 else np.maximum(i - window[0], 0)
    hi = np.full_like(i, seqlen_k - 1) if window[1] < 0 else np.minimum(i + window[1], seqlen_k - 1)
    return int(np.maximum(hi - lo + 1, 0).sum())


def tol_check(x, ref, pt) -> dict:
    """dash.md rule: max|x - ref| <= 2 * max|pt - ref| + atol, atol = 2 * max|ref + 0.3 - 0.3 - ref|
    (ref rounded to x's dtype for atol). ref fp32, x and pt in the input dtype."""
    ref = ref.float()
    err = (x.float() - ref).abs().max().item()
    err_pt = (pt.float() - ref).abs().max().item()
    r = ref.to(x.dtype)
    atol = 2.0 * (r + 0.3 - 0.3 - r).abs().max().float().item()
    ok = bool(math.isfinite(err) and err <= 2.0 * err_pt + atol)
    return dict(err=err, err_pt=err_pt, atol=atol, ok=ok)


# --------------------------------------------------------------------------- device
def bench_device() -> str:
    """'cuda'; 'cpu' only for the harness self-test (FAD_BENCH_CPU=1: tiny shapes, wall-clock
    timing, numbers meaningless)."""
    return "cpu" if os.environ.get("FAD_BENCH_CPU") == "1" else "cuda"


def sync() -> None:
    import torch
    if bench_device() == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- timing
def summarize_ms(times: Sequence[float]) -> dict:
    ts = [float(t) for t in times]
    return dict(ms=statistics.median(ts), ms_min=min(ts), ms_max=max(ts),
                ms_mean=statistics.fmean(ts),
                ms_std=statistics.pstdev(ts) if len(ts) > 1 else 0.0, n=len(ts),
                ms_all=[round(t, 5) for t in ts])


def time_cuda(fn: Callable[[int], object], iters: int, warmup: int,
              pad_us: float = 1000.0) -> List[float]:
    """Per-iteration CUDA-event times (ms) of fn(i) on the current stream.

    fn receives a running index (use it to rotate input sets). Before each timed call a
    torch.cuda._sleep of ~pad_us keeps the GPU busy while the CPU enqueues the call, so the
    events measure GPU time, not Python launch overhead (pad_us=0 disables)."""
    import torch
    if iters < 1:
        raise ValueError("iters must be >= 1")
    for i in range(warmup):
        fn(i)
    if bench_device() == "cpu":  # harness self-test only
        out = []
        for i in range(iters):
            t = time.perf_counter()
            fn(warmup + i)
            out.append((time.perf_counter() - t) * 1e3)
        return out
    torch.cuda.synchronize()
    cycles = int(pad_us * 2000)  # ~2 GHz SM clock; exactness does not matter
    sleep = getattr(torch.cuda, "_sleep", None) if cycles > 0 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if sleep is not None:
            sleep(cycles)
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def free_cuda():
    import gc
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def cuda_healthy() -> Optional[str]:
    """None if the CUDA context still works, else the error (sticky errors such as an illegal
    address poison every later call: the benchmark must stop)."""
    if bench_device() == "cpu":
        return None
    try:
        import torch
        torch.cuda.synchronize()
        x = torch.ones(8, device="cuda")
        (x + 1).sum().item()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


class Stage:
    """The step a benchmark row is at (``record_failure``'s ``stage`` when a step raises)."""

    def __init__(self) -> None:
        self.name: Optional[str] = "first_call"


def measure_fwd_bwd(row: dict, fn: Callable, sets: Sequence[tuple], args, fwd_flops: float, stage: Stage,
                    check_out: Optional[Callable] = None, ctx: Callable = contextlib.nullcontext,
                    bwd_flops: Optional[float] = None) -> None:
    """The timed part of one benchmark row, shared by the attention benchmarks.

    A first call on ``sets[0]`` (its output must be shaped like q with v's head dim; ``check_out(out, q, k, v)`` returns
    ``row["check"]["out_slice"]`` unless None), then ``fn`` and its ``torch.autograd.grad`` backward timed over the
    rotated input sets (q, k, v, dout) with ``args.iters``/``args.warmup``/``args.pad_us``, then ``args.repeats``
    backwards of the first set compared bit for bit. Fills row's fwd, bwd (``bwd_flops``, by default 2.5 x the
    forward FLOPs: exact when the q/k and v head dims are equal), check,
    bitwise_repeat, n_repeats and repeat_max_abs_dev; every call runs inside ``ctx()``; ``stage.name`` follows."""
    import torch
    q0, k0, v0, _ = sets[0]
    with ctx():
        out = fn(q0, k0, v0)
    sync()
    want = (*q0.shape[:-1], v0.shape[-1])
    if tuple(out.shape) != want:
        raise RuntimeError(f"output shape {tuple(out.shape)} != {want}")
    if check_out is not None:
        stage.name = "check_out"
        row["check"] = dict(out_slice=check_out(out, q0, k0, v0))
        row["check"]["ok"] = row["check"]["out_slice"]["ok"]
    out = None

    stage.name = "fwd"
    n = len(sets)

    def fwd_call(i):
        q, k, v, _ = sets[i % n]
        with ctx():
            fn(q, k, v)
    ts = time_cuda(fwd_call, args.iters, args.warmup, args.pad_us)
    row["fwd"] = summarize_ms(ts)
    row["fwd"].update(flops=fwd_flops, tflops=tflops(fwd_flops, row["fwd"]["ms"]))

    stage.name = "bwd_setup"
    with ctx():
        outs = [fn(q, k, v) for q, k, v, _ in sets]

    stage.name = "bwd"

    def bwd_call(i):
        j = i % n
        q, k, v, do = sets[j]
        with ctx():
            torch.autograd.grad(outs[j], (q, k, v), do, retain_graph=True)
    ts = time_cuda(bwd_call, args.iters, args.warmup, args.pad_us)
    bwd_flops = 2.5 * fwd_flops if bwd_flops is None else bwd_flops
    row["bwd"] = summarize_ms(ts)
    row["bwd"].update(flops=bwd_flops, tflops=tflops(bwd_flops, row["bwd"]["ms"]))

    stage.name = "repeat"
    q, k, v, do = sets[0]
    with ctx():
        first = torch.autograd.grad(outs[0], (q, k, v), do, retain_graph=True)
    equal, dev = True, [0.0, 0.0, 0.0]
    for _ in range(args.repeats - 1):
        with ctx():
            g = torch.autograd.grad(outs[0], (q, k, v), do, retain_graph=True)
        for i in range(3):
            if not torch.equal(g[i], first[i]):
                equal = False
                dev[i] = max(dev[i], (g[i].float() - first[i].float()).abs().max().item())
        g = None
    first = None
    row.update(bitwise_repeat=equal, n_repeats=args.repeats,
               repeat_max_abs_dev=dict(dq=dev[0], dk=dev[1], dv=dev[2]))
    outs = None
    free_cuda()


def record_failure(row: dict, impl: "Impl", e: BaseException, stage: Optional[str]) -> None:
    """Mark a row that raised: our ValueErrors (a schedule or shape we reject) are skips, the rest errors."""
    if impl.family == "dash" and isinstance(e, ValueError):
        row.update(status="skipped", reason=f"ValueError at {stage}: {e}", stage=stage)
    else:
        row.update(status="oom" if is_oom(e) else "error", reason=f"{type(e).__name__}: {e}"[:1000],
                   stage=stage, traceback=short_tb(e))


def fatal_if_context_broken(row: dict, label: str) -> Optional[str]:
    """After a failed row: if the CUDA context is unusable, say so in the row and return the reason."""
    bad = cuda_healthy()
    if not bad:
        return None
    fatal = f"CUDA context unusable after {label}: {bad}"
    row["reason"] = (row["reason"] or "") + f" | {fatal}"
    return fatal


def is_oom(e: BaseException) -> bool:
    try:
        import torch
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
    except Exception:
        pass
    return "out of memory" in str(e).lower()


def short_tb(e: BaseException, limit: int = 2500) -> str:
    s = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6))
    return s[-limit:]


# --------------------------------------------------------------------------- environment
def require_cuda(prog: str, has_dry_run: bool = False) -> None:
    """Exit with code 2 and a clear message when CUDA is not usable (``has_dry_run``: ``prog`` takes --dry-run)."""
    try:
        import torch
    except Exception as e:
        print(f"{prog}: torch cannot be imported ({e}); nothing to benchmark.", file=sys.stderr)
        sys.exit(2)
    if bench_device() == "cpu":
        print(f"{prog}: FAD_BENCH_CPU=1: harness self-test on CPU, numbers are meaningless",
              file=sys.stderr)
        return
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA device available (torch {torch.__version__}, "
              f"built with CUDA {torch.version.cuda}); this benchmark needs an NVIDIA GPU "
              f"(H200 / sm90).{' Use --dry-run to list the rows.' if has_dry_run else ''}", file=sys.stderr)
        sys.exit(2)


def _run(cmd: List[str], cwd: Optional[str] = None) -> Optional[str]:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
        return r.stdout.strip() if r.returncode == 0 else None
    except Exception:
        return None


def git_info() -> dict:
    """The commit that runs. GIT_COMMIT wins: on a machine that got a copy of the working tree the local .git (if
    any) can be a stale snapshot, so the caller names the commit it sent."""
    if os.environ.get("GIT_COMMIT"):
        return dict(commit=os.environ["GIT_COMMIT"], dirty=None, branch=None)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT)
    branch = _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO_ROOT)
    return dict(commit=commit, dirty=(bool(dirty) if dirty is not None else None), branch=branch)


def _pkg_version(*names) -> Optional[str]:
    try:
        from importlib import metadata
    except Exception:
        return None
    for n in names:
        try:
            return metadata.version(n)
        except Exception:
            continue
    return None


def collect_metadata(argv: Optional[Sequence[str]] = None) -> dict:
    argv = list(sys.argv if argv is None else argv)
    meta = dict(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        host=platform.node(),
        python=platform.python_version(),
        command=" ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + argv),
        cwd=os.getcwd(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Build/run knobs (FLASH_DASH_HDIMS, FLASH_ATTN_DASH_DEBUG, ...) change what runs: keep them with the rows.
        flash_dash_env={k: v for k, v in sorted(os.environ.items())
                        if k.startswith(("FLASH_DASH_", "FLASH_ATTN_DASH_"))},
    )
    meta.update({f"git_{k}": v for k, v in git_info().items()})
    try:
        import torch
        meta.update(torch=torch.__version__, cuda=torch.version.cuda,
                    cudnn=(torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                           else None))
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta.update(gpu=p.name, sm_count=p.multi_processor_count,
                        compute_capability=f"{p.major}.{p.minor}",
                        gpu_memory_gib=round(p.total_memory / 2**30, 1),
                        l2_cache_mb=(round(getattr(p, "L2_cache_size", 0) / 2**20, 1) or None))
    except Exception as e:
        meta["torch_error"] = f"{type(e).__name__}: {e}"
    smi = _run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                "--format=csv,noheader", "-i", "0"])
    if smi:
        parts = [x.strip() for x in smi.splitlines()[0].split(",")]
        meta["driver"] = parts[0]
        if len(parts) > 2:
            meta["max_sm_clock"], meta["power_limit"] = parts[1], parts[2]
    meta["flash_attn_dash"] = _pkg_version("flash-attn-dash", "flash_attn_dash")
    try:
        fad = import_flash_attn_dash()
        meta["flash_attn_dash"] = getattr(fad, "__version__", meta["flash_attn_dash"])
        meta["flash_attn_dash_path"] = getattr(fad, "__file__", None)
        ka = getattr(fad, "kernels_available", None)
        meta["flash_attn_dash_kernels"] = bool(ka()) if callable(ka) else None
    except Exception as e:
        meta["flash_attn_dash_import_error"] = f"{type(e).__name__}: {e}"[:300]
    meta["flash_attn_4"] = _pkg_version("flash-attn-4", "flash_attn_4")
    meta["cutlass_dsl"] = _pkg_version("nvidia-cutlass-dsl")
    return meta


# --------------------------------------------------------------------------- JSON output
class ResultWriter:
    """Keeps the result document and rewrites the JSON file atomically after each row, so a
    crash / hang / timeout still leaves every finished row on disk."""

    def __init__(self, path: Optional[str], kind: str, meta: dict, config: dict):
        self.path = path
        self.lock = threading.Lock()
        self.doc = dict(schema=SCHEMA, schema_version=SCHEMA_VERSION, kind=kind, meta=meta,
                        config=config, rows=[], complete=False, exit_reason=None)
        if path:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
        self.flush()

    @property
    def rows(self) -> List[dict]:
        return self.doc["rows"]

    def add(self, row: dict) -> None:
        with self.lock:
            self.doc["rows"].append(row)
        self.flush()

    def finish(self, complete: bool, exit_reason: Optional[str] = None) -> None:
        self.doc["complete"] = complete
        self.doc["exit_reason"] = exit_reason
        self.doc["meta"]["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds")
        self.flush()

    def flush(self) -> None:
        if not self.path:
            return
        with self.lock:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(clean_floats(self.doc), f, indent=1, default=_json_default,
                          allow_nan=False)
                f.write("\n")
            os.replace(tmp, self.path)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    try:
        return float(o)
    except Exception:
        return str(o)


def clean_floats(x):
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean_floats(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_floats(v) for v in x]
    return x


def load_results(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} document (schema={doc.get('schema')!r})")
    return doc


# --------------------------------------------------------------------------- watchdog / budget
class Watchdog:
    """If one row runs longer than `timeout_s` (a hung kernel, e.g. a deterministic-order
    deadlock), call on_timeout(label) (which should record the row and flush the JSON),
    print a message and hard-exit the process with code 3."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[str], None]):
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self._label = None
        self._deadline = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if timeout_s and timeout_s > 0:
            t = threading.Thread(target=self._loop, daemon=True, name="bench-watchdog")
            t.start()

    def arm(self, label: str) -> None:
        with self._lock:
            self._label, self._deadline = label, time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        with self._lock:
            self._label, self._deadline = None, None

    def stop(self) -> None:
        self._stop.set()

    def _loop(self):
        while not self._stop.wait(1.0):
            with self._lock:
                label, dl = self._label, self._deadline
            if dl is not None and time.monotonic() > dl:
                msg = (f"\n!!! WATCHDOG: row '{label}' exceeded {self.timeout_s:.0f}s "
                       f"(hang?). Writing partial results and exiting with code 3.")
                print(msg, file=sys.stderr, flush=True)
                try:
                    self.on_timeout(label)
                except Exception as e:
                    print(f"watchdog: on_timeout failed: {e}", file=sys.stderr, flush=True)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(3)


class Budget:
    """Wall-clock budget for a whole run; rows past it are recorded as skipped. Rows of our
    own implementation get `grace` x the budget (so a slow JIT-compiling baseline cannot starve
    the rows the run is for)."""

    def __init__(self, seconds: Optional[float], grace: float = 1.25):
        self.seconds = seconds
        self.grace = grace
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def exceeded(self, ours: bool = False) -> bool:
        if not self.seconds:
            return False
        return self.elapsed() > self.seconds * (self.grace if ours else 1.0)

    def reason(self, ours: bool = False) -> str:
        lim = self.seconds * (self.grace if ours else 1.0)
        return f"time budget exceeded ({self.elapsed():.0f}s > {lim:.0f}s, --budget-s)"


# --------------------------------------------------------------------------- text output
def fmt_num(x, nd=1, dash="-") -> str:
    if x is None:
        return dash
    if isinstance(x, float) and not math.isfinite(x):
        return dash
    return f"{x:.{nd}f}"


def text_table(header: Sequence[str], rows: Sequence[Sequence], align: Optional[str] = None) -> str:
    """Fixed-width text table (first column left aligned, the rest right aligned)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    align = align or ("l" + "r" * (len(header) - 1))
    def line(r):
        return "  ".join(c.ljust(w[i]) if align[i] == "l" else c.rjust(w[i])
                         for i, c in enumerate(r))
    out = [line(cells[0]), "  ".join("-" * x for x in w)] + [line(r) for r in cells[1:]]
    return "\n".join(out)


def md_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    out = ["| " + " | ".join(str(h) for h in header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def status_cell(row: dict) -> str:
    """Short marker for a row that has no number."""
    st = row.get("status")
    return {"skipped": "–", "error": "err", "oom": "oom", "timeout": "hang",
            "budget": "–"}.get(st, "?")


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- result pivots
MASK_ORDER = {m: i for i, m in enumerate(MASKS)}


def row_tflops(row: dict, pass_: str) -> Optional[float]:
    t = row.get(pass_)
    return t.get("tflops") if isinstance(t, dict) else None


def check_failed(row: dict) -> bool:
    chk = row.get("check")
    return isinstance(chk, dict) and chk.get("ok") is False


def attn_cell(row: Optional[dict], pass_: str) -> str:
    """'412*' (bwd bit-identical over repeats), '412!' (correctness check failed), 'err'..."""
    if row is None:
        return ""
    v = row_tflops(row, pass_)
    if v is None:
        return status_cell(row) if row.get("status") != "ok" else "-"
    s = f"{v:.0f}"
    if pass_ == "bwd" and row.get("bitwise_repeat"):
        s += "*"
    if check_failed(row):
        s += "!"
    return s


def impl_table_rows(g: dict, columns: Sequence) -> List[List[str]]:
    """One table row per implementation of a summary group ``g`` (``impls``, ``labels``, ``rows`` keyed by
    (impl, column)): its label, then per column 'bwd / fwd' TFLOP/s (:func:`attn_cell`; one cell when neither ran)."""
    body = []
    for impl in g["impls"]:
        cells = []
        for c in columns:
            r = g["rows"].get((impl, c))
            if r is None:
                cells.append("")
            elif r.get("bwd") is None and r.get("fwd") is None:
                cells.append(attn_cell(r, "bwd"))
            else:
                cells.append(f"{attn_cell(r, 'bwd')} / {attn_cell(r, 'fwd')}")
        body.append([g["labels"][impl]] + cells)
    return body


def problem_lines(rows: Sequence[dict], not_measured: Sequence[dict], where: Callable[[dict], str]) -> List[str]:
    """The end of a summary: the rows ``not_measured`` grouped by implementation, status, stage and reason
    (``where(row)`` names a row's shape), then warnings for deterministic rows that were not bitwise reproducible
    and for failed correctness checks."""
    lines = []
    if not_measured:
        lines += ["", "Not measured (grouped by implementation and reason):"]
        groups: Dict[tuple, list] = {}
        for r in not_measured:
            key = (r["impl"], r["status"], r.get("stage"), (r.get("reason") or "")[:200])
            groups.setdefault(key, []).append(where(r))
        for (impl, st, stage, reason), at_rows in groups.items():
            at = f" at {stage}" if stage else ""
            lines.append(f"  {impl:<26} {st}{at} [{', '.join(at_rows)}]: {reason}")
    nonbit = [r for r in rows if r.get("deterministic") and r.get("bitwise_repeat") is False]
    if nonbit:
        lines.append("WARNING: deterministic rows NOT bitwise reproducible: "
                     + ", ".join(f"{r['impl']}/{where(r)}" for r in nonbit))
    fails = [r for r in rows if check_failed(r)]
    if fails:
        lines.append("WARNING: correctness check failed: " + ", ".join(f"{r['impl']}/{where(r)}" for r in fails))
    return lines


def group_attn(rows: Sequence[dict]) -> Dict[tuple, dict]:
    """{(hdim, mask): {seqlens, impls (first-seen order), labels, rows: {(impl, seqlen): row}}}
    in hdim, mask (full, causal) order."""
    groups: Dict[tuple, dict] = {}
    for r in rows:
        key = (int(r["hdim"]), r["mask"])
        g = groups.setdefault(key, dict(seqlens=set(), impls=[], labels={}, rows={}))
        g["seqlens"].add(int(r["seqlen"]))
        if r["impl"] not in g["impls"]:
            g["impls"].append(r["impl"])
        g["labels"][r["impl"]] = r.get("label", r["impl"])
        g["rows"][(r["impl"], int(r["seqlen"]))] = r
    out = {}
    for key in sorted(groups, key=lambda k: (k[0], MASK_ORDER.get(k[1], 9), k[1])):
        g = groups[key]
        g["seqlens"] = sorted(g["seqlens"])
        out[key] = g
    return out


def best_tflops(group: dict, seqlen: int, pass_: str,
                pred: Callable[[dict], bool]) -> Optional[tuple]:
    """(tflops, impl_key, row) of the fastest row at `seqlen` with pred(row) true, or None.
    Rows whose correctness check failed are never 'best'."""
    best = None
    for (impl, s), r in group["rows"].items():
        if s != seqlen or not pred(r) or check_failed(r):
            continue
        v = row_tflops(r, pass_)
        if v is not None and (best is None or v > best[0]):
            best = (v, impl, r)
    return best


def is_ours_det(r: dict) -> bool:
    return r.get("family") == "dash" and bool(r.get("deterministic"))


def is_det(r: dict) -> bool:
    return bool(r.get("deterministic"))


def is_nondet(r: dict) -> bool:
    return not r.get("deterministic")


def determinism_tax(group: dict, seqlen: int, pass_: str = "bwd") -> Optional[float]:
    """1 - (best deterministic of ours) / (best non-deterministic among all implementations)."""
    d = best_tflops(group, seqlen, pass_, is_ours_det)
    n = best_tflops(group, seqlen, pass_, is_nondet)
    if d is None or n is None or n[0] <= 0:
        return None
    return 1.0 - d[0] / n[0]


def log_run_header(prog: str, meta: dict) -> None:
    """A run's first lines: the GPU, the software and our build, as the JSON's meta records them."""
    log(f"{prog}: {meta.get('gpu')} ({meta.get('sm_count')} SMs), torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
        f"cuDNN {meta.get('cudnn')}, driver {meta.get('driver')}, commit {(meta.get('git_commit') or '?')[:12]}")
    log(f"flash_attn_dash: {meta.get('flash_attn_dash')} kernels={meta.get('flash_attn_dash_kernels')} "
        f"{meta.get('flash_attn_dash_import_error') or ''}; FA4: {meta.get('flash_attn_4')}")


class BenchRunner:
    """The row loop of bench_attn.py, bench_varlen.py and bench_block.py. Per shape, its inputs are made once
    (``make_inputs``; a failure is recorded on each of its rows); each implementation's row (``run_row``) is guarded
    (``guard``: a run whose CUDA context broke, a shape without inputs and a spent time budget skip it), timed under
    the hang watchdog (``timed``: any exception is recorded on the row and the run goes on, unless it broke the CUDA
    context) and written with a progress line (``progress_line``). ``IMPLS`` maps the keys to implementations;
    ``runs_on`` leaves a shape's rows out of the run altogether."""

    IMPLS: Dict[str, "Impl"] = {}

    def __init__(self, args, writer, watchdog, budget):
        import torch
        self.torch, self.args = torch, args
        self.writer, self.watchdog, self.budget = writer, watchdog, budget
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        self.dev = bench_device()
        self.fatal = None  # set when the CUDA context is unusable
        self.current = None  # the row in flight (for the watchdog)
        self.inputs_error = None  # why the current shape's inputs could not be made

    def make_inputs(self, shape):
        raise NotImplementedError

    def run_row(self, impl: "Impl", shape, inputs) -> dict:
        raise NotImplementedError

    def progress_line(self, row: dict, idx: int, total: int) -> str:
        raise NotImplementedError

    def runs_on(self, impl: "Impl", shape) -> bool:
        return True

    def guard(self, row: dict, inputs, ours: bool) -> bool:
        """Whether ``row`` cannot run (it then says why): the run aborted, the shape has no inputs, or the time budget
        of its family (``ours``) is spent. Makes ``row`` the one in flight."""
        self.current = row
        if self.fatal:
            row.update(status="skipped", reason=f"aborted: {self.fatal}")
        elif inputs is None:
            status = "oom" if "memory" in (self.inputs_error or "").lower() else "error"
            row.update(status=status, reason=self.inputs_error, stage="make_inputs")
        elif self.budget.exceeded(ours=ours):
            row.update(status="skipped", reason=self.budget.reason(ours=ours))
        else:
            return False
        return True

    def timed(self, row: dict, impl: "Impl", label: str, body: Callable[[Stage], None]) -> None:
        """``body(stage)`` under the watchdog (``label`` names the row if it hangs): an ImplUnavailable found on the
        way skips the row (no kernel of a backend for these inputs), any other exception is recorded on it at
        ``stage.name``; a broken CUDA context then aborts the run."""
        t0 = time.monotonic()
        self.watchdog.arm(label)
        stage = Stage()
        failed = False
        try:
            body(stage)
        except ImplUnavailable as e:
            row.update(status="skipped", reason=str(e), stage=stage.name)
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the run goes on
            failed = True
            record_failure(row, impl, e, stage.name)
        finally:
            self.watchdog.disarm()
            row["wall_s"] = round(time.monotonic() - t0, 2)
        if failed:  # outside the except block: the traceback no longer pins tensors
            free_cuda()
            self.fatal = fatal_if_context_broken(row, label)

    def run(self, shapes, impls) -> None:
        work = [(shape, [k for k in impls if self.runs_on(self.IMPLS[k], shape)]) for shape in shapes]
        total = sum(len(keys) for _, keys in work)
        idx = 0
        for shape, keys in work:
            if not keys:
                continue
            inputs, self.inputs_error = None, None
            if not self.fatal:
                try:
                    inputs = self.make_inputs(shape)
                except Exception as e:  # noqa: BLE001
                    self.inputs_error = f"input creation failed: {type(e).__name__}: {e}"[:500]
                    free_cuda()
            for key in keys:
                idx += 1
                row = self.run_row(self.IMPLS[key], shape, inputs)
                self.current = None
                self.writer.add(clean_floats(row))
                log(self.progress_line(row, idx, total))
                if row["status"] in ("error", "oom") and row.get("reason"):
                    log(f"      {row['status']} at {row.get('stage')}: {row['reason'][:300]}")
            del inputs
            free_cuda()


def run_rows(make_runner, work, writer, args, budget, summary_text, placeholder: dict,
             hang_hint: str = "") -> "tuple[object, int | None]":
    """Run a benchmark's rows under the hang watchdog, then finish the JSON and print the summary.

    make_runner(watchdog) builds the runner (it has .run(*work), .current and .fatal). Returns
    (runner, exit code) where the code is 1 on Ctrl-C, 3 on an aborted run and None otherwise.
    """
    runner = None

    def on_timeout(label):
        r = dict(runner.current) if runner and runner.current else dict(placeholder)
        r.update(status="timeout", reason=f"watchdog: row exceeded {args.row_timeout:.0f}s{hang_hint}",
                 wall_s=args.row_timeout)
        writer.add(clean_floats(r))
        writer.finish(False, f"watchdog timeout in {label}")
        print(summary_text(writer.rows), flush=True)

    watchdog = Watchdog(args.row_timeout, on_timeout)
    runner = make_runner(watchdog)
    try:
        runner.run(*work)
    except KeyboardInterrupt:
        writer.finish(False, "interrupted")
        print(summary_text(writer.rows))
        return runner, 1
    watchdog.stop()
    writer.finish(runner.fatal is None, runner.fatal)
    print(summary_text(writer.rows))
    log(f"\nwall time {budget.elapsed():.0f}s" + (f"; JSON: {args.json}" if args.json else ""))
    if runner.fatal:
        log(f"ABORTED: {runner.fatal}")
        return runner, 3
    return runner, None
