"""Forward-kernel variant probe: our forward op against SDPA cuDNN, same run, same inputs.

    python benchmarks/fwd_variants.py NAME [--json OUT.json] [--seqlen 2k,4k,8k,16k]

Used to compare compile-time forward configurations (hopper/flash_fwd_launch_template.h's FLASH_DASH_FWD_*
macros) built one after another on the GPU machine; each run prints one table. Timing: benchmarks/common.py
(CUDA events, median of 30 after warm-up, inputs rotated over 3 sets), bf16, 16k tokens, hidden 2048.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


def time_fwd_pair(b: int, sq: int, sk: int, h: int, d: int, causal: bool, sm_margin: int = 0) -> tuple:
    """(ours ms, cuDNN ms): bf16 forwards on 3 rotating input sets of (b, sq|sk, h, d), median of 30 after 5
    warm-ups (benchmarks/common.py), both implementations on the same inputs."""
    import torch

    out = torch.empty(b, sq, h, d, device="cuda", dtype=torch.bfloat16)  # one output for all sets
    lse = torch.empty(b, h, sq, device="cuda")
    sets = [fwd_calls(torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16),
                      *(torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)),
                      causal, out, lse, sm_margin) for _ in range(3)]
    ms = tuple(common.summarize_ms(common.time_cuda(lambda i: sets[i % 3][which](), iters=30, warmup=5))["ms"]
               for which in (0, 1))
    del sets
    common.free_cuda()
    return ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="variant label for the table")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--seqlen", default="2k,4k,8k,16k", help="comma list (default 2k,4k,8k,16k)")
    ap.add_argument("--sm-margin", type=int, default=0, help="SMs our forward leaves unused (default 0)")
    args = ap.parse_args(argv)
    common.require_cuda("fwd_variants.py")

    rows = []
    for hdim in (64, 128):
        for causal in (False, True):
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                flops = common.attn_fwd_flops(b, h, s, s, hdim, causal)
                ms = time_fwd_pair(b, s, s, h, hdim, causal, args.sm_margin)
                rows.append({"variant": args.name, "hdim": hdim, "causal": causal, "seqlen": s,
                             "ours": common.tflops(flops, ms[0]), "cudnn": common.tflops(flops, ms[1])})
    print(f"forward TFLOP/s, variant {args.name}")
    print(common.text_table(["hdim", "mask", "seqlen", "ours", "cuDNN", "ours/cuDNN"],
                            [[r["hdim"], "causal" if r["causal"] else "full", common.seqlen_label(r["seqlen"]),
                              f"{r['ours']:.0f}", f"{r['cudnn']:.0f}", f"{r['ours'] / r['cudnn']:.3f}"] for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
