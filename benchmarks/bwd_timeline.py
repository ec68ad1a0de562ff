"""Determinism-tax diagnostic: where the backward's dQ-store warps wait, per schedule and mode.

    python benchmarks/bwd_timeline.py [--hdim 128] [--seqlen 2k,4k,8k] [--json OUT.json]

Needs kernels built with FLASH_DASH_BWD_TIMELINE=1 (flash_attn_dash/bwd_timeline.py). For each DASH-grid shape
(bf16, 16k tokens, hidden 2048) it records one backward per schedule that applies to the mask, deterministic and
not, after one untimed warm-up call, and prints flash_attn_dash.bwd_timeline.summarize's numbers: how long each
contribution waited for its rank predecessor (at a K/V tile's first step and at later steps), for the MMA
warpgroups, and for its own store; the share of the store warps' time spent waiting for predecessors.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", default="128", help="comma list of head dims (default 128)")
    ap.add_argument("--seqlen", default="2k,4k,8k", help="comma list (default 2k,4k,8k)")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="SM clock for cycles -> us (default 1.98)")
    ap.add_argument("--json", help="write every summary here")
    args = ap.parse_args(argv)
    common.require_cuda("bwd_timeline.py")
    import torch

    from flash_attn_dash.bwd_timeline import record, summarize
    from flash_attn_dash.checks import MASK_ONLY
    from flash_attn_dash.ops import KERNEL_SCHEDULES, fwd

    rows = []
    print(f"{'hdim':>4} {'mask':>6} {'seqlen':>6} {'schedule':>16} {'det':>3}  wait_pred us (first/later step)"
          f"  wait_mma  store  pred share  rank gap us")
    for hdim in (int(x) for x in args.hdim.split(",")):
        for causal in (False, True):
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                q, k, v, dout = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                out, lse = fwd(q, k, v, hdim ** -0.5, causal, 0)
                # Non-deterministic backwards ignore the schedule (hopper/bwd_schedule.hpp choose_launch): one row.
                runs = [(name, True) for name in KERNEL_SCHEDULES if MASK_ONLY.get(name, causal) == causal]
                runs.append(("descending", False))
                for schedule, det in runs:
                    record(dout, q, k, v, out, lse, causal, schedule, det)  # warm-up
                    wp = summarize(record(dout, q, k, v, out, lse, causal, schedule, det), args.clock_ghz)
                    label = schedule if det else "(non-det walk)"
                    rows.append({"hdim": hdim, "causal": causal, "seqlen": s, "schedule": label,
                                 "deterministic": det, **wp})
                    print(f"{hdim:>4} {'causal' if causal else 'full':>6} {s:>6} {label:>16} {'yes' if det else 'no':>3}"
                          f"  {wp['wait_pred_us']['mean']:6.2f} ({wp['wait_pred_first_step_us']['mean']:6.2f}"
                          f"/{wp['wait_pred_later_steps_us']['mean']:5.2f})"
                          f"  {wp['wait_mma_us']['mean']:8.2f}  {wp['store_us']['mean']:5.2f}"
                          f"  {wp['wait_pred_share']:10.1%}  {wp['rank_gap_us']['median']:6.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
