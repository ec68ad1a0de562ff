#!/usr/bin/env python
"""Core attention disaggregation (CAD) on one GPU: simulated ranks, measured per-rank attention time.

For each world size W (default 2, 4, 8) a long-tailed packed batch is drawn (default 64K tokens per rank,
Pareto(alpha=1, scale 2000) lengths clipped to [128, 64K], seed --seed) and planned twice: every chunk on its
owner (tolerance inf: the no-CAD baseline, with the same per-chunk calls) and with --tolerance. Each rank's
server work under either plan (its tasks' forward and backward, the calls flash_attn_dash.cad runs) is timed
alone on the GPU with CUDA events, median of --repeats after --warmup; random bf16 inputs of the planned
shapes, Llama-3-8B attention dims by default (32 query heads, 8 K/V heads, head dim 128).

Reported per W: per-rank fwd/bwd/total ms before and after, measured and planned (pair count) max/mean, chunks
moved, all_to_all bytes per phase and the most one rank sends, planner time (median of 5), and a predicted
layer speed-up: layer = linear + slowest rank's attention (+ all_to_all time at --link-gbs GB/s, when not
overlapped), the linear part (QKV/O projections and the MLP, fwd+bwd = 3x the measured forward GEMMs) timed
here for one rank's tokens. The issue's target: max/mean <= 1.05 after planning at 8 ranks.

--cpu runs tiny shapes on the CPU reference with wall-clock timing: a smoke test of the script, numbers
meaningless. Results: JSON (--json PATH) and a table on stdout. Exit codes: 0 done, 2 bad arguments or no CUDA.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common as bc  # noqa: E402
from flash_attn_dash.cad import CADPlan, plan_cad  # noqa: E402
from flash_attn_dash.cad.workload import PARETO_SCALE, pareto_doc_lens  # noqa: E402

PROG = "bench_cad.py"
TARGET_IMBALANCE = 1.05  # the goal at 8 ranks
# --cpu smoke-test shapes (applied where the option was not given)
CPU_DEFAULTS = dict(tokens_per_rank=1024, pareto_scale=32, heads=2, heads_kv=1, head_dim=16, chunk_size=128,
                    mlp_dim=64, repeats=1, warmup=1)
GPU_DEFAULTS = dict(tokens_per_rank=65536, pareto_scale=PARETO_SCALE, heads=32, heads_kv=8, head_dim=128,
                    chunk_size=2048, mlp_dim=14336, repeats=5, warmup=1)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _at_least(minimum: int, multiple: int = 1):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or value % multiple:
            what = f"an integer >= {minimum}" + (f" and a multiple of {multiple}" if multiple > 1 else "")
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="smoke test on the CPU reference with tiny shapes")
    p.add_argument("--world", type=_int_list, default=[2, 4, 8], help="simulated world sizes (default 2,4,8)")
    p.add_argument("--seed", type=int, default=0, help="batch seed (default 0)")
    p.add_argument("--tokens-per-rank", type=_at_least(128), help="default 65536 (--cpu: 1024)")
    p.add_argument("--pareto-scale", type=_at_least(1), help=f"Pareto minimum length (default {PARETO_SCALE}; "
                                                             "--cpu: 32)")
    p.add_argument("--chunk-size", type=_at_least(128, 128), help="default 2048 (--cpu: 128)")
    p.add_argument("--tolerance", type=_non_negative_float, default=0.05, help="planner tolerance (default 0.05)")
    p.add_argument("--heads", type=_at_least(1), help="query heads (default 32; --cpu: 2)")
    p.add_argument("--heads-kv", type=_at_least(1), help="K/V heads (default 8; --cpu: 1)")
    p.add_argument("--head-dim", type=_at_least(1), help="head dim (default 128; --cpu: 16)")
    p.add_argument("--mlp-dim", type=_at_least(1), help="MLP intermediate size for the linear part (default 14336)")
    p.add_argument("--repeats", type=_at_least(1), help="timed repeats per rank, median (default 5; --cpu: 1)")
    p.add_argument("--warmup", type=_at_least(0), help="untimed runs per rank first (default 1)")
    p.add_argument("--sm-margin", type=_at_least(0), default=0, help="passed to the kernels")
    p.add_argument("--link-gbs", type=_non_negative_float, default=350.0,
                   help="all_to_all bandwidth per rank for the layer model, GB/s (default 350)")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    return p


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    defaults = CPU_DEFAULTS if args.cpu else GPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def _timer(device) -> Callable[[Callable[[], object]], float]:
    """ms of one call: CUDA events on the current stream, wall clock on the CPU."""
    import torch

    def cuda(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def cpu(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    return cuda if device.type == "cuda" else cpu


def time_server(plan: CADPlan, server: int, args, device, dtype) -> dict:
    """Median fwd and bwd ms of one server's tasks under ``plan`` (random inputs of the planned shapes)."""
    import torch

    from flash_attn_dash.cad.server import backward_tasks, forward_tasks

    tasks = plan.tasks[server]
    rows = sum(plan.q_rows[o][server] for o in range(plan.world_size))
    kv = sum(plan.kv_rows[o][server] for o in range(plan.world_size))
    g = torch.Generator(device=device).manual_seed(server)
    q, dout = (torch.randn(rows, args.heads, args.head_dim, generator=g, device=device, dtype=dtype) for _ in "qd")
    k, v = (torch.randn(kv, args.heads_kv, args.head_dim, generator=g, device=device, dtype=dtype) for _ in "kv")
    scale, timed, state = args.head_dim ** -0.5, _timer(device), {}

    def fwd():
        state["fwd"] = forward_tasks(tasks, q, k, v, scale, True, args.sm_margin)

    def bwd():
        backward_tasks(tasks, dout, q, k, v, *state["fwd"], scale, True, True, args.sm_margin)

    for _ in range(args.warmup):
        fwd()
        bwd()
    fwd_ms, bwd_ms = [], []
    for _ in range(args.repeats):
        fwd_ms.append(timed(fwd))
        bwd_ms.append(timed(bwd))
    state.clear()
    return {"tasks": len(tasks), "rows": rows, "fwd_ms": statistics.median(fwd_ms),
            "bwd_ms": statistics.median(bwd_ms), "ms": statistics.median(f + b for f, b in zip(fwd_ms, bwd_ms))}


