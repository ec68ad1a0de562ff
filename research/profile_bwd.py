"""Where the backward's time goes: per-kernel GPU time of one flash_attn_dash backward (torch.profiler).

    python research/profile_bwd.py [--hdim 128] [--seqlen 512,2048,8192] [--causal] [--deterministic] [--varlen]

Same shapes as bench_attn.py (16k tokens, hidden 2048). Prints, per shape, each kernel's mean time per
backward and its share, so the fixed per-token costs (preprocess, dQ postprocess) can be weighed
against the main kernel. --varlen: also the same batch as one uniform pack through flash_attn_varlen_func (where the
varlen path's extra time goes, beside the dense call). A diagnostic, not a benchmark: profiler timestamps, no peer.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common as bc  # noqa: E402


def _short(name: str) -> str:
    """Kernel name without template arguments and parameter lists."""
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    return "".join(out).split("::")[-1] or name


def profile_one(seqlen: int, hdim: int, causal: bool, deterministic: bool, iters: int,
                varlen: bool = False) -> list[tuple[str, float]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import flash_attn_dash

    heads = bc.HIDDEN // hdim
    batch = max(1, bc.TOKENS_PER_BATCH // seqlen)
    if varlen:
        q, k, v = (torch.randn(batch * seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * seqlen
        out = flash_attn_dash.flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=causal,
                                                     deterministic=deterministic)
    else:
        q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = flash_attn_dash.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    dout = torch.randn_like(out)
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            totals[_short(ev.name)] += ev.device_time / iters
    return sorted(totals.items(), key=lambda kv: -kv[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--seqlen", default="512,2048,8192", help="comma-separated sequence lengths")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--varlen", action="store_true", help="also profile the batch as one uniform varlen pack")
    args = p.parse_args(argv)
    for s in (int(x) for x in args.seqlen.split(",")):
        for varlen in (False, True) if args.varlen else (False,):
            rows = profile_one(s, args.hdim, args.causal, args.deterministic, args.iters, varlen)
            total = sum(t for _, t in rows)
            mode = "det" if args.deterministic else "non-det"
            api = "varlen pack" if varlen else "dense"
            print(f"\nhdim {args.hdim} {'causal' if args.causal else 'full'} {mode} seqlen {s} {api}: "
                  f"{total:.1f} us per backward")
            for name, t in rows:
                print(f"  {t:9.1f} us  {100 * t / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
