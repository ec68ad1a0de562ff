"""One forward or one backward of each named implementation on the same inputs, inside a CUDA profiler range, for
Nsight Compute (ours beside FlashAttention-4 or cuDNN, kernel by kernel).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --section SourceCounters python research/ncu_attn.py [--pass fwd|bwd] [--impl dash,fa4] \\
        [--hdim 128] [--seqlen 8k] [--mask full,causal]

--impl takes benchmarks/common.py's implementation keys (dash, dash-det, fa4, fa4-det, sdpa-cudnn, ...). Every call
is warmed up outside the range, so ncu profiles exactly one call of each (a backward is its whole autograd call:
preprocess, main kernel, postprocess, whatever each implementation launches). The question it answers: where our
kernels lose to a peer's at a shape (tensor-pipe activity, stall reasons, instructions per MMA), not how fast either
is (benchmarks/bench_attn.py). --mask full,causal profiles both masks in one run, in that order (causal beside full:
where a causal step costs more than a full one). Shapes as bench_attn.py: 16k tokens, hidden 2048 (heads = 2048 //
hdim), bf16. --impl also takes benchmarks/bench_varlen.py's keys (dash-varlen, fa4-varlen, ...): those run the same tensors as one uniform pack of
the batch's sequences (the varlen kernels beside the dense ones at equal shapes).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_varlen, common  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pass", dest="pass_", default="bwd", choices=("fwd", "bwd"))
    ap.add_argument("--impl", default="dash,fa4",
                    help="comma list of benchmarks/common.py (or bench_varlen.py) implementation keys")
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 96, 128, 192, 256))
    ap.add_argument("--seqlen", default="8k", help="one length (e.g. 2k, 4096)")
    ap.add_argument("--mask", default="full", help="comma list of full, causal (default full)")
    ap.add_argument("--causal", action="store_const", const="causal", dest="mask", help="same as --mask causal")
    args = ap.parse_args(argv)
    masks = args.mask.split(",")
    if any(m not in common.MASKS for m in masks):
        ap.error(f"--mask takes a comma list of {', '.join(common.MASKS)}; got {args.mask!r}")
    wanted = args.impl.split(",")
    packed = [n for n in wanted if n in bench_varlen.IMPLS]
    dense = [n for n in wanted if n not in packed]
    try:
        names = common.select_impls([",".join(dense)], []) if dense else []
    except ValueError as e:
        ap.error(str(e))
    common.require_cuda("ncu_attn.py")
    import torch

    s = common.parse_seqlen(args.seqlen)
    b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // args.hdim
    q, k, v, dout = (torch.randn(b, s, h, args.hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_(args.pass_ == "bwd") for x in (q, k, v))
    pack = bench_varlen.uniform_pack(b * s, s)
    cu = torch.tensor(pack.offsets(), device="cuda", dtype=torch.int32)
    fns = {}
    for mask in masks:
        causal = mask == "causal"
        for name in names:
            fns[f"{name} {mask}"] = common.make_attn_fn(common.IMPLS[name], causal)
        for name in packed:  # the same tensors as one pack: (b * s, h, d) views, outputs back in (b, s, h, d)
            vfn = bench_varlen.make_fn(bench_varlen.IMPLS[name], pack, causal, cu)
            fns[f"{name} {mask}"] = lambda q, k, v, vfn=vfn: vfn(*(x.flatten(0, 1) for x in (q, k, v))).view(q.shape)
    calls = []
    for name, fn in fns.items():
        if args.pass_ == "fwd":
            calls.append((name, lambda fn=fn: fn(q, k, v)))
        else:
            out = fn(q, k, v)  # the forward stays outside the range
            calls.append((name, lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)))
    for _ in range(3):
        for _, call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {args.pass_}: {', '.join(n for n, _ in calls)} (in that order); hdim {args.hdim}, "
          f"seqlen {s}, batch {b}, heads {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
