"""Host time per call of the launch decision (flash_attn_dash.launch.bwd_launch) and of backward_schedule_used.

    python benchmarks/bench_host.py [--json OUT]

Runs on any machine (no GPU needed: the decision is pure Python). For each shape, from short sequences to a 1M-token
batch, it times the first decision of a new shape (the lru_cache bypassed, as for every new shape, e.g. every new
pack) and a repeated one (cached), as the median of many calls with time.perf_counter_ns; the schedule model's
simulation is not involved (it is the planner's, `flash-attn-dash plan`). Target: <= 20 us per call.
"""
from __future__ import annotations

import argparse
import json
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


def time_ns(fn, calls: int) -> float:
    """Median ns of ``fn()`` over ``calls`` calls (after 10 warm-up calls)."""
    for _ in range(10):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per measurement (default 2000)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.calls < 10:
        ap.error(f"--calls must be >= 10, got {args.calls}")
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
            new = time_ns(lambda: bwd_launch.__wrapped__(causal, d, sq, sk, b, h, 132, det), args.calls)
            cached = time_ns(lambda: bwd_launch(causal, d, sq, sk, b, h, 132, det), args.calls)
            used = time_ns(lambda: backward_schedule_used(q, k, causal=causal, deterministic=det), args.calls)
            launch = bwd_launch(causal, d, sq, sk, b, h, 132, det)
            rows.append(dict(causal=causal, hdim=d, seqlen_q=sq, seqlen_k=sk, batch=b, heads=h, deterministic=det,
                             new_shape_us=new / 1e3, cached_us=cached / 1e3, schedule_used_us=used / 1e3,
                             launch=launch.__dict__))
            print(f"{str(causal):>6} {d:>4} {sq:>8} {b:>5} {h:>5} {'yes' if det else 'no':>3}  {new / 1e3:12.2f} "
                  f"{cached / 1e3:9.2f} {used / 1e3:16.2f}  {launch.schedule}, grid {launch.grid}, "
                  f"claim group {launch.claim_group}")
    worst = max(r["new_shape_us"] for r in rows)
    print(f"worst first decision of a shape: {worst:.2f} us (target <= 20 us)")
    if args.json:
        from benchmarks import common

        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
