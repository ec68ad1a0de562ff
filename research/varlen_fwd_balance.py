"""How evenly the varlen forward's grid spreads a causal pack's tiles over the CTAs (CPU model, no GPU).

    python research/varlen_fwd_balance.py [--grid 132] [--heads 16] [--block 128]

A causal query block of a sequence costs the key blocks it sees. The table's tiles go to `grid` CTAs either in
static rounds (tile t to CTA t % grid, or in alternating directions as the dense causal scheduler does) or by
dynamic claims (CTA g starts with tile g, then each next tile of the table goes to the CTA that claims first: the
kernels' FwdVarlenScheduler). The kernel's producer claims once a tile's loads are out (close to when the CTA frees
up: `claims`) or, where it looks a tile ahead (the next Q, the L2 prefetch: hdim 128), when the tile before starts
(`claims ahead`). Prints, per pack and table order, the balance: ideal per-CTA work / the busiest CTA's work
(1 = perfect). Orders: `per-sequence` (the prepare CTA's: sequences longest first, each sequence's blocks descending,
heads inner) and `global` (every tile of the pack sorted by cost, descending). The Pareto packs are
bench_varlen.py's (seed 0).
"""
from __future__ import annotations

import argparse
import heapq
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


def claimed_balance(costs: list[int], grid: int, ahead: bool) -> float:
    """Dynamic claims: CTA g runs tile g, then the table's next tile goes to the CTA that claims first (ties: the
    lower CTA). A CTA claims when its tile ends, or (`ahead`) when its tile starts, for after it."""
    load = [0] * grid  # when each CTA's last tile ends
    claims = []  # (claims at, CTA)
    for g, cost in enumerate(costs[:grid]):
        load[g] = cost
        claims.append((0 if ahead else cost, g))
    heapq.heapify(claims)
    for cost in costs[grid:]:
        _, g = heapq.heappop(claims)
        start = load[g]
        load[g] += cost
        heapq.heappush(claims, (start if ahead else load[g], g))
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
    columns = ["rr", "alt", "claims", "claims ahead"]
    print(f"{'pack':<16} " + " ".join(f"{order + ' ' + c:>20}" for order in ("per-seq", "global") for c in columns))
    for name, lens in packs.items():
        per_seq = causal_costs(lens, args.heads, args.block)
        glob = sorted(per_seq, reverse=True)
        cells = [f(c) for c in (per_seq, glob)
                 for f in (lambda c: balance(c, args.grid, False), lambda c: balance(c, args.grid, True),
                           lambda c: claimed_balance(c, args.grid, False),
                           lambda c: claimed_balance(c, args.grid, True))]
        print(f"{name:<16} " + " ".join(f"{x:>20.3f}" for x in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
