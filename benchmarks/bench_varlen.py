#!/usr/bin/env python
"""Packed-document (varlen) attention forward/backward throughput (flash-attn-dash benchmarks, issue 18 point 7).

Packs: q (tokens, heads, hdim), k/v (tokens, heads_k, hdim), one cu_seqlens for q and k (self-attention within each
document), q/k/v/dO from torch.randn.
  pareto   long-tailed documents: lengths floor(128 * Pareto(alpha=1)) clipped to [128, the pack's tokens], the last
           one cut to what is left (flash_attn_dash.cad.workload.pareto_doc_lens on Python's random.Random(seed), so a
           pack is a function of (tokens, seed)); --pack-tokens 16k,64k, --seeds 0,1; causal by default.
  uniform  --tokens (16k) tokens of documents of --seqlen s each: bench_attn.py's dense grid as packs; full and causal.
hdim 64/128, heads = --hidden/hdim (2048/hdim), K/V heads --heads-k (default: heads; fewer is GQA). Model features
(issue 19 point 5): --window L runs the causal masks with window_size (L, 0) in every document (gpt-oss: 127, with
--sink), --sink adds learnable sinks (heads,) drawn from a fixed seed; the rows that cannot run them say so.

Implementations (--impl, keys / groups / fnmatch patterns as bench_attn.py):
  dash-varlen, dash-varlen-det           ours, flash_attn_dash.flash_attn_varlen_func (det: schedule "auto");
  dash-varlen-det-descending, dash-varlen-det-diagonal (group ours-varlen-orders, with dash-varlen-det)
                                         ours deterministic varlen in a named portable order (diagonal: causal
                                         masks only), what auto's choice per head dim and mask is measured with;
                                         not in the default rows;
  dash-varlen-kernels, dash-varlen-kernels-det
                                         the same with the varlen kernels forced on for the row (the gates
                                         varlen_cuda.FWD/BWD_KERNEL_VALIDATED);
  dash-dense, dash-dense-det, dash-dense-det-descending
                                         ours, flash_attn_func on the (batch, seqlen) view of a uniform pack (the
                                         varlen-vs-dense comparison at equal shapes; "descending" is the order
                                         deterministic varlen "auto" runs but on causal hdim 64 packs);
  fa4-varlen, fa4-varlen-det             FlashAttention-4, flash_attn.cute.flash_attn_varlen_func(...,
                                         deterministic=), when importable;
  cudnn-varlen                           cuDNN through torch's nested (jagged) tensors and SDPA's CUDNN_ATTENTION
                                         backend: torch.nn.attention.varlen.varlen_attn has its cuDNN path switched
                                         off (torch 2.13), so nested SDPA is torch's only varlen route to cuDNN. The
                                         nested path takes no GQA: K/V are repeated to the query heads inside the
                                         timed call, as bench_attn.py's SDPA rows do.
A row that cannot run here (no kernels, FA4 not installed, no CUDA) is recorded as skipped; the run goes on.

What is timed is bench_attn.py's method: CUDA events, median of --iters >= 20 calls after --warmup, --sets input sets
rotated against L2, a ~1 ms GPU sleep before each call; fwd = one call (inputs require grad), bwd = the whole
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True). Where our varlen CUDA path runs one dense call per
document (the requests the varlen kernels do not run), its device-to-host copy of cu_seqlens waits for the sleep, so
the host time of its per-document launches is inside the measured interval, as it is in training.
TFLOP/s: fwd = sum over documents of 4 * heads * hdim * (query-key pairs the mask lets through: l^2 full,
l(l+1)/2 causal, those of the window with --window; exact), bwd = 2.5 x fwd. (bench_attn.py counts s^2/2 for causal, so at equal time a causal uniform
pack reads (s+1)/s times its number here; ratios within this harness use the same count on both sides.)

Each row records the pack (kind, tokens, seed, lengths), fwd/bwd ms and TFLOP/s, bitwise_repeat (dq/dk/dv torch.equal
over --repeats backwards of one forward), a check and schedule_used (ours). The check: an output slice of the real
pack's longest document against an fp32 reference (dash.md's rule), and out/dq/dk/dv of a small pack (--check-tokens,
2 K/V heads) against per-document calls of our dense flash_attn_func (deterministic, in the order varlen_schedule_used
reports for the document on our deterministic varlen rows, "descending" on the others) and an fp32 reference: err <=
2 x the dense call's err + atol; rows bound by the reproducibility contract (ours deterministic varlen, ours dense
"descending") must also equal the per-document calls bit for bit.

Results: --json PATH (rewritten after every row), a compact table on stdout with the ratios the issue targets (varlen
within 3% of dense; deterministic varlen >= FA4 deterministic and >= 0.97 x FA4 non-deterministic on pareto packs).
Exit codes: 0 done, 1 harness error or --strict failure, 2 no CUDA, 3 aborted (hang watchdog, unusable CUDA context).
FAD_BENCH_CPU=1 runs the harness on CPU tensors (our rows on the CPU reference), a self-test: numbers meaningless.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import itertools
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common as bc  # noqa: E402
from flash_attn_dash.cad.workload import pareto_doc_lens  # noqa: E402  (pure Python: --help/--dry-run need no torch)

PROG = "bench_varlen.py"
PARETO_MIN = 128  # the Pareto scale and the shortest document
PACK_TOKENS = [16384, 65536]
SEEDS = [0, 1]
KINDS = ["pareto", "uniform"]
DEFAULT_MASKS = {"pareto": ["causal"], "uniform": ["full", "causal"]}


# --------------------------------------------------------------------------- packs
@dataclass(frozen=True)
class Pack:
    kind: str  # "pareto" | "uniform"
    tokens: int
    lengths: Tuple[int, ...]
    seed: Optional[int] = None  # pareto packs
    seqlen: Optional[int] = None  # uniform packs

    @property
    def label(self) -> str:
        return (f"{bc.seqlen_label(self.tokens)} s{self.seed}" if self.kind == "pareto"
                else bc.seqlen_label(self.seqlen))

    @property
    def max_len(self) -> int:
        return max(self.lengths)

    def offsets(self) -> List[int]:
        return [0, *itertools.accumulate(self.lengths)]

    def describe(self) -> dict:
        return dict(pack=self.label, pack_kind=self.kind, tokens=self.tokens, seed=self.seed, seqlen=self.seqlen,
                    n_docs=len(self.lengths), max_seqlen=self.max_len, lengths=list(self.lengths))


def pareto_pack(tokens: int, seed: int) -> Pack:
    """The long-tailed pack of ``tokens`` tokens drawn with ``seed`` (the same pack on every machine)."""
    lengths = pareto_doc_lens(1, tokens, seed, alpha=1.0, scale=PARETO_MIN, min_len=PARETO_MIN)[0]
    return Pack("pareto", tokens, tuple(lengths), seed=seed)


def uniform_pack(tokens: int, seqlen: int) -> Pack:
    if tokens % seqlen:
        raise ValueError(f"tokens {tokens} not divisible by seqlen {seqlen}")
    return Pack("uniform", tokens, (seqlen,) * (tokens // seqlen), seqlen=seqlen)


def small_pack(pack: Pack, tokens: int) -> Pack:
    """The correctness check's pack for ``pack``: same kind (and seed), ``tokens`` tokens."""
    if pack.kind == "pareto":
        return pareto_pack(tokens, pack.seed)
    s = min(pack.seqlen, tokens // 2)
    return uniform_pack(2 * s, s)


def doc_pairs(length: int, causal: bool, window_left: Optional[int] = None) -> int:
    """Query-key pairs of one document that its mask lets through (query i sees keys j <= i when causal, and j >= i
    - window_left with a window)."""
    if window_left is not None:
        return bc.visible_pairs(length, length, (window_left, 0))
    return length * (length + 1) // 2 if causal else length * length


def pack_fwd_flops(lengths, heads: int, hdim: int, causal: bool, window_left: Optional[int] = None) -> float:
    """Forward FLOPs of a pack: Q.K^T and P.V, 2 * hdim each per visible pair and query head."""
    return 4.0 * heads * hdim * sum(doc_pairs(n, causal, window_left) for n in lengths)


# --------------------------------------------------------------------------- implementations
@dataclass
class VarlenImpl(bc.Impl):
    api: str = "varlen"  # "varlen": one call on the packed tensors; "dense": the (batch, seqlen) view of a uniform pack
    bitwise_as_dense: bool = False  # the contract: its bits equal per-document dense calls (dense_schedules' orders)
    varlen_kernels: bool = False  # ours: the varlen kernels forced on while the row runs

    def runs_on(self, sh: dict) -> bool:
        """Whether the row runs on the shape: dense rows on uniform packs only, an order on the masks it is for."""
        return (self.api == "varlen" or sh["pack"].kind == "uniform") and self.applies_to(sh["mask"])

    def describe(self) -> dict:
        return dict(super().describe(), api=self.api)


IMPLS: Dict[str, VarlenImpl] = {i.key: i for i in [
    VarlenImpl("dash-varlen", "ours varlen non-det", "dash", False, "auto"),
    VarlenImpl("dash-varlen-det", "ours varlen det auto", "dash", True, "auto", bitwise_as_dense=True),
    VarlenImpl("dash-varlen-det-descending", "ours varlen det descending", "dash", True, "descending",
               bitwise_as_dense=True),
    VarlenImpl("dash-varlen-det-diagonal", "ours varlen det diagonal", "dash", True, "diagonal", masks=("causal",),
               bitwise_as_dense=True),
    VarlenImpl("dash-varlen-kernels", "ours varlen kernels non-det", "dash", False, "auto", varlen_kernels=True),
    VarlenImpl("dash-varlen-kernels-det", "ours varlen kernels det auto", "dash", True, "auto", bitwise_as_dense=True,
               varlen_kernels=True),
    VarlenImpl("dash-dense", "ours dense non-det", "dash", False, "auto", api="dense"),
    VarlenImpl("dash-dense-det", "ours dense det auto", "dash", True, "auto", api="dense"),
    VarlenImpl("dash-dense-det-descending", "ours dense det descending", "dash", True, "descending", api="dense",
               bitwise_as_dense=True),
    VarlenImpl("fa4-varlen", "FA4 varlen non-det", "fa4", False),
    VarlenImpl("fa4-varlen-det", "FA4 varlen det", "fa4", True),
    VarlenImpl("cudnn-varlen", "cuDNN varlen non-det", "sdpa", False, backend="CUDNN_ATTENTION"),
]}
# ours deterministic varlen in a named portable order (auto picks among them, launch.varlen_request): what the
# choice per head dim and mask is measured with, outside the default rows
ORDER_ROWS = ("dash-varlen-det-descending", "dash-varlen-det-diagonal")
IMPL_GROUPS = {
    "ours": [k for k in IMPLS if k.startswith("dash-")],
    "ours-varlen": ["dash-varlen", "dash-varlen-det", "dash-varlen-kernels", "dash-varlen-kernels-det"],
    "ours-dense": ["dash-dense", "dash-dense-det", "dash-dense-det-descending"],
    # deterministic varlen in each portable order auto picks from (launch.varlen_request), one order per row
    "ours-varlen-orders": ["dash-varlen-det", *ORDER_ROWS],
    "fa4-all": ["fa4-varlen", "fa4-varlen-det"],
    # the kernels' rows are for runs before their gates lift (after it, dash-varlen* run the kernels)
    "default": [k for k in IMPLS if not IMPLS[k].varlen_kernels and k not in ORDER_ROWS],
    "all": list(IMPLS),
}
# (label, numerator impl, denominator impl) per pack kind: the targets, bwd / fwd
RATIOS = {
    "uniform": [("varlen / dense non-det (>= 0.97)", "dash-varlen", "dash-dense"),
                ("varlen det / dense det descending (>= 0.97)", "dash-varlen-det", "dash-dense-det-descending"),
                ("det diagonal / det descending", "dash-varlen-det-diagonal", "dash-varlen-det-descending")],
    "pareto": [("det / FA4 det (>= 1)", "dash-varlen-det", "fa4-varlen-det"),
               ("det / FA4 non-det (>= 0.97)", "dash-varlen-det", "fa4-varlen"),
               ("det diagonal / det descending", "dash-varlen-det-diagonal", "dash-varlen-det-descending")],
}


def nested_sdpa_fn(pack: Pack, causal: bool, cu, backend: str):
    """fn(q, k, v) -> out on packed tensors through nested (jagged) tensors and SDPA restricted to ``backend``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    offsets = cu.long()  # nested tensors keep int64 offsets; made once, outside the timed calls
    lo, hi = min(pack.lengths), pack.max_len  # given, so that no call reads them back from the device
    sdp_backend = getattr(SDPBackend, backend)

    def nest(t):  # (tokens, heads, d) -> (docs, heads, jagged tokens, d), a view
        return torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)

    def fn(q, k, v):
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with sdpa_kernel(sdp_backend):
            try:
                out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=causal)
            except RuntimeError as e:  # torch found no kernel of the backend for these nested inputs
                if "No viable backend" in str(e):
                    raise bc.ImplUnavailable(f"SDPA {backend} on nested tensors: {e}") from e
                raise
        return out.transpose(1, 2).values()
    return fn


@contextlib.contextmanager
def forced_varlen_kernels(on: bool):
    """The varlen kernels' gates set while a row runs (nothing when ``on`` is False or our package is absent)."""
    if not on:
        yield
        return
    vc = importlib.import_module("flash_attn_dash.varlen_cuda")
    saved = vc.FWD_KERNEL_VALIDATED, vc.BWD_KERNEL_VALIDATED
    vc.FWD_KERNEL_VALIDATED = vc.BWD_KERNEL_VALIDATED = True
    try:
        yield
    finally:
        vc.FWD_KERNEL_VALIDATED, vc.BWD_KERNEL_VALIDATED = saved


def features_kw(window_left: Optional[int], sink) -> dict:
    """Our API's keywords for the row's model features (none: {})."""
    kw = {}
    if window_left is not None:
        kw["window_size"] = (window_left, 0)
    if sink is not None:
        kw["learnable_sink"] = sink
    return kw


def make_fn(impl: VarlenImpl, pack: Pack, causal: bool, cu, window_left: Optional[int] = None, sink=None):
    """fn(q, k, v) -> out for packed (tokens, heads, d) tensors; ``cu`` is the pack's int32 offsets on their device;
    ``window_left`` / ``sink``: the model features (--window, --sink). Raises ImplUnavailable when the implementation
    cannot run here."""
    m = pack.max_len
    if impl.family == "dash":
        fad = bc.dash_module()
        kw = dict(causal=causal, deterministic=impl.deterministic, schedule=impl.schedule,
                  **features_kw(window_left, sink))
        if impl.api == "varlen":
            return lambda q, k, v: fad.flash_attn_varlen_func(q, k, v, cu, cu, m, m, **kw)
        b, s = len(pack.lengths), pack.seqlen

        def dense(q, k, v):
            out = fad.flash_attn_func(q.view(b, s, *q.shape[1:]), k.view(b, s, *k.shape[1:]),
                                      v.view(b, s, *v.shape[1:]), **kw)
            return out.reshape(q.shape)
        return dense
    if impl.family == "fa4":
        try:
            from flash_attn.cute import flash_attn_varlen_func as fa4
        except Exception as e:
            raise bc.ImplUnavailable(f"from flash_attn.cute import flash_attn_varlen_func failed: "
                                     f"{type(e).__name__}: {e}")
        det = impl.deterministic
        extra = {}  # FA4 spells an unbounded side None
        if window_left is not None:
            extra["window_size"] = (window_left, 0)
        if sink is not None:
            extra["learnable_sink"] = sink
        # keywords only: FA4 releases insert parameters between q/k/v and cu_seqlens_q (qv)
        return lambda q, k, v: bc._first(fa4(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m,
                                             max_seqlen_k=m, causal=causal, deterministic=det, **extra))
    if impl.family == "sdpa":
        if window_left is not None or sink is not None:
            raise bc.ImplUnavailable("SDPA on nested tensors takes no sliding window or learnable sink")
        if bc.bench_device() != "cuda":
            raise bc.ImplUnavailable(f"SDPA backend {impl.backend} needs CUDA tensors")
        return nested_sdpa_fn(pack, causal, cu, impl.backend)
    raise ValueError(f"unknown family {impl.family}")


def schedule_used(impl: VarlenImpl, pack: Pack, causal: bool, q, k, cu, window_left: Optional[int] = None):
    """What our API reports it runs: varlen, {order: documents}; dense, the order. 'error: ...' if it raised."""
    if impl.family != "dash":
        return None
    try:
        fad = bc.dash_module()
        kw = dict(causal=causal, deterministic=impl.deterministic, schedule=impl.schedule,
                  **features_kw(window_left, None))
        m = pack.max_len
        if impl.api == "varlen":
            per_doc = fad.varlen_schedule_used(q, k, cu, cu, m, m, **kw)
            return dict(collections.Counter(per_doc))
        b, s = len(pack.lengths), pack.seqlen
        return fad.backward_schedule_used(q.view(b, s, *q.shape[1:]), k.view(b, s, *k.shape[1:]), **kw)
    except Exception as e:  # the answer is informative only: never lose the row's timings to it
        return f"error: {type(e).__name__}: {e}"[:300]


# --------------------------------------------------------------------------- CLI and plan
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", action="append", metavar="LIST",
                   help=f"implementations (comma separated, repeatable): keys {', '.join(IMPLS)}; groups "
                        f"{', '.join(IMPL_GROUPS)}; or fnmatch patterns like 'dash-*'. Default: all")
    p.add_argument("--packs", action="append", metavar="LIST", help="pack kinds: pareto, uniform (default both)")
    p.add_argument("--pack-tokens", action="append", metavar="LIST",
                   help="tokens of each pareto pack, e.g. 16k,64k (default)")
    p.add_argument("--seeds", action="append", metavar="LIST", help="pareto pack seeds (default 0,1)")
    p.add_argument("--tokens", type=int, default=bc.TOKENS_PER_BATCH,
                   help="tokens of each uniform pack (default 16384)")
    p.add_argument("--seqlen", action="append", metavar="LIST",
                   help="uniform packs' document lengths, e.g. 512,2k,16k (default 512..16k)")
    p.add_argument("--hdim", action="append", metavar="LIST", help="head dims (default 64,128)")
    p.add_argument("--mask", action="append", metavar="LIST",
                   help="full, causal or full,causal for every pack (default: pareto causal, uniform both)")
    p.add_argument("--hidden", type=int, default=bc.HIDDEN, help="heads = hidden/hdim (default 2048)")
    p.add_argument("--heads-k", type=int, default=None,
                   help="K/V heads (default: the query heads; fewer gives GQA, e.g. 8)")
    p.add_argument("--window", type=int, default=None, metavar="LEFT",
                   help="a sliding window on the causal masks: window_size (LEFT, 0) in every document (gpt-oss: 127)")
    p.add_argument("--sink", action="store_true", help="learnable sinks (heads,), gpt-oss style")
    p.add_argument("--quick", action="store_true",
                   help="quick subset: seed 0 only, uniform seqlen 2k,8k, --budget-s 120 unless given")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--iters", type=int, default=bc.DEFAULT_ITERS,
                   help=f"timed iterations per measurement (>= {bc.MIN_ITERS})")
    p.add_argument("--warmup", type=int, default=bc.DEFAULT_WARMUP)
    p.add_argument("--sets", type=int, default=bc.DEFAULT_SETS, help="input sets rotated between calls (default 3)")
    p.add_argument("--repeats", type=int, default=bc.DEFAULT_REPEATS, help="backwards compared bitwise (default 5)")
    p.add_argument("--pad-us", type=float, default=1000.0,
                   help="GPU sleep before each timed call to hide launch overhead (0 = off)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--check-tokens", type=int, default=2048, help="tokens of the small check pack (default 2048)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: later rows are recorded as skipped (ours get 1.25x the budget)")
    p.add_argument("--row-timeout", type=float, default=300.0,
                   help="watchdog: a row running longer is taken for a hang -> partial JSON, exit 3 (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (not of the packs: --seeds)")
    p.add_argument("--json", metavar="PATH", help="write results here (JSON)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any row errored, failed its check, or a deterministic row was not bitwise "
                        "reproducible")
    p.add_argument("--dry-run", action="store_true", help="print the planned rows and exit")
    return p


