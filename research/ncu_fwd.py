"""One forward of ours and one of SDPA cuDNN on the same inputs, inside a CUDA profiler range, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \\
        python research/ncu_fwd.py [--hdim 128] [--seqlen 2k] [--causal]

Both are warmed up outside the range, so ncu profiles exactly one launch of each (cuDNN may use several kernels).
The question it answers: where our forward loses to cuDNN at a shape (tensor-pipe activity, stall reasons), not
how fast either is (that is research/fwd_variants.py). Shapes as bench_attn.py: 16k tokens, hidden 2048, bf16.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402
from research.fwd_variants import fwd_calls  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--seqlen", default="2k", help="one length (e.g. 2k, 4096)")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    common.require_cuda("ncu_fwd.py")
    import torch

    s = common.parse_seqlen(args.seqlen)
    b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // args.hdim
    ours, cudnn = fwd_calls(*(torch.randn(b, s, h, args.hdim, device="cuda", dtype=torch.bfloat16)
                              for _ in range(3)), args.causal)
    for _ in range(3):
        ours()
        cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    ours()
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled: ours then cuDNN, hdim {args.hdim}, {'causal' if args.causal else 'full'}, seqlen {s}, "
          f"batch {b}, heads {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
