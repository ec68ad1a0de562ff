"""Command line: ``flash-attn-dash plan`` predicts the backward schedules of one shape with the schedule model;
``cad-plan`` plans a core-attention-disaggregation batch (:mod:`flash_attn_dash.cad.cli`); ``info`` shows the build.

Example: ``flash-attn-dash plan --seqlen 8192 --hdim 128 --causal --png plan.png``; a sliding window:
``flash-attn-dash plan --seqlen 8192 --hdim 64 --causal --window 128,-1``; a varlen pack sharing one grid:
``flash-attn-dash plan --seqlens 8192,2048,512,512 --hdim 128 --causal``.  Defaults follow the DASH benchmark
grid: 16k tokens per batch (``batch = 16384 // seqlen``) and hidden size 2048 (``heads = 2048 // hdim``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from . import __version__, variants
from .cad import cli as cad_cli
from .features import kernel_window
from .launch import bwd_launch, varlen_request
from .schedule.auto import Prediction, auto_reason, model_choice, predict, predict_pack
from .schedule.costs import default_costs
from .schedule.draw import MAX_PNG_PX, draw_gantt
from .schedule.packs import PackTiles, check_seqlens
from .schedule.tiles import TileGrid, check_window_size

def _head_dims(text: str) -> tuple[int, int]:
    """argparse type of --hdim: a variant-table entry by its build name (``128``; ``192v128``: q/k 192, v 128), as
    (qk, v)."""
    for h in variants.HEAD_DIMS:
        if h.build_name == text:
            return h.qk, h.v
    names = ", ".join(h.build_name for h in variants.HEAD_DIMS)
    raise argparse.ArgumentTypeError(f"must be one of {names} (192v128: q/k head dim 192, v 128), got {text!r}")


def _int_at_least(minimum: int, what: str):
    """argparse type: an int >= minimum, with an error that names what was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def _cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _window(text: str) -> tuple[int, int]:
    """argparse type: ``LEFT,RIGHT``, each -1 (unbounded) or a non-negative int."""
    try:
        return check_window_size(tuple(int(x) for x in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT with each side -1 (unbounded) or >= 0, got "
                                         f"{text!r}") from None


def _seqlens(text: str) -> tuple[int, ...]:
    """argparse type: ``L1,L2,...``, one length >= 0 per sequence of the pack."""
    try:
        lengths = tuple(int(x) for x in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths >= 0, one per sequence (e.g. "
                                         f"8192,2048,512), got {text!r}")
    return lengths


def _short(values, limit: int = 8) -> str:
    """``1,2,3`` or, past ``limit`` values, the first ones and a count."""
    values = [str(int(v)) for v in values]
    return ",".join(values) if len(values) <= limit else f"{','.join(values[:limit])},... ({len(values)} in all)"


def _png_problem(path: str) -> str | None:
    """Why ``path`` cannot take the chart (None if it can), found before the (possibly slow) simulation."""
    if not path.lower().endswith(".png"):
        return f"expected a file name ending in .png, got {path!r}"
    directory = os.path.dirname(path) or "."
    accepted = "expected a .png file in an existing, writable directory"
    if not os.path.isdir(directory):
        problem = "is not a directory" if os.path.exists(directory) else "does not exist"
        return f"directory {directory!r} {problem}, {accepted}"
    if os.path.isdir(path):
        return f"expected a file name ending in .png, got the directory {path!r}"
    existed = os.path.exists(path)
    try:  # opening is the only reliable test (permissions, read-only file systems, root)
        with open(path, "ab"):
            pass
    except OSError as err:
        return f"cannot write {path!r} ({err.strerror}), {accepted}"
    if not existed:
        os.remove(path)  # only a probe: the chart is written after the simulation
    return None


def _png_error(parser: argparse.ArgumentParser, problem: str) -> NoReturn:
    """Exit 2 with one line on stderr: a path problem is not a usage mistake, so no usage block."""
    parser.exit(2, f"{parser.prog}: error: argument --png: {problem}\n")


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its ``plan`` sub-parser (whose ``error()`` reports plan's own checks)."""
    parser = argparse.ArgumentParser(prog="flash-attn-dash", description="flash-attn-dash tools")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="predict makespan and bubbles of every backward schedule for one shape",
                          description="Predict the deterministic backward schedules of one shape with the DASH model.")
    lengths = plan.add_mutually_exclusive_group(required=True)
    lengths.add_argument("--seqlen", type=_positive_int, help="query sequence length")
    lengths.add_argument("--seqlens", type=_seqlens, metavar="L1,L2,...",
                         help="a varlen pack instead: the query length of every sequence (0 allowed), all sharing one "
                              "persistent grid; claims go to the longest sequence first")
    plan.add_argument("--seqlen-k", type=_positive_int, help="key sequence length (default: --seqlen)")
    plan.add_argument("--seqlens-k", type=_seqlens, metavar="K1,K2,...",
                      help="with --seqlens: the key length of every sequence (default: --seqlens)")
    plan.add_argument("--hdim", type=_head_dims, required=True, metavar="HDIM",
                      help="head dimension, or q/k and v head dims as 192v128 (an entry of the variant table)")
    plan.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned); default full")
    plan.add_argument("--window", type=_window, default=(-1, -1), metavar="LEFT,RIGHT",
                      help="sliding window (FlashAttention's window_size; -1 = unbounded, --causal sets RIGHT=0): "
                           "query i sees keys i + sk - sq - LEFT .. i + sk - sq + RIGHT; write --window=-1,R "
                           "when LEFT is -1")
    plan.add_argument("--batch", type=_positive_int,
                      help="batch size (default: max(1, 16384 // seqlen)); a pack's batch is its sequences")
    plan.add_argument("--heads", type=_positive_int, help="query heads (default: 2048 // hdim)")
    plan.add_argument("--heads-kv", type=_positive_int,
                      help="K/V heads, a divisor of --heads (GQA; default: --heads); on a narrow band the plan is the "
                           "GQA sibling fold's, as the kernels run it")
    plan.add_argument("--sms", type=_positive_int, default=132, help="SM count (default 132)")
    plan.add_argument("--sm-margin", type=_non_negative_int, default=0, help="SMs left free; grid = sms - margin")
    plan.add_argument("--c", type=_cost, help="compute cost per step (default: from tile shape, ns)")
    plan.add_argument("--r", type=_cost, help="reduce cost per step (default: from tile shape, ns)")
    plan.add_argument("--png",
                      help="write SM-timeline charts of every schedule, on one time axis, to this .png file "
                           f"(at most {MAX_PNG_PX[0]} x {MAX_PNG_PX[1]} pixels: rows get thinner past that)")
    plan.add_argument("--max-ctas", type=_positive_int, default=16,
                      help="CTAs drawn per panel, sampled evenly (default 16)")
    plan.add_argument("--json", action="store_true", help="print the numbers as JSON")
    cad_cli.add_parser(sub)
    sub.add_parser("info", help="what this install built and what the variant table holds",
                   description="Print the kernels this install built (or why none were), the variant table's head "
                               "dims and tiles, and the backward schedules.")
    return parser, plan


def _info() -> int:
    """``flash-attn-dash info``: the build and the variant table, no GPU needed."""
    from ._ext import build_info

    info = build_info()
    print(f"flash-attn-dash {__version__}")
    if info["kernels"]:
        print(f"kernels built: {', '.join(info['kernels'])} (extension {'loaded' if info['loaded'] else 'NOT loaded'}"
              + (f": {info['import_error']}" if not info["loaded"] else "") + ")")
    else:
        print(f"NO CUDA KERNELS BUILT: {info['no_kernels_reason']} (CPU tensors run the PyTorch reference)")
    for h in variants.HEAD_DIMS:
        f, c, b = h.fwd_full, h.fwd_causal, h.bwd
        print(f"head dim {h.qk if h.qk == h.v else (h.qk, h.v)}: forward {f.block_m}x{f.block_n} (full), "
              f"{c.block_m}x{c.block_n} (causal); backward {b.block_m}x{b.block_n}")
    for sch in variants.SCHEDULES:
        print(f"schedule {sch.name} (id {sch.id}): {'/'.join(sch.masks)} masks, {sch.grid} grid")
    return 0


def _progress(label: str):
    start = time.monotonic()

    def report(fraction: float) -> None:
        if time.monotonic() - start > 1.0:
            print(f"simulating {label}: {fraction:.0%}", file=sys.stderr, flush=True)

    return report


def _portable_text(plan) -> str:
    """A pack plan's portability column: ``all``, ``none`` or ``k/B`` of the sequences with work."""
    flags = [p for p in plan.sequence_portable if p is not None]
    return "all" if all(flags) else "none" if not any(flags) else f"{sum(flags)}/{len(flags)}"


def _table(predictions: list[Prediction], pick: str, reason: str, notes: list[str], header: list[str],
           unit: str, pack: bool) -> str:
    base = next(p for p in predictions if p.schedule == "ascending").makespan
    lines = header + [f"{'schedule':<16} {'runs as':<16} {'makespan ' + unit:>16} {'idle':>7} {'waits':>7} "
                      f"{'speedup':>8}" + (f" {'portable':>9}" if pack else "")]
    for p in predictions:
        mark = "  <- auto" if p.schedule == pick else ""
        portable = f" {_portable_text(p.timeline.plan):>9}" if pack else ""
        lines.append(f"{p.schedule:<16} {p.schedule_used:<16} {p.makespan / (1e3 if unit == 'us' else 1):>16.1f} "
                     f"{p.bubble_fraction:>7.1%} {p.wait_fraction:>7.1%} {base / p.makespan:>7.3f}x{portable}{mark}")
    lines.append(f"auto -> {reason}")
    lines += notes
    lines += [f"  {p.schedule}: {p.description}" for p in predictions]
    return "\n".join(lines)


@dataclass(frozen=True)
class _Shape:
    """What ``plan`` reports for one shape (a dense call or a pack), apart from the per-schedule numbers."""

    predictions: list[Prediction]
    pick: str  # the schedule auto runs
    reason: str
    notes: list[str]  # table lines after auto's
    header: list[str]  # the table's first lines, after "plan: "
    heading: str  # the chart's
    fields: dict  # the JSON's shape fields
    pack: bool


def _kv_text(heads: int, heads_kv: int) -> str:
    """`` (K/V 8)`` for GQA, nothing otherwise."""
    return "" if heads_kv == heads else f" (K/V {heads_kv})"


def _hdim_text(args: argparse.Namespace) -> str:
    """``128``, or ``192v128`` for a V head dim of its own."""
    return f"{args.hdim}" if args.hdim_v == args.hdim else f"{args.hdim}v{args.hdim_v}"


def _dense(args: argparse.Namespace, parser: argparse.ArgumentParser, c: float, r: float, grid: int) -> _Shape:
    """``plan --seqlen``: one dense call."""
    if args.seqlens_k is not None:
        parser.error("argument --seqlens-k: only with --seqlens (a pack); a dense call takes --seqlen-k")
    seqlen_k = args.seqlen_k or args.seqlen
    batch = args.batch or max(1, 16384 // args.seqlen)
    heads = args.heads or 2048 // args.hdim
    heads_kv = args.heads_kv or heads
    if heads % heads_kv:
        parser.error(f"argument --heads-kv: must divide --heads={heads}, got {heads_kv}")
    block_m, block_n = variants.bwd_tile(args.hdim, args.hdim_v)
    # The window in its canonical form: (-1, 0) is the causal mask, a side that clips nothing is unbounded.
    tiles = TileGrid("causal" if args.causal else "full", args.seqlen, seqlen_k, block_m, block_n, args.window)
    mask = tiles.mask
    # What the kernels run (flash_attn_dash.launch decides it): every window but the full mask's on the causal kernels.
    kernel_causal = tiles.window != (-1, -1)
    det = bwd_launch(kernel_causal, args.hdim, args.seqlen, seqlen_k, batch, heads, grid, True, "auto", tiles.window,
                     heads_kv, head_dim_v=args.hdim_v)
    predictions = predict(mask, args.hdim, args.seqlen, seqlen_k, batch, heads, grid, c, r,
                          progress=_progress(f"{tiles.describe()} seqlen {args.seqlen}"), window=tiles.window,
                          heads_kv=heads_kv, fold=det.gqa_fold)
    reason = auto_reason(mask, args.hdim, args.seqlen, seqlen_k, tiles.window)
    pick = det.requested
    if det.fallback:
        reason += f"; runs {det.schedule} here ({det.fallback})"
    nondet = bwd_launch(kernel_causal, args.hdim, args.seqlen, seqlen_k, batch, heads, grid, False, "auto",
                        tiles.window, heads_kv, head_dim_v=args.hdim_v).schedule
    notes = [f"non-deterministic backward walks: {nondet}"]
    if det.gqa_fold:
        notes.append(f"GQA sibling fold: one tile per K/V head walks its {heads // heads_kv} query heads "
                     f"(a band of at most {variants.GQA_FOLD_MAX_BAND_STEPS} Q tiles per K/V tile)")
    num_m, num_n = tiles.num_m, tiles.num_n
    shape = f"{mask} mask" if tiles.describe() == mask else tiles.describe()
    return _Shape(
        predictions, pick, reason, notes,
        [f"plan: {tiles.describe()}, seqlen_q={args.seqlen} seqlen_k={seqlen_k} hdim={_hdim_text(args)} batch={batch} "
         f"heads={heads}{_kv_text(heads, heads_kv)}, tiles {block_m}x{block_n} (M={num_m}, N={num_n}), "],
        f"{shape}, seqlen_q/seqlen_k {args.seqlen}/{seqlen_k}, hdim {_hdim_text(args)}, batch {batch}, heads {heads}"
        f"{_kv_text(heads, heads_kv)}, ",
        {"mask": mask, "window": list(tiles.window), "banded": tiles.banded, "seqlen_q": args.seqlen,
         "seqlen_k": seqlen_k, "head_dim": args.hdim, "head_dim_v": args.hdim_v, "batch": batch, "heads": heads,
         "heads_kv": heads_kv,
         "gqa_fold": det.gqa_fold, "block_m": block_m, "block_n": block_n, "num_m": num_m, "num_n": num_n,
         "non_deterministic_walk": nondet},
        False)


def _pack(args: argparse.Namespace, parser: argparse.ArgumentParser, c: float, r: float, grid: int) -> _Shape:
    """``plan --seqlens``: a varlen pack on one shared persistent grid (:mod:`.schedule.pack_orders`)."""
    for name, value in (("--seqlen-k", args.seqlen_k), ("--batch", args.batch)):
        if value is not None:
            parser.error(f"argument {name}: not with --seqlens (a pack's sequences are its batch; key lengths "
                         f"are --seqlens-k)")
    if args.heads_kv is not None:
        parser.error("argument --heads-kv: only with --seqlen (the pack model has one K/V head per query head)")
    try:
        lens_q, lens_k = check_seqlens(args.seqlens, args.seqlens_k)
    except ValueError as err:
        parser.error(f"argument {'--seqlens-k' if str(err).startswith('seqlens_k') else '--seqlens'}: {err}")
    heads = args.heads or 2048 // args.hdim
    block_m, block_n = variants.bwd_tile(args.hdim, args.hdim_v)
    pack = PackTiles("causal" if args.causal else "full", lens_q, lens_k, block_m, block_n, args.window)
    predictions = predict_pack(pack.mask, args.hdim, lens_q, lens_k, heads, grid, c, r,
                               progress=_progress(pack.describe()), window=pack.window)
    # Deterministic varlen auto is one portable order on every sequence (flash_attn_dash.launch.varlen_request).
    pick = varlen_request(True, "auto", args.hdim, kernel_window(args.causal, args.window, max(lens_q), max(lens_k))[1])
    reason = (f"{pick}: deterministic varlen auto, the measured faster portable order for this head dim and mask (a "
              f"sequence's bits do not depend on what it is packed with)")
    same_k = lens_k == lens_q
    order = [int(b) for b in pack.order]
    notes = [f"claim order (longest first): sequences {_short(order)}",
             "portable: sequences whose bits equal their dense batch-1 call's whatever the pack"]
    return _Shape(
        predictions, pick, reason, notes,
        [f"plan: {pack.describe()}, seqlens_q={_short(lens_q)} seqlens_k={'same' if same_k else _short(lens_k)} "
         f"hdim={_hdim_text(args)} heads={heads}, tiles {block_m}x{block_n} (M={_short(pack.num_m)}, "
         f"N={_short(pack.num_n)}), "],
        f"{pack.describe()}, seqlens {_short(lens_q)}" + ("" if same_k else f" / {_short(lens_k)}")
        + f", hdim {_hdim_text(args)}, heads {heads}, ",
        {"mask": pack.mask, "window": list(pack.window), "banded": pack.banded, "seqlens_q": list(lens_q),
         "seqlens_k": list(lens_k), "head_dim": args.hdim, "head_dim_v": args.hdim_v, "heads": heads,
         "block_m": block_m, "block_n": block_n,
         "num_m": pack.num_m.tolist(), "num_n": pack.num_n.tolist(), "claim_order": order},
        True)


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``plan``; ``parser`` is the plan sub-parser, so its errors name ``plan`` and show its usage."""
    if args.sm_margin >= args.sms:
        parser.error(f"argument --sm-margin: must be smaller than --sms={args.sms}, got {args.sm_margin}")
    if args.c == 0:
        parser.error("argument --c: the compute cost must be > 0")
    if args.png and (problem := _png_problem(args.png)):
        _png_error(parser, problem)
    grid = args.sms - args.sm_margin
    args.hdim, args.hdim_v = args.hdim  # q/k's head dim drives the model (MLA's pair has hdim 192's tiles)
    block_m, block_n = variants.bwd_tile(args.hdim, args.hdim_v)
    c, r = default_costs(args.hdim, block_m, block_n)
    default = args.c is None and args.r is None
    c = c if args.c is None else args.c
    r = r if args.r is None else args.r
    shape = (_pack if args.seqlens is not None else _dense)(args, parser, c, r, grid)
    predictions, pick = shape.predictions, shape.pick
    reason = f"{shape.reason}; the model alone picks {model_choice(predictions).schedule}"
    base = next(p for p in predictions if p.schedule == "ascending").makespan
    if args.json:
        rows = []
        for p in predictions:
            row = {"schedule": p.schedule, "schedule_used": p.schedule_used, "description": p.description,
                   "fallback": p.fallback, "num_ctas": p.timeline.plan.num_ctas, "makespan": p.makespan,
                   "bubble_fraction": p.bubble_fraction, "wait_fraction": p.wait_fraction,
                   "speedup_over_ascending": base / p.makespan, "auto": p.schedule == pick}
            if shape.pack:
                plan = p.timeline.plan
                row.update(grid_kind=plan.grid_kind, portable=plan.portable,
                           sequence_schedules=list(plan.sequence_schedules),
                           sequence_portable=list(plan.sequence_portable))
            rows.append(row)
        print(json.dumps({**shape.fields, "sms": args.sms, "sm_margin": args.sm_margin, "grid": grid, "c": c,
                          "r": r, "unit": "ns" if default else "cost units",
                          "auto": {"schedule": pick, "reason": reason}, "schedules": rows}, indent=2))
    else:
        unit = "us" if default else "units"
        header = [shape.header[0] + f"grid {grid} = {args.sms} SMs - margin {args.sm_margin}",
                  f"per step: compute c={c:g}, reduce r={r:g} {'ns ' if default else ''}(r/c={r / c:.3f}); "
                  f"idle = waits + CTAs done early, over grid x makespan"]
        print(_table(predictions, pick, reason, shape.notes, header, unit, shape.pack))
    if args.png:
        # One axis for all panels, in the table's unit, so the speed-up between schedules shows as bar length.
        scale, unit, short = (1e3, "µs", "µs") if default else (1.0, "model time units", "units")
        titles = [f"{p.schedule}" + (f" (runs {p.schedule_used})" if not p.valid else "")
                  + f": makespan {p.makespan / scale:.5g} {short}, {base / p.makespan:.3f}x vs ascending, "
                  + f"idle {p.bubble_fraction:.1%}, waits {p.wait_fraction:.1%}"
                  + ("  [auto]" if p.schedule == pick else "") for p in predictions]
        heading = (f"{shape.heading}grid {grid} ({args.sms} SMs - margin {args.sm_margin}); schedule model, "
                   f"c={c:g} r={r:g}{' ns' if default else ''} per step")
        try:
            draw_gantt([p.timeline for p in predictions], titles, args.png, heading, args.max_ctas, unit, scale)
        except OSError as err:  # probed before the simulation, so only a late failure (disk full, directory removed)
            _png_error(parser, f"cannot write {args.png!r} ({err.strerror or err})")
        if not args.json:
            print(f"wrote {args.png}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flash-attn-dash`` console script; returns the exit status."""
    parser, plan = _parsers()
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    if args.command == "cad-plan":
        return cad_cli.run(args)
    return _plan(args, plan)


if __name__ == "__main__":
    sys.exit(main())