def plan(args) -> Tuple[List[dict], List[str]]:
    """(shapes, implementation keys); a shape is a pack with hdim, heads, heads_k and mask."""
    kinds = bc.parse_list(args.packs) or KINDS
    pack_tokens = bc.parse_list(args.pack_tokens, bc.parse_seqlen) or PACK_TOKENS
    seeds = bc.parse_list(args.seeds, int) or (SEEDS[:1] if args.quick else SEEDS)
    seqlens = bc.parse_list(args.seqlen, bc.parse_seqlen) or (bc.QUICK_SEQLENS if args.quick else bc.SEQLENS)
    hdims = bc.parse_list(args.hdim, int) or bc.HDIMS
    masks = bc.parse_list(args.mask)
    if args.quick and args.budget_s is None:
        args.budget_s = 120.0
    if args.iters < bc.MIN_ITERS:
        raise SystemExit(f"{PROG}: --iters must be >= {bc.MIN_ITERS} (reduce the packs instead)")
    if args.sets < 1 or args.repeats < 2:
        raise SystemExit(f"{PROG}: --sets >= 1 and --repeats >= 2 required")
    if args.check_tokens < 2 * PARETO_MIN:
        raise SystemExit(f"{PROG}: --check-tokens must be >= {2 * PARETO_MIN}")
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"{PROG}: unknown pack kind {kind!r} ({', '.join(KINDS)})")
    for m in masks or []:
        if m not in bc.MASKS:
            raise SystemExit(f"{PROG}: unknown mask {m!r} (full, causal)")
    if args.window is not None:
        if args.window < 0:
            raise SystemExit(f"{PROG}: --window must be >= 0 (the keys before the query a row sees), got {args.window}")
        if "full" in (masks or []):
            raise SystemExit(f"{PROG}: --window runs on the causal masks: drop 'full' from --mask")
        masks = ["causal"]
    try:
        impls = bc.select_impls(args.impl, IMPL_GROUPS["default"], IMPLS, IMPL_GROUPS)
        packs = []
        for kind in kinds:
            if kind == "pareto":
                for tokens in pack_tokens:
                    if tokens < PARETO_MIN:
                        raise ValueError(f"pareto packs need >= {PARETO_MIN} tokens, got {tokens}")
                packs += [pareto_pack(t, s) for t in pack_tokens for s in seeds]
            else:
                packs += [uniform_pack(args.tokens, s) for s in seqlens]
        shapes = []
        for d in hdims:
            if args.hidden % d:
                raise ValueError(f"hidden {args.hidden} not divisible by hdim {d}")
            heads = args.hidden // d
            heads_k = args.heads_k or heads
            if heads_k < 1 or heads % heads_k:
                raise ValueError(f"--heads-k {heads_k} must divide the {heads} query heads of hdim {d}")
            for kind in kinds:
                for mask in masks or DEFAULT_MASKS[kind]:
                    shapes += [dict(pack=p, hdim=d, heads=heads, heads_k=heads_k, mask=mask, causal=mask == "causal",
                                    window_left=args.window, sink=args.sink)
                               for p in packs if p.kind == kind]
    except ValueError as e:
        raise SystemExit(f"{PROG}: {e}")
    return shapes, impls


