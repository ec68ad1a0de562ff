"""Host time per call of the launch decision (flash_attn_dash.launch.bwd_launch) and of backward_schedule_used, and of
the varlen call's validation and per-document decisions.

    python benchmarks/bench_host.py [--section all|dense|varlen] [--json OUT]

Runs on any machine (no GPU needed: the decisions are pure Python). Dense section: for each shape, from short
sequences to a 1M-token batch, it times the first decision of a new shape (the lru_cache bypassed, as for every new
shape, e.g. every new pack) and a repeated one (cached), as the median of many calls with time.perf_counter_ns; the
schedule model's simulation is not involved (it is the planner's, `flash-attn-dash plan`). Target: <= 20 us per call.

Varlen section (issue 18 point 3: a few tens of us for a 1M-token pack of 1,000 documents): on CPU tensors (no
kernels), packs of 1 to 1,000 documents with nearly all lengths distinct, median of --varlen-calls calls of each part
of what flash_attn_varlen_func decides on the host: check_varlen_args (dtypes, devices, shapes), read_layout (the
offsets' values read and checked, one PackedSequence per document), the per-document launch decisions of the
backward (launch.sequence_launch, as the interim CUDA path and varlen_schedule_used make them) for a new pack (the
lru_cache cleared before each call, outside the timed region) and a repeated one, and varlen_schedule_used whole (new
pack); and what the varlen kernels' path decides on the host for both passes (check_varlen_args, the kernels' mask
at the maximum lengths, launch.varlen_kernel_launch: nothing per document). Excluded: kernel launches, the binding's
argument checks and, on CUDA tensors, the device-to-host copy of the offsets that read_layout makes (one per forward
and one per backward on the interim path; none on the kernels' path).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (causal, head_dim, seqlen_q, seqlen_k, batch, heads): the DASH grid's ends, GQA-sized long runs, and 1M tokens.
SHAPES = [
    (False, 128, 512, 512, 32, 16), (True, 64, 2048, 2048, 8, 32), (True, 128, 8192, 8192, 2, 16),
    (True, 128, 131072, 131072, 2, 32), (False, 64, 262144, 262144, 2, 16), (True, 128, 1 << 20, 1 << 20, 1, 32),
]
# Varlen packs (tokens, documents) and their shape: 8 query heads, so that 1M tokens x heads x 128 stays below the
# varlen kernels' 2**31-element limit (check_varlen_args refuses 16 heads of 128 at 1M tokens).
VARLEN_PACKS = [(16384, 1), (16384, 16), (65536, 64), (262144, 256), (1 << 20, 1000)]
VARLEN_SHAPE = dict(heads=8, heads_k=2, head_dim=128, causal=True, deterministic=True, schedule="auto", num_sms=132)
VARLEN_EXCLUDES = ("kernel launches and the binding's argument checks; on CUDA tensors, the device-to-host copy of "
                   "cu_seqlens that read_layout makes (one per forward and one per backward on the interim path, none "
                   "on the kernels' path)")


def time_ns(fn, calls: int, setup=None) -> float:
    """Median ns of ``fn()`` over ``calls`` calls (after 10 warm-up calls); ``setup()``, if given, runs before each
    call outside the timed region."""
    samples = []
    for i in range(10 + calls):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        if i >= 10:
            samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def pack_lengths(tokens: int, docs: int) -> list[int]:
    """``docs`` positive lengths summing to ``tokens``, consecutive around tokens/docs (all distinct but perhaps the
    last), so that a new pack's per-document decisions all miss the cache."""
    lengths = [tokens // docs + i - (docs - 1) // 2 for i in range(docs)]
    lengths[-1] += tokens - sum(lengths)
    if min(lengths) < 1:
        raise ValueError(f"{docs} documents of consecutive lengths cannot fill {tokens} tokens")
    return lengths


def dense_section(calls: int) -> list[dict]:
    import torch

    from flash_attn_dash import backward_schedule_used
    from flash_attn_dash.launch import bwd_launch

    rows = []
    print(f"{'causal':>6} {'hdim':>4} {'seqlen':>8} {'batch':>5} {'heads':>5} {'det':>3}  {'new shape us':>12} "
          f"{'cached us':>9} {'schedule_used us':>16}  launch")
    for causal, d, sq, sk, b, h in SHAPES:
        q = torch.empty(b, sq, h, d, device="meta")
        k = torch.empty(b, sk, max(1, h // 4), d, device="meta")
        for det in (True, False):
            new = time_ns(lambda: bwd_launch.__wrapped__(causal, d, sq, sk, b, h, 132, det), calls)
            cached = time_ns(lambda: bwd_launch(causal, d, sq, sk, b, h, 132, det), calls)
            used = time_ns(lambda: backward_schedule_used(q, k, causal=causal, deterministic=det), calls)
            launch = bwd_launch(causal, d, sq, sk, b, h, 132, det)
            rows.append(dict(causal=causal, hdim=d, seqlen_q=sq, seqlen_k=sk, batch=b, heads=h, deterministic=det,
                             new_shape_us=new / 1e3, cached_us=cached / 1e3, schedule_used_us=used / 1e3,
                             launch=launch.__dict__))
            print(f"{str(causal):>6} {d:>4} {sq:>8} {b:>5} {h:>5} {'yes' if det else 'no':>3}  {new / 1e3:12.2f} "
                  f"{cached / 1e3:9.2f} {used / 1e3:16.2f}  {launch.schedule}, grid {launch.grid}, "
                  f"claim group {launch.claim_group}")
    worst = max(r["new_shape_us"] for r in rows)
    print(f"worst first decision of a shape: {worst:.2f} us (target <= 20 us)")
    return rows


def varlen_section(calls: int) -> dict:
    import torch

    from flash_attn_dash import features, varlen_schedule_used
    from flash_attn_dash.launch import bwd_launch, sequence_launch, varlen_kernel_launch, varlen_request
    from flash_attn_dash.varlen_checks import check_varlen_args
    from flash_attn_dash.varlen_layout import read_layout

    sh = VARLEN_SHAPE
    h, hk, d, causal, det = sh["heads"], sh["heads_k"], sh["head_dim"], sh["causal"], sh["deterministic"]
    rows = []
    print(f"\nvarlen, CPU tensors: heads {h}/{hk}, hdim {d}, causal, deterministic {sh['schedule']!r}; times in us "
          f"(decisions: per document, launch.sequence_launch)")
    print(f"{'tokens':>8} {'docs':>5} {'check_varlen_args':>17} {'read_layout':>11} {'decisions new':>13} "
          f"{'decisions cached':>16} {'schedule_used new':>17} {'new, per doc':>12} {'kernel path':>11}")
    for tokens, docs in VARLEN_PACKS:
        lengths = pack_lengths(tokens, docs)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        # Expanded views: the right shapes without the memory (none of the timed parts reads q/k/v's data).
        q = torch.empty(1, h, d, dtype=torch.bfloat16).expand(tokens, h, d)
        k = torch.empty(1, hk, d, dtype=torch.bfloat16).expand(tokens, hk, d)
        m = max(lengths)
        seqs = read_layout(cu, cu, m, m, None, None, tokens, tokens)

        def decisions():
            request = varlen_request(det, sh["schedule"], d, features.kernel_window(causal, (-1, -1), m, m)[1])
            return [sequence_launch(causal, d, s.q_len, s.k_len, h, sh["num_sms"], det, request)
                    for s in seqs if s.has_work]

        def kernel_path():  # both passes: the checks, the mask, the backward's order and grid
            check_varlen_args(q, k, k, cu, cu, m, m, None, None)
            _, window = features.kernel_mask(causal, (-1, -1), 0.0, m, m)
            varlen_kernel_launch(det, sh["schedule"], d, tokens, docs, h, sh["num_sms"], None, window, causal)

        us = dict(
            check_varlen_args=time_ns(lambda: check_varlen_args(q, k, k, cu, cu, m, m, None, None), calls),
            read_layout=time_ns(lambda: read_layout(cu, cu, m, m, None, None, tokens, tokens), calls),
            decisions_new=time_ns(decisions, calls, setup=bwd_launch.cache_clear),
            decisions_cached=time_ns(decisions, calls),
            schedule_used_new=time_ns(lambda: varlen_schedule_used(q, k, cu, cu, m, m, causal=causal,
                                                                   deterministic=det, schedule=sh["schedule"]),
                                      calls, setup=bwd_launch.cache_clear),
            kernel_path=time_ns(kernel_path, calls),
        )
        us = {name: ns / 1e3 for name, ns in us.items()}
        rows.append(dict(tokens=tokens, docs=docs, max_seqlen=m, us=us,
                         schedule_used_new_per_doc_us=us["schedule_used_new"] / docs,
                         schedules=sorted({launch.schedule for launch in decisions()})))
        print(f"{tokens:>8} {docs:>5} {us['check_varlen_args']:17.2f} {us['read_layout']:11.2f} "
              f"{us['decisions_new']:13.2f} {us['decisions_cached']:16.2f} {us['schedule_used_new']:17.2f} "
              f"{us['schedule_used_new'] / docs:12.3f} {us['kernel_path']:11.2f}")
    big = rows[-1]
    print(f"{big['tokens']}-token pack of {big['docs']} documents, new pack: varlen_schedule_used "
          f"{big['us']['schedule_used_new']:.0f} us, the kernels' path {big['us']['kernel_path']:.1f} us "
          "(issue 18 point 3 target: a few tens of us)")
    print(f"excluded: {VARLEN_EXCLUDES}")
    # the machine may be shared: its load when the numbers were taken
    return dict(shape=sh, excludes=VARLEN_EXCLUDES, load_average=os.getloadavg(), rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--section", choices=["all", "dense", "varlen"], default="all",
                    help="what to measure (default all)")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per dense measurement (default 2000)")
    ap.add_argument("--varlen-calls", type=int, default=200,
                    help="timed calls per varlen measurement (default 200: a 1,000-document call takes ms)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    for name in ("calls", "varlen_calls"):
        if getattr(args, name) < 10:
            ap.error(f"--{name.replace('_', '-')} must be >= 10, got {getattr(args, name)}")
    doc = {}
    if args.section in ("all", "dense"):
        doc["rows"] = dense_section(args.calls)
    if args.section in ("all", "varlen"):
        doc["varlen"] = varlen_section(args.varlen_calls)
    if args.json:
        from benchmarks import common

        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(argv), **doc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
