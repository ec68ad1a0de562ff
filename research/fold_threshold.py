"""Backward time of GQA sliding windows with and without the GQA sibling fold, per window width: where the fold's
rule (variants.GQA_FOLD_MAX_BAND_STEPS) should stop folding.

    python3 research/fold_threshold.py [--seqlen 8192] [--windows 128,256,...] [--iters 20]

Each row: gpt-oss-like hdim 64 (64/8 heads) and Llama-like hdim 128 (32/8
heads), causal window (w-1, 0), deterministic and not; the fold forced on or off by the rule's threshold; median of
CUDA-event timings of the whole torch.autograd.grad call (benchmarks/common.time_cuda, GPU sleep padding), the two
settings interleaved per window. Prints one table: band steps (TileGrid.band_steps), ms folded / unfolded, ratio.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import common as bc  # noqa: E402
from flash_attn_dash import flash_attn_func, variants  # noqa: E402
from flash_attn_dash.launch import bwd_launch  # noqa: E402
from flash_attn_dash.schedule.tiles import TileGrid  # noqa: E402

SHAPES = {"hdim64": (64, 64, 8), "hdim128": (128, 32, 8)}  # head dim, query heads, K/V heads


def bwd_ms(q, k, v, dout, window, deterministic, fold, iters) -> float:
    variants.GQA_FOLD_MAX_BAND_STEPS = 10 ** 9 if fold else 0
    bwd_launch.cache_clear()
    out = flash_attn_func(q, k, v, window_size=window, deterministic=deterministic)

    def call(_):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return float(torch.tensor(bc.time_cuda(call, iters, 3)).median())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--windows", default="128,256,512,1024,2048,4096")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    print(f"fold threshold probe: seqlen {args.seqlen}, bf16, batch 1, causal windows; GPU "
          f"{torch.cuda.get_device_name()}")
    print(f"{'shape':8} {'window':>6} {'steps':>5} {'mode':7} {'fold ms':>8} {'plain ms':>8} {'fold/plain':>10}")
    for name, (d, h, hk) in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, args.seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        k, v = (torch.randn(1, args.seqlen, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen,
                            requires_grad=True) for _ in range(2))
        dout = torch.randn_like(q)
        for w in (int(x) for x in args.windows.split(",")):
            window = (w - 1, 0)
            steps = TileGrid("causal", args.seqlen, args.seqlen, *variants.bwd_tile(d), window).band_steps()
            for det in (False, True):
                plain = bwd_ms(q, k, v, dout, window, det, False, args.iters)
                fold = bwd_ms(q, k, v, dout, window, det, True, args.iters)
                print(f"{name:8} {w:6d} {steps:5d} {'det' if det else 'non-det':7} {fold:8.3f} {plain:8.3f} "
                      f"{fold / plain:10.3f}", flush=True)


if __name__ == "__main__":
    main()