def shape_str(sh) -> str:
    p = sh["pack"]
    features = (f" window={sh['window_left']}" if sh.get("window_left") is not None else "") + \
        (" sink" if sh.get("sink") else "")
    return (f"{p.kind:<7} {p.label:>7} hdim{sh['hdim']} {sh['mask']:<6} docs={len(p.lengths)} "
            f"max={p.max_len} h={sh['heads']}/{sh['heads_k']}{features}")


# --------------------------------------------------------------------------- runner
class Runner(bc.BenchRunner):
    IMPLS = IMPLS

    # ------------------------------------------------------------------ inputs
    def offsets(self, pack: Pack):
        return self.torch.tensor(pack.offsets(), dtype=self.torch.int32, device=self.dev)

    def random_pack(self, tokens: int, heads: int, heads_k: int, hdim: int, seed: int):
        """(q, k, v, dout) of a pack in the benchmark dtype on the benchmark device."""
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        return tuple(torch.randn((tokens, h, hdim), generator=g, device=self.dev, dtype=self.dtype)
                     for h in (heads, heads_k, heads_k, heads))

    def sink_for(self, sh, heads: int):
        """The row's learnable sink logits for ``heads`` query heads (fp32, fixed seed), or None without --sink."""
        if not sh.get("sink"):
            return None
        g = self.torch.Generator(device=self.dev).manual_seed(4242)
        return self.torch.randn(heads, generator=g, device=self.dev, dtype=self.torch.float32)

    def make_inputs(self, sh):
        """The row's rotated (q, k, v, dout) sets and the pack's offsets."""
        sets = []
        for i in range(self.args.sets):
            q, k, v, do = self.random_pack(sh["pack"].tokens, sh["heads"], sh["heads_k"], sh["hdim"],
                                           self.args.seed * 1000 + i)
            sets.append((q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do))
        return sets, self.offsets(sh["pack"])

    def runs_on(self, impl, sh):
        return impl.runs_on(sh)

    # ------------------------------------------------------------------ checks
    def check_out_slice(self, out, q, k, v, pack: Pack, causal: bool, window_left=None, sink=None):
        """Rows [0, 64) and [l-64, l) of the longest document, query heads {0, h-1}, vs the fp32 reference."""
        torch = self.torch
        i = pack.lengths.index(pack.max_len)
        start, n = pack.offsets()[i], pack.max_len
        r = min(64, n)
        rows = torch.unique(torch.cat([torch.arange(r), torch.arange(n - r, n)])).to(self.dev)
        heads = sorted({0, q.shape[1] - 1})
        group = q.shape[1] // k.shape[1]
        qh = torch.tensor(heads, device=self.dev)
        kh = torch.tensor([h // group for h in heads], device=self.dev)
        doc = slice(start, start + n)
        with torch.no_grad():
            qs = q[doc].index_select(1, qh)[None]
            ks, vs = (t[doc].index_select(1, kh)[None] for t in (k, v))
            sk = None if sink is None else sink[qh]
            ref = bc.attention_ref(qs, ks, vs, causal, rows=rows, upcast=True, window_left=window_left, sink=sk)
            pt = bc.attention_ref(qs, ks, vs, causal, rows=rows, upcast=False, window_left=window_left, sink=sk)
            x = out[doc].index_select(1, qh)[None][:, rows]
            return bc.tol_check(x, ref, pt)

    def dense_schedules(self, impl: VarlenImpl, pack: Pack, causal: bool, q, k, window_left=None) -> List[str]:
        """The order of each document's dense call that the row's bits are compared with: for our deterministic
        varlen rows the order ``varlen_schedule_used`` reports for the document (the contract: the dense call in
        that order gives the same bits; None, a document without backward work, runs "descending"), else
        "descending"."""
        if impl.family == "dash" and impl.api == "varlen" and impl.deterministic:
            m = pack.max_len
            cu = self.offsets(pack)
            return bc.dash_module().varlen_schedule_used(q, k, cu, cu, m, m, causal=causal, deterministic=True,
                                                         schedule=impl.schedule, **features_kw(window_left, None))
        return ["descending"] * len(pack.lengths)

    def per_document(self, q, k, v, do, pack: Pack, causal: bool, schedules: List[str], window_left=None, sink=None):
        """(out, dq, dk, dv) of our dense flash_attn_func (deterministic, document i in ``schedules[i]``) and of the
        fp32 reference, each document alone, packed again."""
        torch = self.torch
        fad = bc.dash_module()
        dense, ref = [], []
        for a, b, schedule in zip(pack.offsets()[:-1], pack.offsets()[1:], schedules):
            doc = [t[a:b][None] for t in (q, k, v)]
            lv = [t.clone().requires_grad_(True) for t in doc]
            o = fad.flash_attn_func(*lv, causal=causal, deterministic=True, schedule=schedule or "descending",
                                    **features_kw(window_left, sink))
            dense.append((o.detach(),) + torch.autograd.grad(o, lv, do[a:b][None]))
            lv = [t.float().requires_grad_(True) for t in doc]
            o = bc.attention_ref(*lv, causal, upcast=True, window_left=window_left, sink=sink)
            ref.append((o.detach(),) + torch.autograd.grad(o, lv, do[a:b][None].float()))
        return ([torch.cat([d[i][0] for d in dense]) for i in range(4)],
                [torch.cat([d[i][0] for d in ref]) for i in range(4)])

    def check_small(self, impl: VarlenImpl, sh):
        """out/dq/dk/dv of a small pack of the row's kind vs per-document dense calls and the fp32 reference."""
        torch = self.torch
        pack = small_pack(sh["pack"], self.args.check_tokens)
        heads_k, heads = 2, 2 * (sh["heads"] // sh["heads_k"])
        q, k, v, do = self.random_pack(pack.tokens, heads, heads_k, sh["hdim"], self.args.seed + 12345)
        sink = self.sink_for(sh, heads)
        fn = make_fn(impl, pack, sh["causal"], self.offsets(pack), sh.get("window_left"), sink)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        got = (out.detach(),) + torch.autograd.grad(out, leaves, do)
        schedules = self.dense_schedules(impl, pack, sh["causal"], q, k, sh.get("window_left"))
        dense, ref = self.per_document(q, k, v, do, pack, sh["causal"], schedules, sh.get("window_left"), sink)
        res = dict(lengths=list(pack.lengths), heads=heads, heads_kv=heads_k,
                   dense_schedules=dict(collections.Counter(schedules)))
        names = ("out", "dq", "dk", "dv")
        for i, nm in enumerate(names):
            res[nm] = bc.tol_check(got[i], ref[i], dense[i])
        res["bitwise_vs_dense"] = all(torch.equal(x, y) for x, y in zip(got, dense))
        res["ok"] = all(res[nm]["ok"] for nm in names) and (res["bitwise_vs_dense"] or not impl.bitwise_as_dense)
        return res

    # ------------------------------------------------------------------ one row
    def run_row(self, impl: VarlenImpl, sh, inputs):
        with forced_varlen_kernels(impl.varlen_kernels):
            return self._run_row(impl, sh, inputs)

    def _run_row(self, impl: VarlenImpl, sh, inputs):
        args = self.args
        pack = sh["pack"]
        row = impl.describe()
        row.update(pack.describe())
        row.update(dtype=args.dtype, heads=sh["heads"], heads_kv=sh["heads_k"], hdim=sh["hdim"], mask=sh["mask"],
                   causal=sh["causal"], window_left=sh.get("window_left"), sink=bool(sh.get("sink")), status="ok",
                   reason=None, stage=None, fwd=None, bwd=None,
                   bitwise_repeat=None, n_repeats=None, repeat_max_abs_dev=None, check=None, schedule_used=None,
                   wall_s=None)
        if self.guard(row, inputs, ours=impl.family == "dash"):
            return row
        sets, cu = inputs
        window_left, sink = sh.get("window_left"), self.sink_for(sh, sh["heads"])
        try:
            fn = make_fn(impl, pack, sh["causal"], cu, window_left, sink)
        except bc.ImplUnavailable as e:
            row.update(status="skipped", reason=str(e))
            return row
        fwd_flops = pack_fwd_flops(pack.lengths, sh["heads"], sh["hdim"], sh["causal"], window_left)

        def body(stage):
            check_out = None if args.no_check else (
                lambda out, q, k, v: self.check_out_slice(out, q, k, v, pack, sh["causal"], window_left, sink))
            bc.measure_fwd_bwd(row, fn, sets, args, fwd_flops, stage, check_out)
            if not args.no_check:
                stage.name = "check_small"
                try:
                    row["check"]["small"] = self.check_small(impl, sh)
                    row["check"]["ok"] = bool(row["check"]["ok"] and row["check"]["small"]["ok"])
                except bc.ImplUnavailable as e:  # our dense kernels are the reference
                    row["check"]["small"] = dict(ok=None, reason=f"reference unavailable: {e}")
            stage.name = "schedule_used"
            q, k, _, _ = sets[0]
            row["schedule_used"] = schedule_used(impl, pack, sh["causal"], q, k, cu, window_left)
        self.timed(row, impl, f"{impl.key} {shape_str(sh)}", body)
        return row

    def progress_line(self, row, idx, total):
        return progress_line(row, idx, total)


# --------------------------------------------------------------------------- output
def progress_line(row, idx, total) -> str:
    def t(p):
        x = row.get(p)
        return (f"{x['ms']:8.3f} ms {x['tflops']:6.1f} TF" if x and x.get("tflops") is not None
                else f"{'-':>20}")
    chk = row.get("check") or {}
    chk_s = {True: "ok", False: "FAIL"}.get(chk.get("ok"), "-")
    bw = {True: "yes", False: "NO", None: "-"}[row.get("bitwise_repeat")]
    extra = f"  [{row['status']}: {(row.get('reason') or '')[:90]}]" if row["status"] != "ok" else ""
    return (f"[{idx:3d}/{total}] {row['label']:<26} {row['pack_kind']:<7} {row['pack']:>7} hdim{row['hdim']:<3} "
            f"{row['mask']:<6} fwd {t('fwd')}  bwd {t('bwd')}  bitwise={bw:<3} check={chk_s}{extra}")


def row_where(r) -> str:
    return f"{r['pack_kind']}/{r['pack']}/hdim{r['hdim']}/{r['mask']}"


def group_rows(rows) -> Dict[tuple, dict]:
    """{(kind, hdim, mask): {packs, impls (first-seen order), labels, rows: {(impl, pack): row}}}."""
    groups: Dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["pack_kind"], r["hdim"], r["mask"]), dict(packs=[], impls=[], labels={}, rows={}))
        if r["pack"] not in g["packs"]:
            g["packs"].append(r["pack"])
        if r["impl"] not in g["impls"]:
            g["impls"].append(r["impl"])
        g["labels"][r["impl"]] = r.get("label", r["impl"])
        g["rows"][(r["impl"], r["pack"])] = r
    return groups


def ratio_cell(g, pack: str, num: str, den: str) -> str:
    """'bwd / fwd' TFLOP/s ratio of two implementations on one pack; '-' where either has no valid number."""
    a, b = g["rows"].get((num, pack)), g["rows"].get((den, pack))
    if a is None or b is None or bc.check_failed(a) or bc.check_failed(b):
        return "-"
    cells = []
    for p in ("bwd", "fwd"):
        x, y = bc.row_tflops(a, p), bc.row_tflops(b, p)
        cells.append(f"{x / y:.3f}" if x and y else "-")
    return " / ".join(cells)


def summary_text(rows) -> str:
    """Per pack kind x hdim x mask: implementations x packs, cells 'bwd / fwd' TFLOP/s, then the target ratios."""
    parts = ["", "Summary: TFLOP/s as 'bwd / fwd'; * = dq/dk/dv bit-identical over repeats, ! = correctness check "
                 "failed, - = skipped, err/oom/hang = failed; ratios are 'bwd / fwd'"]
    for (kind, hdim, mask), g in group_rows(rows).items():
        hdr = [f"{kind} hdim {hdim} {mask}"] + g["packs"]
        body = bc.impl_table_rows(g, g["packs"])
        for label, num, den in RATIOS[kind]:
            if num in g["impls"] and den in g["impls"]:
                body.append([label] + [ratio_cell(g, p, num, den) for p in g["packs"]])
        parts += ["", bc.text_table(hdr, body)]
    parts += bc.problem_lines(rows, [r for r in rows if r["status"] != "ok"], row_where)
    return "\n".join(parts)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    shapes, impls = plan(args)
    rows = sum(IMPLS[k].runs_on(sh) for sh in shapes for k in impls)
    if args.dry_run:
        print(f"{len(shapes)} shapes, {len(impls)} implementations: {rows} rows (dense ones on uniform packs only)")
        print("implementations: " + ", ".join(impls))
        for sh in shapes:
            print("  " + shape_str(sh))
        return 0
    bc.require_cuda(PROG, has_dry_run=True)
    meta = bc.collect_metadata(sys.argv if argv is None else [PROG] + list(argv))
    config = dict(vars(args))
    config.update(impls=impls, packs=[dict(sh["pack"].describe(), hdim=sh["hdim"], heads=sh["heads"],
                                           heads_kv=sh["heads_k"], mask=sh["mask"]) for sh in shapes],
                  pareto=dict(alpha=1.0, scale=PARETO_MIN, min_len=PARETO_MIN,
                              generator="flash_attn_dash.cad.workload.pareto_doc_lens(1, tokens, seed)"),
                  timing=("CUDA events per call, median; fwd = one attention call (inputs require grad); bwd = "
                          "torch.autograd.grad(out, (q,k,v), dout, retain_graph=True); inputs rotated over `sets` "
                          "sets; GPU sleep of pad_us before each call"),
                  flops="fwd = sum over documents of 4*h*d*visible pairs (l^2 full, l(l+1)/2 causal); bwd = 2.5*fwd")
    writer = bc.ResultWriter(args.json, "varlen", meta, config)
    bc.log_run_header(PROG, meta)
    bc.log(f"{len(shapes)} shapes, {rows} rows, iters={args.iters} warmup={args.warmup} sets={args.sets} "
           f"repeats={args.repeats} budget={args.budget_s}")
    budget = bc.Budget(args.budget_s)
    _, code = bc.run_rows(lambda wd: Runner(args, writer, wd, budget), (shapes, impls), writer, args, budget,
                          summary_text, dict(impl="?", pack_kind="?", pack="?", hdim=0, mask="?"),
                          " (hung kernel?)")
    if code is not None:
        return code
    if args.strict:
        bad = [r for r in writer.rows if r["status"] in ("error", "oom", "timeout") or bc.check_failed(r)
               or (r.get("deterministic") and r.get("bitwise_repeat") is False)]
        if bad:
            bc.log(f"--strict: {len(bad)} failing rows")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
