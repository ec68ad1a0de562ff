"""Forward per-tile overhead: time against keys per tile at a fixed set of query tiles, ours and SDPA cuDNN.

    python benchmarks/fwd_overhead.py [--hdim 128] [--seqlen-q 2k] [--seqlen-k 512,1k,2k,4k,8k] [--json OUT]

The query side is fixed (16k tokens, hidden 2048, full mask), so every implementation runs the same tiles and
only the keys each tile walks change. A forward then takes about rounds * (a + blocks * s), a line in the number
of 128-key blocks per tile: the least-squares fit gives the per-tile overhead a in block steps (intercept / slope),
the same unit for ours and cuDNN. It is what separates the 2k and 16k rows of the grid (NOTES.md, session 7).
Timing: benchmarks/common.py (CUDA events, median of 30 after 5 warm-ups, inputs rotated over 3 sets).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402

BLOCK_KEYS = 128  # x axis unit: one 128-key block step


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs; needs two distinct xs."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError(f"fit_line needs >= 2 points of (x, y), got {n} xs and {len(ys)} ys")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--seqlen-q", default="2k", help="query length; batch = 16k tokens / it (default 2k)")
    ap.add_argument("--seqlen-k", default="512,1k,2k,4k,8k", help="comma list of key lengths (default 512..8k)")
    ap.add_argument("--json", help="write the rows and fits here")
    args = ap.parse_args(argv)
    sq = common.parse_seqlen(args.seqlen_q)
    sks = common.parse_list(args.seqlen_k.split(","), common.parse_seqlen)
    if len(set(sks)) < 2:
        ap.error("--seqlen-k needs at least two distinct lengths for the fit")
    common.require_cuda("fwd_overhead.py")
    import torch

    from benchmarks.fwd_variants import fwd_calls

    b, h, d = common.TOKENS_PER_BATCH // sq, common.HIDDEN // args.hdim, args.hdim
    rows = []
    for sk in sks:
        q_sets = [torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        kv_sets = [[torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)] for _ in range(3)]
        out = torch.empty_like(q_sets[0])
        lse = torch.empty(b, h, sq, device="cuda")
        sets = [fwd_calls(q, k, v, False, out, lse) for q, (k, v) in zip(q_sets, kv_sets)]
        row = {"seqlen_q": sq, "seqlen_k": sk, "blocks": sk / BLOCK_KEYS}
        flops = common.attn_fwd_flops(b, h, sq, sk, d, False)
        for label, which in (("ours", 0), ("cudnn", 1)):
            ms = common.summarize_ms(common.time_cuda(lambda i: sets[i % 3][which](), iters=30, warmup=5))["ms"]
            row[f"{label}_ms"], row[label] = ms, common.tflops(flops, ms)
        rows.append(row)
        del sets, q_sets, kv_sets
        common.free_cuda()

    fits = {}
    for label in ("ours", "cudnn"):
        a, s = fit_line([r["blocks"] for r in rows], [r[f"{label}_ms"] for r in rows])
        fits[label] = {"intercept_ms": a, "ms_per_block": s, "overhead_steps": a / s}
    print(f"forward, hdim {d}, full mask, seqlen_q {common.seqlen_label(sq)} (b={b}, h={h}): time against keys per tile")
    print(common.text_table(["seqlen_k", "ours ms", "cuDNN ms", "ours TFLOP/s", "cuDNN TFLOP/s"],
                            [[common.seqlen_label(r["seqlen_k"]), f"{r['ours_ms']:.4f}", f"{r['cudnn_ms']:.4f}",
                              f"{r['ours']:.0f}", f"{r['cudnn']:.0f}"] for r in rows]))
    for label, f in fits.items():
        print(f"{label:>5}: {f['intercept_ms']:.4f} ms + {f['ms_per_block']:.5f} ms per {BLOCK_KEYS}-key block "
              f"-> per-tile overhead {f['overhead_steps']:.2f} block steps")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(), "rows": rows, "fits": fits},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
