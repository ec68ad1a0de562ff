"""Forward-kernel variant probe: our forward op against SDPA cuDNN, same run, same inputs.

    python research/fwd_variants.py NAME [--json OUT.json] [--seqlen 2k,4k,8k,16k] [--hdim 64,128] [--rounds 3]

Used to compare forward configurations (entries of flash_attn_dash/variants.py, or kernel edits) built one after
another on the GPU machine (research/variants.sh); each run prints one table. Timing: benchmarks/common.py (CUDA
events, median of 30 after warm-up per round, inputs rotated over 3 sets), bf16, 16k tokens, hidden 2048.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import List

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402


def fwd_calls(q, k, v, causal: bool, out=None, lse=None, sm_margin: int = 0):
    """(ours, cudnn): one forward each on (b, s, h, d) inputs; ours writes into ``out`` / ``lse`` (made here when
    None) on a grid of at most (SM count - ``sm_margin``) CTAs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    b, s, h, d = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(b, h, s, device=q.device) if lse is None else lse
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def ours():
        torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, d ** -0.5, causal, sm_margin)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    return ours, cudnn


def time_fwd_pair(b: int, sq: int, sk: int, h: int, d: int, causal: bool, sm_margin: int = 0,
                  rounds: int = 1) -> tuple:
    """(ours ms, cuDNN ms): bf16 forwards on 3 rotating input sets of (b, sq|sk, h, d), median of 30 after 5
    warm-ups (benchmarks/common.py) per round, both implementations on the same inputs. Rounds interleave the two,
    so a slow drift of the machine hits both alike; the medians pool the samples of every round."""
    import torch

    out = torch.empty(b, sq, h, d, device="cuda", dtype=torch.bfloat16)  # one output for all sets
    lse = torch.empty(b, h, sq, device="cuda")
    sets = [fwd_calls(torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16),
                      *(torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)),
                      causal, out, lse, sm_margin) for _ in range(3)]
    samples: List[List[float]] = [[], []]
    for _ in range(rounds):
        for which in (0, 1):
            samples[which] += common.time_cuda(lambda i: sets[i % 3][which](), iters=30, warmup=5)
    del sets
    common.free_cuda()
    return tuple(statistics.median(x) for x in samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="variant label for the table")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--seqlen", default="2k,4k,8k,16k", help="comma list (default 2k,4k,8k,16k)")
    ap.add_argument("--sm-margin", type=int, default=0, help="SMs our forward leaves unused (default 0)")
    ap.add_argument("--hdim", default="64,128", help="comma list of head dims (default 64,128)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per shape (default 1)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    hdims = common.parse_list(args.hdim.split(","), int)
    from flash_attn_dash import variants

    known = [h.qk for h in variants.HEAD_DIMS]
    if any(d not in known for d in hdims):
        ap.error(f"--hdim takes a comma list of {known}, got {args.hdim!r}")
    common.require_cuda("fwd_variants.py")

    labels = ["ours"]
    rows = []
    for hdim in hdims:
        for causal in (False, True):
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                flops = common.attn_fwd_flops(b, h, s, s, hdim, causal)
                ms = time_fwd_pair(b, s, s, h, hdim, causal, args.sm_margin, args.rounds)
                row = {"variant": args.name, "hdim": hdim, "causal": causal, "seqlen": s,
                       "cudnn": common.tflops(flops, ms[-1])}
                row.update({label: common.tflops(flops, t) for label, t in zip(labels, ms)})
                rows.append(row)
    print(f"forward TFLOP/s, variant {args.name}" + (f", {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    print(common.text_table(["hdim", "mask", "seqlen", *labels, "cuDNN", *(f"{x}/cuDNN" for x in labels)],
                            [[r["hdim"], "causal" if r["causal"] else "full", common.seqlen_label(r["seqlen"]),
                              *(f"{r[x]:.0f}" for x in labels), f"{r['cudnn']:.0f}",
                              *(f"{r[x] / r['cudnn']:.3f}" for x in labels)] for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
