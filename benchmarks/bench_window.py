#!/usr/bin/env python
"""Sliding-window attention forward/backward throughput, ours beside FlashAttention-4 (issue 19 point 7).

Shapes (--case, default all; bf16, batch 1, q/k/v/dO from torch.randn):
  gpt-oss   hdim 64, 64 query / 8 K/V heads, causal window 128 (window_size (127, 0)) and learnable sinks, 8k/16k/32k
  mistral   hdim 128, 32 / 8 heads, causal window 4096 (window_size (4095, 0)), 8k/16k/32k
  causal    the gpt-oss shape without a window or sinks (the issue's target: window 128 at 32k costs <= 5% of this
            backward)
  llama     hdim 128, 32 / 8 heads, causal (Llama-3-8B's attention): the GQA backward at hdim 128 without a window
  gemma     hdim 256, 16 / 8 heads (Gemma-2-9B's local layers), causal window 4096 and softcap 50
  hdim256   the gemma shape causal, without a window or softcap (Gemma's global layers without softcap, Qwen3-Next)
  mla       DeepSeek-V3's attention: q/k head dim 192, v head dim 128, 16 heads (MHA), causal
Implementations (--impl): dash (ours, non-deterministic), dash-det (ours, deterministic "auto"), fa4, fa4-det
(FlashAttention-4's flash_attn.cute.flash_attn_func, window sides -1 as None), when importable; not in the default
rows, dash-det-descending and dash-det-diagonal (ours deterministic in that order: what auto's order on bands is
measured with). cuDNN has no sliding window in torch's SDPA, so it has no rows here.

Timing: bench_attn.py's method (benchmarks/common.measure_fwd_bwd: CUDA events, median of --iters calls after
--warmup, --sets input sets rotated, a ~1 ms GPU sleep before each call; bwd = the whole torch.autograd.grad call),
and --repeats backwards compared bit for bit. TFLOP/s: fwd = 2 * heads * (hdim + hdim_v) * (query-key pairs the window
lets through, exact), bwd = 2 * heads * (3 hdim + 2 hdim_v) * pairs (2.5 x fwd when hdim_v = hdim). Check: output
rows [0, 64) and [s-64, s) of head 0 against the fp32 reference with dash.md's rule. Results: --json PATH (rewritten
after every row) and a table on stdout.
FAD_BENCH_CPU=1 runs the harness on CPU tensors at --seqlen sizes you give (our rows on the CPU reference), a
self-test: numbers meaningless.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as bc  # noqa: E402

PROG = "bench_window.py"
CASES = {
    "gpt-oss": dict(hdim=64, heads=64, heads_k=8, window=(127, 0), sink=True),
    "mistral": dict(hdim=128, heads=32, heads_k=8, window=(4095, 0), sink=False),
    "causal": dict(hdim=64, heads=64, heads_k=8, window=(-1, 0), sink=False),
    "llama": dict(hdim=128, heads=32, heads_k=8, window=(-1, 0), sink=False),
    "gemma": dict(hdim=256, heads=16, heads_k=8, window=(4095, 0), sink=False, softcap=50.0),
    "hdim256": dict(hdim=256, heads=16, heads_k=8, window=(-1, 0), sink=False),
    "mla": dict(hdim=192, hdim_v=128, heads=16, heads_k=16, window=(-1, 0), sink=False),
}
SEQLENS = (8192, 16384, 32768)
IMPLS = ("dash", "dash-det", "fa4", "fa4-det")
ORDER_IMPLS = ("dash-det-descending", "dash-det-diagonal")


def make_fn(impl: str, window: tuple[int, int], sink, softcap: float = 0.0):
    """fn(q, k, v) -> out for (b, s, h, d) tensors (``sink``: None or the (heads,) learnable sink logits; ``softcap``
    0 = off); raises bc.ImplUnavailable where the implementation is missing."""
    spec = bc.IMPLS[impl]  # bench_attn's rows of the same names: family, mode and order
    det = spec.deterministic
    if spec.family == "dash":
        fad = bc.dash_module()
        kw = dict(window_size=window, learnable_sink=sink, softcap=softcap, deterministic=det,
                  schedule=spec.schedule)
        return lambda q, k, v: fad.flash_attn_func(q, k, v, **kw)
    try:
        from flash_attn.cute import flash_attn_func as fa4_func
    except Exception as e:  # noqa: BLE001 - any import failure means no FA4 rows
        raise bc.ImplUnavailable(f"from flash_attn.cute import flash_attn_func failed: {type(e).__name__}: {e}")
    sides = tuple(None if w < 0 else w for w in window)
    return lambda q, k, v: bc._first(fa4_func(q, k, v, window_size=sides, learnable_sink=sink, softcap=softcap,
                                              deterministic=det))


def check_rows(out, q, k, v, window, sink, softcap):
    """dash.md's rule on output rows [0, 64) and [s-64, s) of batch 0, head 0 (and its K/V head)."""
    import torch

    from flash_attn_dash.reference import attention_ref

    s = q.shape[1]
    n = min(64, s)
    rows = torch.unique(torch.cat([torch.arange(n), torch.arange(s - n, s)])).to(q.device)
    q1, k1, v1 = q[:1, :, :1].detach(), k[:1, :, :1].detach(), v[:1, :, :1].detach()
    s1 = None if sink is None else sink[:1]
    with torch.no_grad():
        ref, _ = attention_ref(q1.float(), k1.float(), v1.float(), window_size=window, learnable_sink=s1,
                               softcap=softcap)
        pt, _ = attention_ref(q1, k1, v1, window_size=window, upcast=False, learnable_sink=s1, softcap=softcap)
    return bc.tol_check(out[:1, :, :1][:, rows], ref[:, rows], pt[:, rows])


