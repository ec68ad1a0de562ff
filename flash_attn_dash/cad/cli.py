"""``cad-plan``: plan one batch with the CAD planner and show its balance, movement and bytes.

Example: ``flash-attn-dash cad-plan --world 8 --pareto 0 --png cad.png`` (a long-tailed 64K-token-per-rank
batch), or ``--lengths 32768,2048,2048,...`` (documents dealt to ranks round-robin). Attention dims default to
Llama-3-8B (32 query heads, 8 K/V heads, head dim 128, bf16). The console script wires :func:`add_parser`
into its sub-commands; :func:`run` does the work.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from .plan import CADPlan, CADPlanError, plan_cad
from .workload import deal_round_robin, pareto_doc_lens

DEFAULT_TOKENS_PER_RANK = 65536


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _chunk_size(text: str) -> int:
    value = _positive_int(text)
    if value % 128:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 128, got {text!r}")
    return value


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (inf: no balancing), got {text!r}")
    return value


def _lengths(text: str) -> list[int]:
    return [_positive_int(part) for part in text.split(",")]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``cad-plan`` sub-command to ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "cad-plan", help="plan core attention disaggregation for one batch: balance, moved chunks, bytes",
        description="Plan core attention disaggregation (CAD) for one packed batch and report the load "
                    "imbalance before and after, the chunks moved and the all_to_all bytes per phase.")
    p.add_argument("--world", type=_positive_int, required=True, help="ranks (attention servers)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--lengths", type=_lengths, metavar="L1,L2,...",
                        help="document lengths, dealt to ranks round-robin (document i to rank i mod world)")
    source.add_argument("--pareto", type=int, metavar="SEED",
                        help="long-tailed batch: Pareto(alpha=1, scale 2000) lengths clipped to [128, tokens "
                             "per rank], filling every rank")
    p.add_argument("--tokens-per-rank", type=_positive_int, metavar="N",
                   help=f"tokens on each rank for --pareto (default {DEFAULT_TOKENS_PER_RANK})")
    p.add_argument("--chunk-size", type=_chunk_size, default=2048, help="chunk grid (multiple of 128, default 2048)")
    p.add_argument("--tolerance", type=_tolerance, default=0.05, help="stop at max/mean <= 1 + T (default 0.05)")
    p.add_argument("--heads", type=_positive_int, default=32, help="query heads (default 32)")
    p.add_argument("--heads-kv", type=_positive_int, default=8, help="key/value heads (default 8)")
    p.add_argument("--head-dim", type=_positive_int, default=128, help="head dimension (default 128)")
    p.add_argument("--dtype-bytes", type=_positive_int, default=2, help="bytes per element (default 2: bf16)")
    p.add_argument("--memory-budget", type=_positive_int, metavar="BYTES", help="per-server CAD buffer budget")
    p.add_argument("--png", metavar="FILE", help="draw per-rank load bars before/after to this PNG")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    return p


def _error(message: str) -> int:
    print(f"cad-plan: error: {message}", file=sys.stderr)
    return 2


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _table(plan: CADPlan, planner_ms: float) -> str:
    lengths = [n for lens in plan.doc_lens for n in lens]
    mean = sum(plan.load_before) / plan.world_size  # > 0: plan_cad gives every rank a document
    phases = ", ".join(f"{p} {_mib(b)}" for p, b in plan.bytes_per_phase.items())
    lines = [
        f"cad-plan: {plan.world_size} ranks, {len(lengths)} documents, {sum(lengths)} tokens, "
        f"{sum(map(len, plan.tasks))} chunks of {plan.chunk_size}, tolerance {plan.tolerance:g}",
        f"imbalance (max/mean load): {plan.imbalance_before:.3f} -> {plan.imbalance_after:.3f}",
        f"moved chunks: {plan.moved_chunks} ({len(plan.moves)} moves)",
        f"bytes between ranks per phase: {phases}; total {_mib(sum(plan.bytes_per_phase.values()))}",
        f"max bytes one rank sends: {_mib(plan.max_send_bytes)}",
        f"planner time: {planner_ms:.1f} ms; fingerprint {plan.fingerprint[:16]}",
        "rank  docs  tokens  load/mean before  after  chunks served  memory",
    ]
    for r in range(plan.world_size):
        lines.append(f"{r:>4}  {len(plan.doc_lens[r]):>4}  {sum(plan.doc_lens[r]):>6}  "
                     f"{plan.load_before[r] / mean:>16.3f}  {plan.load_after[r] / mean:>5.3f}"
                     f"  {len(plan.tasks[r]):>13}  {_mib(plan.memory_bytes[r])}")
    return "\n".join(lines)


def draw_loads(plan: CADPlan, path: str) -> None:
    """Per-rank load bars (relative to the mean) before and after planning."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean = sum(plan.load_before) / plan.world_size
    ranks = range(plan.world_size)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * plan.world_size + 2), 3.2))
    ax.bar([r - 0.2 for r in ranks], [x / mean for x in plan.load_before], 0.4,
           label=f"owner (max/mean {plan.imbalance_before:.3f})")
    ax.bar([r + 0.2 for r in ranks], [x / mean for x in plan.load_after], 0.4,
           label=f"planned (max/mean {plan.imbalance_after:.3f})")
    ax.axhline(1.0, color="black", lw=0.8)
    if math.isfinite(plan.tolerance):
        ax.axhline(1 + plan.tolerance, color="gray", lw=0.8, ls="--", label=f"1 + tolerance ({plan.tolerance:g})")
    ax.set_xticks(list(ranks))
    ax.set_xlabel("rank")
    ax.set_ylabel("attention load / mean")
    ax.set_title(f"CAD plan: {plan.world_size} ranks, chunk {plan.chunk_size}, {plan.moved_chunks} chunks moved")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run ``cad-plan`` on parsed arguments; returns the exit status (2: arguments that cannot be planned)."""
    if args.lengths is not None:
        if args.tokens_per_rank is not None:
            return _error("--tokens-per-rank applies to --pareto only")
        try:
            doc_lens = deal_round_robin(args.lengths, args.world)
        except ValueError as exc:
            return _error(f"--lengths: {exc}")
    else:
        tokens = args.tokens_per_rank or DEFAULT_TOKENS_PER_RANK
        if tokens < 128:
            return _error(f"--tokens-per-rank must be >= 128, got {tokens}")
        doc_lens = pareto_doc_lens(args.world, tokens, args.pareto)
    start = time.perf_counter()
    try:
        plan = plan_cad(doc_lens, args.chunk_size, args.tolerance, heads=args.heads, heads_kv=args.heads_kv,
                        head_dim=args.head_dim, dtype_bytes=args.dtype_bytes, memory_budget_bytes=args.memory_budget)
    except CADPlanError as exc:
        return _error(str(exc))
    planner_ms = (time.perf_counter() - start) * 1e3
    if args.png:
        draw_loads(plan, args.png)
    if args.json:
        print(json.dumps({**plan.summary(), "planner_ms": planner_ms, "doc_lens": doc_lens,
                          "png": args.png}, indent=1))
    else:
        print(_table(plan, planner_ms))
        if args.png:
            print(f"wrote {args.png}")
    return 0