def time_linear(args, device, dtype) -> float:
    """Forward+backward ms of one layer's GEMMs (QKV, O, gate+up, down) on one rank's tokens: 3x the forward."""
    import torch

    hidden = args.heads * args.head_dim
    shapes = [(hidden, (args.heads + 2 * args.heads_kv) * args.head_dim), (hidden, hidden),
              (hidden, 2 * args.mlp_dim), (args.mlp_dim, hidden)]
    x = {n: torch.randn(args.tokens_per_rank, n, device=device, dtype=dtype) for n in {a for a, _ in shapes}}
    w = [torch.randn(a, b, device=device, dtype=dtype) for a, b in shapes]
    timed = _timer(device)

    def gemms():
        for (a, _), weight in zip(shapes, w):
            torch.matmul(x[a], weight)

    for _ in range(args.warmup):
        gemms()
    return 3 * statistics.median(timed(gemms) for _ in range(args.repeats))


def _imbalance(values: Sequence[float]) -> float:
    return max(values) * len(values) / sum(values) if sum(values) else 1.0


def bench_world(world: int, args, device, dtype, linear_ms: float) -> dict:
    doc_lens = pareto_doc_lens(world, args.tokens_per_rank, args.seed, scale=args.pareto_scale)
    dims = dict(heads=args.heads, heads_kv=args.heads_kv, head_dim=args.head_dim, dtype_bytes=dtype.itemsize)
    planner_ms = []
    for _ in range(5):
        start = time.perf_counter()
        plan = plan_cad(doc_lens, args.chunk_size, args.tolerance, **dims)
        planner_ms.append((time.perf_counter() - start) * 1e3)
    owner = plan_cad(doc_lens, args.chunk_size, math.inf, **dims)
    before = [time_server(owner, s, args, device, dtype) for s in range(world)]
    after = [time_server(plan, s, args, device, dtype) for s in range(world)]
    attn_before, attn_after = max(r["ms"] for r in before), max(r["ms"] for r in after)
    comm_ms = plan.max_send_bytes / (args.link_gbs * 1e9) * 1e3 if args.link_gbs else math.inf
    return {
        "world_size": world, "doc_lens": doc_lens, "documents": sum(map(len, doc_lens)),
        "chunks": sum(map(len, plan.tasks)), "planner_ms": statistics.median(planner_ms),
        "per_rank_before": before, "per_rank_after": after,
        "measured_imbalance_before": _imbalance([r["ms"] for r in before]),
        "measured_imbalance_after": _imbalance([r["ms"] for r in after]),
        "load_imbalance_before": plan.imbalance_before, "load_imbalance_after": plan.imbalance_after,
        "moved_chunks": plan.moved_chunks, "bytes_per_phase": plan.bytes_per_phase,
        "a2a_bytes": sum(plan.bytes_per_phase.values()), "max_send_bytes": plan.max_send_bytes,
        "attention_max_ms_before": attn_before, "attention_max_ms_after": attn_after,
        "attention_speedup": attn_before / attn_after,
        "comm_ms_model": comm_ms, "linear_ms": linear_ms,
        "layer_speedup_no_overlap": (linear_ms + attn_before) / (linear_ms + attn_after + comm_ms),
        "layer_speedup_overlapped": (linear_ms + attn_before) / (linear_ms + max(attn_after, comm_ms)),
        "target_met": plan.imbalance_after <= TARGET_IMBALANCE if world == 8 else None,
        "fingerprint": plan.fingerprint,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _resolve(build_parser().parse_args(argv))
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print(f"{PROG}: no CUDA device; use --cpu for the smoke test", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    linear_ms = time_linear(args, device, dtype)
    rows = []
    print(f"{'W':>2} {'docs':>5} {'chunks':>6} {'load max/mean':>14} {'time max/mean':>14} {'moved':>5} "
          f"{'a2a MiB':>8} {'attn ms':>16} {'layer x':>12} {'plan ms':>7}")
    for world in args.world:
        row = bench_world(world, args, device, dtype, linear_ms)
        rows.append(row)
        print(f"{world:>2} {row['documents']:>5} {row['chunks']:>6} "
              f"{row['load_imbalance_before']:>6.3f}->{row['load_imbalance_after']:<6.3f} "
              f"{row['measured_imbalance_before']:>6.3f}->{row['measured_imbalance_after']:<6.3f} "
              f"{row['moved_chunks']:>5} {row['a2a_bytes'] / 2**20:>8.1f} "
              f"{row['attention_max_ms_before']:>7.2f}->{row['attention_max_ms_after']:<7.2f} "
              f"{row['layer_speedup_no_overlap']:>5.2f}/{row['layer_speedup_overlapped']:<5.2f} "
              f"{row['planner_ms']:>7.1f}", flush=True)
    config = {k: v for k, v in vars(args).items() if k != "json"}
    doc = {"schema": "flash-attn-dash-bench-cad", "schema_version": 1, "meta": bc.collect_metadata(argv),
           "config": {**config, "dtype": str(dtype), "device": str(device)}, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
