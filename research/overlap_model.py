"""The schedule model with the kernel's decoupled dQ-store warp: which deterministic order a head dim's hand-off
latency favours.

    python research/overlap_model.py [--hdim 256] [--seqlen 2k,8k] [--ratio 0.3,0.5,0.7]

The product model (flash_attn_dash.schedule.simulate, the DASH paper's) runs each step's reduce on the CTA after its
compute. The kernel hands each step's dQ to a store warp through one shared-memory buffer instead, so the MMA
warpgroups run on while the store waits for its rank predecessor: step i deposits its dQ at
``ce_i = max(ce_(i-1) + c, se_(i-1))`` (the buffer comes back when the previous store completed) and its store runs
``[max(ce_i, end of the rank predecessor's store), + r]``. Rank-chain waits then cost only where they exceed the
compute they overlap, so orders whose tiles start in lock-step on one row (descending on a causal mask) lose only
once ``r`` nears ``c``. ``r / c`` is the store's share of a step; the store-warp timeline
(research/bwd_timeline.py: the rank gap over the step interval) measures it. Prints each order's makespan as a
fraction of the ideal (steps / CTAs * c), for the DASH grid (16k tokens, hidden 2048).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from flash_attn_dash import variants  # noqa: E402
from flash_attn_dash.schedule.orders import SCHEDULES, applicable  # noqa: E402
from flash_attn_dash.schedule.plan import Plan, build_plan  # noqa: E402
from flash_attn_dash.schedule.simulate import Deadlock  # noqa: E402


def overlapped_makespan(plan: Plan, c: float, r: float) -> float:
    """Makespan of ``plan`` with per-step compute ``c`` and store ``r`` on a decoupled store warp (module docstring).
    Event driven like simulate.walk: a CTA whose next store waits on an unfinished predecessor is parked on it."""
    if c < 0 or r < 0:
        raise ValueError(f"c and r must be >= 0, got c={c!r}, r={r!r}")
    pred = plan.rank_predecessor().tolist()
    ptr = plan.cta_ptr.tolist()
    end: list[float | None] = [None] * len(pred)
    waiter = [-1] * len(pred)
    pos = ptr[:-1]
    deposit, store_end = [0.0] * plan.num_ctas, [0.0] * plan.num_ctas
    ready = list(range(plan.num_ctas - 1, -1, -1))
    while ready:
        g = ready.pop()
        s, stop, ce, se = pos[g], ptr[g + 1], deposit[g], store_end[g]
        while s < stop:
            p = pred[s]
            e = 0.0
            if p >= 0:
                if end[p] is None:
                    waiter[p] = g
                    break
                e = end[p]
            ce = max(ce + c, se)
            se = max(ce, e) + r
            end[s] = se
            if waiter[s] >= 0:
                ready.append(waiter[s])
            s += 1
        pos[g], deposit[g], store_end[g] = s, ce, se
    stuck = [g for g in range(plan.num_ctas) if pos[g] < ptr[g + 1]]
    if stuck:
        raise Deadlock(f"{len(stuck)} CTAs stuck")
    return max((x for x in end if x is not None), default=0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", default="256", help="comma list of head dims (default 256)")
    ap.add_argument("--seqlen", default="2k,8k", help="comma list (default 2k,8k)")
    ap.add_argument("--ratio", default="0.3,0.5,0.7", help="store / compute per step, comma list")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args(argv)
    from benchmarks import common

    print(f"{'hdim':>4} {'mask':>6} {'seqlen':>6} {'r/c':>4}  makespan / ideal per order (fb: falls back)")
    for hdim in (int(x) for x in args.hdim.split(",")):
        for mask in ("full", "causal"):
            bm, bn = variants.bwd_tile(hdim)
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                batch, heads = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                plans = {name: build_plan(mask, s, s, bm, bn, batch, heads, args.sms, name)
                         for name in SCHEDULES if applicable(name, mask)}
                for ratio in (float(x) for x in args.ratio.split(",")):
                    cells = []
                    for name, plan in plans.items():
                        ideal = plan.num_steps / plan.num_ctas
                        fb = "(fb)" if plan.schedule_used != name else ""
                        cells.append(f"{name}{fb} {overlapped_makespan(plan, 1.0, ratio) / ideal:.3f}")
                    print(f"{hdim:>4} {mask:>6} {s:>6} {ratio:>4.2f}  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
