"""Where the backward's dQ-store warps spend their time: a diagnostic for the determinism tax.

    python research/bwd_timeline.py [--hdim 128] [--seqlen 2k,4k,8k] [--json OUT.json] [--raw OUT.npz]

Kernels built with ``FLASH_DASH_BWD_TIMELINE=1`` (``NVCC_APPEND_FLAGS=-DFLASH_DASH_BWD_TIMELINE=1`` when compiling
``hopper/``) record, for every dQ contribution (b, h, m, rank), the fields of ``FIELDS`` (layout in
``hopper/bwd/timeline.hpp``). :func:`record` runs one backward with such a build and returns the records;
:func:`summarize` reduces them to the numbers that separate rank-chain stalls (time a store warp waits for the
contribution ranked before its own) from the rest; :func:`tile_transitions` what a CTA spends between K/V tiles.
Production builds ignore the buffer; :func:`record` then raises.
The command line records one backward per schedule of each DASH-grid shape (bf16, 16k tokens, hidden 2048),
deterministic and not, after one untimed warm-up call, and prints the summaries; :func:`tile_phases` splits a change
of K/V tile into the MMA warpgroups' epilogue, K/V wait and first-Q wait, and a step into its waits for the loads
and for the dQ hand-off buffer (``TILE_FIELDS``, recorded beside).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402
from flash_attn_dash import variants  # noqa: E402

FIELDS = ("seen_ns", "wait_pred_cycles", "wait_mma_cycles", "store_cycles", "cta_step")
# Per K/V tile (the MMA warpgroups' side, bwd/timeline.hpp's TileTimeline), stored after the dQ records: the change
# of tile, then the step loop's waits summed over the tile's steps (Q, dO, the dQ hand-off buffer), its length, steps.
TILE_FIELDS = ("kv_wait_ns", "kv_wait_cycles", "first_q_cycles", "epilogue_cycles", "cta", "q_wait_cycles",
               "do_wait_cycles", "acquire_cycles", "loop_cycles", "steps")


def record(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool, schedule: str, deterministic: bool = True, sm_margin: int = 0, with_tiles: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run one backward (CUDA inputs in flash_attn_func's layout, ``lse`` (b, h, sq) fp32 natural log) and return
    its int64 records, shape (b, h, M, N, len(FIELDS)); entries of tiles no contribution reaches stay -1.
    ``with_tiles``: also the per-K/V-tile records, shape (tiles, len(TILE_FIELDS)) (-1 where a tile ran no step).

    ``schedule`` is a kernel schedule name (``variants.SCHEDULE_NAMES``) or "auto".
    Raises RuntimeError when the kernels were built without ``FLASH_DASH_BWD_TIMELINE=1`` (nothing recorded).
    """
    from flash_attn_dash.ops import bwd_into, check_cuda_inputs

    check_cuda_inputs(q, k, v, sm_margin)
    b, sq, h, d = q.shape
    block_m, block_n = variants.bwd_tile(d)
    shape = (b, h, -(-sq // block_m), -(-k.shape[1] // block_n), len(FIELDS))
    # The tile records follow the dQ records in one allocation (the kernel finds them after b*h*M*N records): at most
    # one tile per (b, query head, n).
    n_dq = shape[0] * shape[1] * shape[2] * shape[3]
    n_tiles = b * h * shape[3]
    buf = torch.full((n_dq * len(FIELDS) + n_tiles * len(TILE_FIELDS),), -1, dtype=torch.int64, device=q.device)
    timeline = buf[: n_dq * len(FIELDS)].view(shape)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bwd_into(dout, q, k, v, out, lse, dq, dk, dv, d ** -0.5, causal, deterministic, schedule, sm_margin,
             timeline=timeline)
    if bool((timeline[..., 4] < 0).all()):  # (reading the flag waits for the backward)
        raise RuntimeError("no timeline recorded: the backward kernels were built without FLASH_DASH_BWD_TIMELINE=1 "
                           "(rebuild hopper/ with NVCC_APPEND_FLAGS=-DFLASH_DASH_BWD_TIMELINE=1)")
    if with_tiles:
        return timeline, buf[n_dq * len(FIELDS):].view(n_tiles, len(TILE_FIELDS))
    return timeline


def _stats(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"median": 0.0, "mean": 0.0, "p90": 0.0}
    return {"median": float(np.median(x)), "mean": float(x.mean()), "p90": float(np.percentile(x, 90))}


def _records(records: torch.Tensor | np.ndarray, ndim: int = 5, fields: tuple[str, ...] = FIELDS,
             what: str = "timeline must have shape (b, h, M, N, {})") -> np.ndarray:
    """:func:`record`'s dQ records (or, with TILE_FIELDS, its tile records) as a numpy array, the shape checked."""
    rec = records.cpu().numpy() if isinstance(records, torch.Tensor) else np.asarray(records)
    if rec.ndim != ndim or rec.shape[-1] != len(fields):
        raise ValueError(f"{what.format(len(fields))}, got {rec.shape}")
    return rec


def summarize(timeline: torch.Tensor | np.ndarray, clock_ghz: float = 1.98) -> dict[str, Any]:
    """Reduce :func:`record`'s output to microsecond statistics (cycles / ``clock_ghz``).

    Returns ``steps`` (contributions recorded), ``wait_pred_us`` / ``wait_mma_us`` / ``store_us`` (per
    contribution: waiting for the predecessor's count, then for the MMA warpgroups' tile, then bulk copy to
    increment), ``wait_pred_first_step_us`` / ``wait_pred_later_steps_us`` (the same wait at a K/V tile's first
    step vs the others: wave boundaries vs steady state), ``wait_pred_share`` (fraction of the store warps' time
    spent waiting for predecessors), ``cta_wait_pred_ms`` (per-CTA totals: median and max) and ``rank_gap_us``
    (between consecutive ranks of one dQ tile, the time from one count being seen to the next, by %globaltimer).
    """
    rec = _records(timeline)
    valid = rec[..., 4] >= 0
    flat = rec[valid]
    to_us = 1e-3 / clock_ghz
    wait_pred = flat[:, 1] * to_us
    wait_mma = flat[:, 2] * to_us
    store = flat[:, 3] * to_us
    step = flat[:, 4] & 0xFFFFFFFF
    cta = flat[:, 4] >> 32
    busy = wait_pred.sum() + wait_mma.sum() + store.sum()
    per_cta = np.bincount(cta.astype(np.int64), weights=wait_pred) * 1e-3 if flat.size else np.zeros(1)
    gaps = []
    seen = np.where(valid, rec[..., 0], -1).reshape(-1, rec.shape[3])  # (b*h*M, N) by rank
    for row in seen:
        row = row[row >= 0]
        if row.size > 1:
            gaps.append(np.diff(row) * 1e-3)
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    return {
        "steps": int(flat.shape[0]),
        "wait_pred_us": _stats(wait_pred),
        "wait_mma_us": _stats(wait_mma),
        "store_us": _stats(store),
        "wait_pred_first_step_us": _stats(wait_pred[step == 0]),
        "wait_pred_later_steps_us": _stats(wait_pred[step > 0]),
        "wait_pred_share": float(wait_pred.sum() / busy) if busy > 0 else 0.0,
        "cta_wait_pred_ms": {"median": float(np.median(per_cta)), "max": float(per_cta.max())},
        "rank_gap_us": _stats(gaps),
    }


def tile_transitions(timeline: torch.Tensor | np.ndarray, clock_ghz: float = 1.98) -> dict[str, Any]:
    """How long a CTA spends between K/V tiles, from :func:`record`'s output: per CTA, each contribution's *ready*
    time (``seen_ns`` plus the wait for the MMA warpgroups' tile: when the store warp had the step's dQ) in time
    order; ``step_us`` is the interval between consecutive steps of one tile, ``tile_gap_us`` the interval from a
    tile's last step to the next tile's first, and ``tile_overhead_us`` their medians' difference (what a tile
    transition costs beyond a step: epilogue, K/V loads, pipeline refill, claim). ``gap_share`` is the transitions'
    part of the CTAs' time from first to last ready step, beyond one step each."""
    rec = _records(timeline)
    flat = rec[rec[..., 4] >= 0]
    ready = flat[:, 0] * 1e-3 + flat[:, 2] * (1e-3 / clock_ghz)
    cta, step = flat[:, 4] >> 32, flat[:, 4] & 0xFFFFFFFF
    order = np.lexsort((ready, cta))
    ready, cta, step = ready[order], cta[order], step[order]
    same_cta = cta[1:] == cta[:-1]
    gap = np.diff(ready)
    starts_tile = step[1:] == 0  # the next contribution is a tile's first step (GQA-folded walks restart per sibling)
    steps, tiles = gap[same_cta & ~starts_tile], gap[same_cta & starts_tile]
    first = np.flatnonzero(np.r_[True, ~same_cta])  # each CTA's first record (sorted by CTA, then time)
    last = np.r_[first[1:], ready.size] - 1
    span = float((ready[last] - ready[first]).sum()) if ready.size else 0.0
    step_med = float(np.median(steps)) if steps.size else 0.0
    overhead = float(np.median(tiles)) - step_med if tiles.size else 0.0
    return {
        "step_us": _stats(steps),
        "tile_gap_us": _stats(tiles),
        "tile_overhead_us": overhead,
        "transitions": int(tiles.size),
        "gap_share": float(np.clip(tiles - step_med, 0, None).sum() / span) if span > 0 else 0.0,
    }


def tile_phases(tiles: torch.Tensor | np.ndarray, clock_ghz: float = 1.98) -> dict[str, Any]:
    """Where a change of K/V tile goes on the MMA warpgroups' side, from :func:`record`'s tile records: medians of
    ``kv_wait_us`` (waiting for the tile's K/V), ``first_q_us`` (then for its first Q/dO stage) and ``epilogue_us``
    (its dK/dV stores), over the tiles that are not their CTA's first (a CTA's first K/V wait is the launch's), and
    ``share``: the changes' part of the CTAs' time from their first tile's start to their last's (each earlier tile's
    epilogue and each later tile's waits, over that span; unlike :func:`tile_transitions`' ``gap_share``, no rank
    wait of the dQ store warps enters it). Per step (each tile's sums over its steps, medians over the tiles):
    ``step_us`` (the step loop's length), ``q_wait_us`` / ``do_wait_us`` (waiting for the loads; the first step's Q
    wait included) and ``acquire_us`` (for the dQ hand-off buffer: the store warp's release, where the rank chain
    reaches the MMA warpgroups)."""
    rec = _records(tiles, 2, TILE_FIELDS, "tile records must have shape (tiles, {})")
    rec = rec[(rec[:, 0] >= 0) & (rec[:, 4] >= 0)]
    rec = rec[np.lexsort((rec[:, 0], rec[:, 4]))]  # by CTA, then start time
    later = np.r_[False, rec[1:, 4] == rec[:-1, 4]] if rec.size else np.zeros(0, dtype=bool)
    earlier = np.r_[later[1:], False] if rec.size else later  # followed by a tile of the same CTA
    to_us = 1e-3 / clock_ghz
    kv, first_q, epi = (rec[later, i] * to_us for i in (1, 2, 3))
    span_us = float((rec[later, 0] - rec[np.flatnonzero(later) - 1, 0]).sum()) * 1e-3 if later.any() else 0.0
    spent_us = float(rec[earlier, 3].sum() + rec[later, 1].sum() + rec[later, 2].sum()) * to_us
    # Per step, each tile's sums over its steps (every tile that ran one, a CTA's first included).
    steps = np.maximum(rec[:, 9], 1)
    per_step = {key: _stats(rec[:, i] / steps * to_us)
                for key, i in (("step_us", 8), ("q_wait_us", 5), ("do_wait_us", 6), ("acquire_us", 7))}
    return {"tiles": int(later.sum()), "kv_wait_us": _stats(kv), "first_q_us": _stats(first_q),
            "epilogue_us": _stats(epi), "share": spent_us / span_us if span_us > 0 else 0.0, **per_step}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", default="128", help="comma list of head dims (default 128)")
    ap.add_argument("--seqlen", default="2k,4k,8k", help="comma list (default 2k,4k,8k)")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="SM clock for cycles -> us (default 1.98)")
    ap.add_argument("--json", help="write every summary here")
    ap.add_argument("--raw", help="also save every run's records here (numpy .npz, one array per run; ~9 MB per "
                                   "run at 8k before compression: keep the shape list short)")
    args = ap.parse_args(argv)
    common.require_cuda("bwd_timeline.py")
    from flash_attn_dash.ops import fwd

    rows = []
    print(f"{'hdim':>4} {'mask':>6} {'seqlen':>6} {'schedule':>16} {'det':>3}  wait_pred us (first/later step)"
          f"  wait_mma  store  pred share  rank gap us  step / tile gap us  gap share  epilogue / kv wait / first q us  share"
          f"  MMA step / q / dO / acquire us")
    raw = {}
    for hdim in (int(x) for x in args.hdim.split(",")):
        for causal in (False, True):
            mask = "causal" if causal else "full"
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                q, k, v, dout = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                out, lse = fwd(q, k, v, hdim ** -0.5, causal, 0)
                # Non-deterministic backwards walk one order whatever the schedule: one row.
                runs = [(name, True) for name in variants.schedules_for(mask)] + [("auto", False)]
                for schedule, det in runs:
                    record(dout, q, k, v, out, lse, causal, schedule, det)  # warm-up
                    tl, tiles = record(dout, q, k, v, out, lse, causal, schedule, det, with_tiles=True)
                    wp = summarize(tl, args.clock_ghz)
                    tr = tile_transitions(tl, args.clock_ghz)
                    ph = tile_phases(tiles, args.clock_ghz)
                    label = schedule if det else "(non-det walk)"
                    rows.append({"hdim": hdim, "causal": causal, "seqlen": s, "schedule": label,
                                 "deterministic": det, **wp, "transitions": tr, "tile_phases": ph})
                    if args.raw:
                        raw[f"{hdim}-{mask}-{s}-{schedule}-{'det' if det else 'nondet'}"] = tl.cpu().numpy()
                    print(f"{hdim:>4} {mask:>6} {s:>6} {label:>16} {'yes' if det else 'no':>3}"
                          f"  {wp['wait_pred_us']['mean']:6.2f} ({wp['wait_pred_first_step_us']['mean']:6.2f}"
                          f"/{wp['wait_pred_later_steps_us']['mean']:5.2f})"
                          f"  {wp['wait_mma_us']['mean']:8.2f}  {wp['store_us']['mean']:5.2f}"
                          f"  {wp['wait_pred_share']:10.1%}  {wp['rank_gap_us']['median']:6.2f}"
                          f"  {tr['step_us']['median']:6.2f} / {tr['tile_gap_us']['median']:7.2f}"
                          f"  {tr['gap_share']:8.1%}  {ph['epilogue_us']['median']:8.2f} /"
                          f" {ph['kv_wait_us']['median']:7.2f} / {ph['first_q_us']['median']:8.2f}  {ph['share']:6.1%}"
                          f"  {ph['step_us']['median']:5.2f} / {ph['q_wait_us']['median']:4.2f} /"
                          f" {ph['do_wait_us']['median']:4.2f} / {ph['acquire_us']['median']:4.2f}",
                          flush=True)
    if args.raw:
        np.savez_compressed(args.raw, **raw)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
