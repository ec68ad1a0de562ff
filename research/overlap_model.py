"""The schedule model with the kernel's dQ-store warps: which deterministic order a head dim's store latency favours.

    python research/overlap_model.py [--hdim 64,128] [--seqlen 2k,8k] [--pareto 16k] [--ratio 0.5,0.7,0.9]
                                     [--mask causal] [--warps 2]

The product model (flash_attn_dash.schedule.simulate, the DASH paper's) runs each step's reduce on the CTA after its
compute. The kernel hands each step's dQ to a store warp through one shared-memory buffer instead, so the MMA
warpgroups run on while the store waits for its rank predecessor. Per CTA, step i: the MMA deposits its dQ at
``d_i = max(d_(i-1) + c, f_(i-1))`` (the buffer is free once the previous step's store is done with it); the store
issues its copies at ``s_i = max(d_i, f_(i-1), w_i, e_i)`` (``e_i``: the release of its rank predecessor; ``w_i``: its
store warp is free), they have read the buffer at ``s_i + read * r`` and completed at ``s_i + r``. Two store warps
(the kernel since session 23) take a CTA's steps in turn, so the buffer is free after the read and a warp is busy
until its step's release; with one (``--warps 1``, the kernel before) the buffer came back only after completion.
Deterministic stores release at completion. Non-deterministic ones wait for the contribution of rank
``max(0, rank - 3)`` (the kernel's slack of two) and, after rank 0, release at the read. Rank-chain waits then cost
only where they exceed the compute they overlap: orders whose tiles start in lock-step on one row (descending on a
causal mask) lose once ``r`` nears ``c``. ``r / c`` is the store's share of a step; the store-warp timeline
(research/bwd_timeline.py: the rank gap over the step interval) measures it.

On the dynamic grid the tiles are claimed again, in the plan's claim order, by the CTA whose MMA finishes its tile
first (the kernel claims after a tile's last MMA), so a CTA held up by a rank wait claims later; static and pair grids
keep the plan's CTAs.

Prints, per order, the deterministic makespan over the non-deterministic descending one (the walk non-det packs run)
for the DASH grid (16k tokens, hidden 2048) and for Pareto packs (``--pareto``: benchmarks/bench_varlen.py's packs,
seed 0).
"""
from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402

from flash_attn_dash import variants  # noqa: E402
from flash_attn_dash.schedule.orders import SCHEDULES, applicable  # noqa: E402
from flash_attn_dash.schedule.pack_plan import build_pack_plan  # noqa: E402
from flash_attn_dash.schedule.plan import Plan, build_plan  # noqa: E402
from flash_attn_dash.schedule.simulate import Deadlock  # noqa: E402


