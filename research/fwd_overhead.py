"""Forward per-tile overhead: time against keys per tile and batch at fixed query tiles, ours and SDPA cuDNN.

    python research/fwd_overhead.py [--hdim 128] [--seqlen-q 2k] [--seqlen-k 512,1k,2k,4k,8k] [--json OUT]
                                    [--rounds 3]

The query length is fixed, so a batch makes the same tiles for every implementation and only the keys each tile
walks change; two batch sizes (16k tokens and half that) change the number of tiles per CTA. A forward then takes
about L + b * (a + blocks * s): a fixed per-launch time L, and per batch element a per-tile overhead a plus s per
128-key block. The least-squares fit of (L, a, s) gives the per-tile overhead in block steps (a / s), the same unit
for ours and cuDNN: what separates the 2k and 16k rows of the grid.
Timing: benchmarks/common.py (CUDA events, median of 30 after 5 warm-ups, inputs rotated over 3 sets).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Sequence

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402

BLOCK_KEYS = 128  # unit of the x axis: one 128-key block step


def least_squares(features: Sequence[Sequence[float]], ys: Sequence[float]) -> List[float]:
    """Coefficients c minimizing sum (y - c . f)^2 (normal equations, Gauss-Jordan with partial pivoting)."""
    if not features or len(features) != len(ys):
        raise ValueError(f"least_squares needs one feature row per y, got {len(features)} rows and {len(ys)} ys")
    k = len(features[0])
    a = [[sum(f[i] * f[j] for f in features) for j in range(k)] + [sum(f[i] * y for f, y in zip(features, ys))]
         for i in range(k)]
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12 * max(1.0, max(abs(v) for row in a for v in row[:k])):
            raise ValueError("least_squares: the features do not determine the coefficients (need distinct "
                             "key lengths and batch sizes)")
        a[col], a[piv] = a[piv], a[col]
        for r in range(k):
            if r != col:
                m = a[r][col] / a[col][col]
                a[r] = [x - m * y for x, y in zip(a[r], a[col])]
    return [a[i][k] / a[i][i] for i in range(k)]


def fit_overhead(rows: Sequence[dict], key: str) -> dict:
    """Fit ms = L + b*a + b*blocks*s over the rows' (batch, blocks, key); a/s is the per-tile overhead in steps."""
    launch, a, s = least_squares([(1.0, r["batch"], r["batch"] * r["blocks"]) for r in rows], [r[key] for r in rows])
    return {"launch_ms": launch, "tile_ms_per_batch": a, "block_ms_per_batch": s, "overhead_steps": a / s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128), help="head dim (default 128)")
    ap.add_argument("--seqlen-q", default="2k", help="query length; batch = 16k tokens / it, and half (default 2k)")
    ap.add_argument("--seqlen-k", default="512,1k,2k,4k,8k", help="comma list of key lengths (default 512..8k)")
    ap.add_argument("--json", help="write the rows and fits here")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per shape (default 1)")
    args = ap.parse_args(argv)
    sq = common.parse_seqlen(args.seqlen_q)
    sks = common.parse_list(args.seqlen_k.split(","), common.parse_seqlen)
    batch = common.TOKENS_PER_BATCH // sq
    if len(set(sks)) < 2:
        ap.error("--seqlen-k needs at least two distinct lengths for the fit")
    if batch < 2:
        ap.error(f"--seqlen-q {args.seqlen_q}: needs at least 2 sequences in {common.TOKENS_PER_BATCH} tokens")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    from research.fwd_variants import time_fwd_pair

    common.require_cuda("fwd_overhead.py")
    labels = ["ours", "cudnn"]

    h, d = common.HIDDEN // args.hdim, args.hdim
    rows = []
    for b in (batch, batch // 2):
        for sk in sks:
            row = {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "blocks": sk / BLOCK_KEYS}
            flops = common.attn_fwd_flops(b, h, sq, sk, d, False)
            for label, ms in zip(labels, time_fwd_pair(b, sq, sk, h, d, False, rounds=args.rounds)):
                row[f"{label}_ms"], row[label] = ms, common.tflops(flops, ms)
            rows.append(row)

    fits = {label: fit_overhead(rows, f"{label}_ms") for label in labels}
    print(f"forward, hdim {d}, full mask, seqlen_q {common.seqlen_label(sq)}, h={h}: time against keys per tile")
    print(common.text_table(["batch", "seqlen_k", *(f"{x} ms" for x in labels), *(f"{x} TFLOP/s" for x in labels)],
                            [[r["batch"], common.seqlen_label(r["seqlen_k"]), *(f"{r[x + '_ms']:.4f}" for x in labels),
                              *(f"{r[x]:.0f}" for x in labels)] for r in rows]))
    for label, f in fits.items():
        print(f"{label:>5}: launch {1000 * f['launch_ms']:.1f} us + per sequence {1000 * f['tile_ms_per_batch']:.2f} us"
              f" + {1000 * f['block_ms_per_batch']:.3f} us per {BLOCK_KEYS}-key block"
              f" -> per-tile overhead {f['overhead_steps']:.2f} block steps")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(), "rows": rows, "fits": fits},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