def run_row(impl: str, case: str, seqlen: int, args) -> dict:
    import torch

    spec = CASES[case]
    softcap = spec.get("softcap", 0.0)
    dv = spec.get("hdim_v", spec["hdim"])
    row = dict(impl=impl, case=case, seqlen=seqlen, batch=1, heads=spec["heads"], heads_kv=spec["heads_k"],
               hdim=spec["hdim"], hdim_v=dv, window=list(spec["window"]),
               sink=spec["sink"], softcap=softcap, status="ok", reason=None, stage=None,
               fwd=None, bwd=None, bitwise_repeat=None, check=None)
    dev, dtype = bc.bench_device(), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(args.seed + 777)
    sink = torch.randn(spec["heads"], generator=g, device=dev) if spec["sink"] else None
    try:
        fn = make_fn(impl, spec["window"], sink, softcap)
    except bc.ImplUnavailable as e:
        row.update(status="skipped", reason=str(e))
        return row
    sets = []
    for i in range(args.sets):
        g = torch.Generator(device=dev).manual_seed(args.seed * 1000 + i)
        mk = lambda h, d: torch.randn(1, seqlen, h, d, generator=g, device=dev, dtype=dtype)  # noqa: E731
        q, k = mk(spec["heads"], spec["hdim"]), mk(spec["heads_k"], spec["hdim"])
        v, do = mk(spec["heads_k"], dv), mk(spec["heads"], dv)
        for t in (q, k, v):
            t.requires_grad_(True)
        sets.append((q, k, v, do))
    # Per visible pair: QKᵀ and PV forward; the backward recomputes S and forms dP, dV, dQ and dK.
    pairs = spec["heads"] * bc.visible_pairs(seqlen, seqlen, spec["window"])
    flops, bwd_flops = 2.0 * (spec["hdim"] + dv) * pairs, 2.0 * (3 * spec["hdim"] + 2 * dv) * pairs
    stage = bc.Stage()
    t0 = time.monotonic()
    try:
        bc.measure_fwd_bwd(row, fn, sets, args, flops, stage,
                           None if args.no_check else (lambda out, q, k, v: check_rows(out, q, k, v, spec["window"],
                                                                                           sink, softcap)),
                           bwd_flops=bwd_flops)
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the run goes on
        row.update(status="oom" if bc.is_oom(e) else "error", reason=f"{type(e).__name__}: {e}"[:1000],
                   stage=stage.name)
    row["wall_s"] = round(time.monotonic() - t0, 2)
    sets = None
    bc.free_cuda()
    return row


def table(rows) -> str:
    header = ["case", "seqlen", "impl", "fwd TF/s", "bwd TF/s", "bwd ms", "bitwise", "check"]
    body = [[r["case"], bc.seqlen_label(r["seqlen"]), r["impl"],
             bc.fmt_num(bc.row_tflops(r, "fwd")), bc.fmt_num(bc.row_tflops(r, "bwd")),
             bc.fmt_num((r.get("bwd") or {}).get("ms"), 3),
             "-" if r.get("bitwise_repeat") is None else ("yes" if r["bitwise_repeat"] else "NO"),
             r["status"] if r["status"] != "ok" else ("ok" if (r.get("check") or {}).get("ok", True) else "FAIL")]
            for r in rows]
    return bc.text_table(header, body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", metavar="LIST", help=f"cases (default all: {', '.join(CASES)})")
    p.add_argument("--seqlen", action="append", metavar="LIST", help="seqlens (default 8k,16k,32k)")
    p.add_argument("--impl", action="append", metavar="LIST", help=f"implementations (default {','.join(IMPLS)})")
    p.add_argument("--iters", type=int, default=bc.DEFAULT_ITERS)
    p.add_argument("--warmup", type=int, default=bc.DEFAULT_WARMUP)
    p.add_argument("--sets", type=int, default=bc.DEFAULT_SETS)
    p.add_argument("--repeats", type=int, default=bc.DEFAULT_REPEATS)
    p.add_argument("--pad-us", type=float, default=1000.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    cases = bc.parse_list(args.case) or list(CASES)
    impls = bc.parse_list(args.impl) or list(IMPLS)
    seqlens = bc.parse_list(args.seqlen, bc.parse_seqlen) or list(SEQLENS)
    for name, known in (("case", CASES), ("impl", IMPLS + ORDER_IMPLS)):
        bad = [x for x in (cases if name == "case" else impls) if x not in known]
        if bad:
            raise SystemExit(f"{PROG}: unknown {name} {bad[0]!r}; known: {', '.join(known)}")
    bc.require_cuda(PROG)
    writer = bc.ResultWriter(args.json, "window", bc.collect_metadata(argv), dict(vars(args)))
    for case in cases:
        for seqlen in seqlens:
            for impl in impls:
                row = run_row(impl, case, seqlen, args)
                writer.add(row)
                print(f"{case:<8} {bc.seqlen_label(seqlen):>4} {impl:<19} {row['status']:<7} "
                      f"bwd {bc.fmt_num(bc.row_tflops(row, 'bwd'))} TF/s", flush=True)
    writer.finish(True)
    print(table(writer.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