def slack_predecessor(pred: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per step, the step a non-deterministic store waits for: rank ``max(0, rank - 3)`` of its dQ tile (-1: none)."""
    target = np.full(pred.size, -1, dtype=np.int64)
    cur = pred.copy()
    for links in range(1, 4):  # rank r > 0 walks min(r, 3) links back
        target = np.where((rank > 0) & (np.minimum(rank, 3) == links), cur, target)
        cur = np.where(cur >= 0, pred[np.maximum(cur, 0)], -1)
    return target


def store_warps_makespan(plan: Plan, c: float, r: float, deterministic: bool = True, warps: int = 2,
                         read: float = 0.3, dynamic: bool | None = None) -> float:
    """Makespan of ``plan`` with per-step compute ``c`` and store ``r`` (``read * r`` of it until the copies have read
    the buffer) on ``warps`` store warps (module docstring). ``dynamic``: claim the tiles again in claim order (the
    dynamic grid; default: whether the plan runs on it). Event driven: a CTA whose next store waits on an unsimulated
    predecessor is parked on it; CTAs advance in the order of their MMA clocks."""
    if c < 0 or r < 0:
        raise ValueError(f"c and r must be >= 0, got c={c!r}, r={r!r}")
    if warps not in (1, 2):
        raise ValueError(f"warps must be 1 or 2, got {warps!r}")
    o = plan._orders
    if dynamic is None:
        dynamic = "dynamic" in plan.description
    start = np.concatenate([[0], np.cumsum(o.tile_len)[:-1]]).tolist()
    length = o.tile_len.tolist()
    pred = plan.rank_predecessor()
    rank = plan.step_rank
    wait_on = (pred if deterministic else slack_predecessor(pred, rank)).tolist()
    releases_at_read = [False] * rank.size if deterministic else (rank > 0).tolist()
    if dynamic:  # one queue shared by every CTA: the claims, in claim order
        queues = [np.argsort(o.tile_round, kind="stable").tolist()]
    else:  # a queue per CTA: its tiles as the plan deals them
        per_cta = np.searchsorted(o.tile_cta, np.arange(plan.num_ctas + 1))
        queues = [list(range(per_cta[g], per_cta[g + 1])) for g in range(plan.num_ctas)]
    heads = [0] * len(queues)
    release = [None] * rank.size
    parked: dict[int, list[int]] = {}
    clock = [0.0] * plan.num_ctas          # the MMA's last deposit
    buffer_free = [0.0] * plan.num_ctas    # f of the CTA's last step
    warp_free = [[0.0] * warps for _ in range(plan.num_ctas)]
    step_of_cta = [0] * plan.num_ctas
    tile_at = [None] * plan.num_ctas
    next_step = [0] * plan.num_ctas
    end = 0.0
    ready = [(0.0, g) for g in range(plan.num_ctas)]
    claim_due = [True] * plan.num_ctas  # on the dynamic grid: queued to claim (not woken from a rank wait)
    while ready:
        _, g = heapq.heappop(ready)
        while True:
            if tile_at[g] is None or next_step[g] == length[tile_at[g]]:
                if dynamic and not claim_due[g]:
                    claim_due[g] = True  # the next claim goes to the CTA whose MMA is done first
                    heapq.heappush(ready, (clock[g], g))
                    break
                claim_due[g] = False
                q = 0 if dynamic else g
                if heads[q] == len(queues[q]):
                    break
                tile_at[g], next_step[g] = queues[q][heads[q]], 0
                heads[q] += 1
                continue
            s = start[tile_at[g]] + next_step[g]
            p = wait_on[s]
            if p >= 0 and release[p] is None:
                parked.setdefault(p, []).append(g)
                break
            deposit = max(clock[g] + c, buffer_free[g])  # the buffer is free: the store may issue from here
            w = step_of_cta[g] % warps
            issue = max(deposit, warp_free[g][w], release[p] if p >= 0 else 0.0)
            read_done, done = issue + read * r, issue + r
            release[s] = read_done if releases_at_read[s] else done
            buffer_free[g] = read_done if warps == 2 else done
            warp_free[g][w] = release[s]
            clock[g] = deposit
            end = max(end, done)
            step_of_cta[g] += 1
            next_step[g] += 1
            for waiter in parked.pop(s, []):
                heapq.heappush(ready, (clock[waiter], waiter))
    if parked or any(x is None for x in release):
        raise Deadlock(f"{sum(x is None for x in release)} steps never ran")
    return end


def plan_of(mask: str, seqlens, block_m: int, block_n: int, heads: int, num_sms: int, schedule: str,
            batch: int) -> Plan:
    """The product plan of ``schedule``: a dense call (``seqlens`` an int, ``batch`` sequences) or a pack."""
    if isinstance(seqlens, int):
        return build_plan(mask, seqlens, seqlens, block_m, block_n, batch, heads, num_sms, schedule)
    return build_pack_plan(mask, seqlens, seqlens, block_m, block_n, heads, num_sms, schedule)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", default="64,128", help="comma list of head dims (default 64,128)")
    ap.add_argument("--seqlen", default="2k,8k", help="dense lengths, comma list (default 2k,8k; '' for none)")
    ap.add_argument("--pareto", default="16k", help="Pareto pack tokens, comma list (default 16k; '' for none)")
    ap.add_argument("--mask", default="causal", help="full, causal or both (default causal)")
    ap.add_argument("--ratio", default="0.5,0.7,0.9", help="store / compute per step, comma list")
    ap.add_argument("--warps", type=int, default=2, choices=(1, 2), help="dQ-store warps (default 2)")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args(argv)
    from benchmarks import common
    from flash_attn_dash.cad.workload import pareto_doc_lens

    masks = ("full", "causal") if args.mask == "both" else (args.mask,)
    cases = [(common.seqlen_label(s), s) for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen)
             or []]
    cases += [(f"pareto {common.seqlen_label(t)}", pareto_doc_lens(1, t, 0)[0])
              for t in common.parse_list(args.pareto.split(","), common.parse_seqlen) or []]
    print(f"{'hdim':>4} {'mask':>6} {'shape':>11} {'r/c':>4}  det / non-det descending per order (fb: falls back)")
    for hdim in (int(x) for x in args.hdim.split(",")):
        bm, bn = variants.bwd_tile(hdim)
        heads = common.HIDDEN // hdim
        for mask in masks:
            for label, seqlens in cases:
                batch = max(1, common.TOKENS_PER_BATCH // seqlens) if isinstance(seqlens, int) else 1
                names = [s for s in SCHEDULES if applicable(s, mask) and (isinstance(seqlens, int) or s != "shift")]
                plans = {s: plan_of(mask, seqlens, bm, bn, heads, args.sms, s, batch) for s in names}
                for ratio in (float(x) for x in args.ratio.split(",")):
                    ref = store_warps_makespan(plans["descending"], 1.0, ratio, False, args.warps)
                    cells = []
                    for name, plan in plans.items():
                        fb = "(fb)" if plan.schedule_used != name else ""
                        det = store_warps_makespan(plan, 1.0, ratio, True, args.warps)
                        cells.append(f"{name}{fb} {det / ref:.3f}")
                    print(f"{hdim:>4} {mask:>6} {label:>11} {ratio:>4.2f}  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
