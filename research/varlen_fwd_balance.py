"""How evenly the varlen forward's static grid spreads a causal pack's tiles over the CTAs (CPU model, no GPU).

    python research/varlen_fwd_balance.py [--grid 132] [--heads 16] [--block 128]

A causal query block of a sequence costs the key blocks it sees; the table's tiles are dealt to `grid` CTAs in
rounds (tile t to CTA t % grid, or in alternating directions as the dense causal scheduler does). Prints, per pack
and table order, the balance: ideal per-CTA work / the busiest CTA's work (1 = perfect). Orders: `per-sequence` (the
prepare CTA's today: sequences longest first, each sequence's blocks descending, heads inner) and `global` (every
tile of the pack sorted by cost, descending). The Pareto packs are bench_varlen.py's (seed 0).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from flash_attn_dash.cad.workload import pareto_doc_lens  # noqa: E402


def causal_costs(lens: list[int], heads: int, block: int) -> list[int]:
    """The per-sequence table: sequences longest first, blocks descending, heads inner; cost = key blocks seen."""
    out = []
    for n in sorted(lens, reverse=True):
        blocks = -(-n // block)
        for level in range(blocks):
            out += [blocks - level] * heads
    return out


def balance(costs: list[int], grid: int, alternate: bool) -> float:
    load = [0] * grid
    for cta in range(grid):
        t = cta
        while t < len(costs):
            load[cta] += costs[t]
            t = t + 2 * grid - 1 - 2 * (t % grid) if alternate else t + grid
    return (sum(costs) / grid) / max(load) if costs else 1.0


def pareto_pack(tokens: int, seed: int) -> list[int]:
    """benchmarks/bench_varlen.py's long-tailed pack of `tokens` tokens (Pareto alpha 1, documents of >= 128)."""
    return pareto_doc_lens(1, tokens, seed, alpha=1.0, scale=128, min_len=128)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=int, default=132)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args(argv)
    packs = {"uniform 8 x 2k": [2048] * 8, "uniform 2 x 8k": [8192] * 2,
             "pareto 16k": pareto_pack(16384, 0), "pareto 64k": pareto_pack(65536, 0)}
    print(f"{'pack':<16} {'per-seq rr':>10} {'per-seq alt':>11} {'global rr':>10} {'global alt':>10}")
    for name, lens in packs.items():
        per_seq = causal_costs(lens, args.heads, args.block)
        glob = sorted(per_seq, reverse=True)
        cells = [balance(c, args.grid, alt) for c in (per_seq, glob) for alt in (False, True)]
        print(f"{name:<16} " + " ".join(f"{x:>10.3f}" for x in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
