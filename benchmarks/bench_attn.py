#!/usr/bin/env python
"""Attention forward/backward throughput on the DASH grid (flash-attn-dash benchmarks).

Grid: 16,384 tokens per batch (batch = 16384/seqlen), hidden 2048 (heads = 2048/hdim),
hdim 64/128, seqlen 512..16k, full and causal masks, q/k/v/dO from torch.randn.

What is timed (CUDA events, median of --iters >= 20 calls after --warmup calls, the input set
rotated among --sets pre-made sets so the 60 MB L2 cannot hold them; a ~1 ms GPU sleep before
each call hides Python launch overhead, --pad-us 0 disables it):
  fwd: one call of the attention function (inputs require grad, so the autograd graph / LSE
       are produced as in training);
  bwd: the whole torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) call, including
       every pre/post-processing kernel; `out` comes from one forward per input set made
       outside the timed region.
TFLOP/s: fwd = 4*b*h*s^2*d (halved for causal), bwd = 2.5 x fwd.
Each row also records: bitwise_repeat (dq/dk/dv torch.equal over --repeats backwards on the
same forward), a correctness check (output slice on the real shape against an fp32
reference, and out/dq/dk/dv on a small problem, with the dash.md tolerance rule), and the
schedule `auto` picked when flash_attn_dash.backward_schedule_used exists.

Results: --json PATH (rewritten after every row: a crash leaves the finished rows), a compact
table on stdout. Exit codes: 0 done, 1 harness error or --strict failure, 2 no CUDA,
3 aborted (hang watchdog or unusable CUDA context).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys


if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common as bc  # noqa: E402
PROG = "bench_attn.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", action="append", metavar="LIST",
                   help="implementations (comma separated, repeatable): keys "
                        f"{', '.join(bc.IMPLS)}; groups {', '.join(bc.IMPL_GROUPS)}; or fnmatch "
                        "patterns like 'dash-det*'. Default: the 'default' group "
                        f"({', '.join(bc.IMPL_GROUPS['default'])})")
    p.add_argument("--hdim", action="append", metavar="LIST", help="head dims (default 64,128)")
    p.add_argument("--seqlen", action="append", metavar="LIST",
                   help="sequence lengths, e.g. 512,2k,16k (default 512..16k)")
    p.add_argument("--mask", action="append", metavar="LIST",
                   help="full, causal or full,causal (default both)")
    p.add_argument("--causal", action="store_const", const="causal", dest="mask_only",
                   help="causal mask only (same as --mask causal)")
    p.add_argument("--full", action="store_const", const="full", dest="mask_only",
                   help="full mask only (same as --mask full)")
    p.add_argument("--quick", action="store_true",
                   help="quick subset: seqlen 2k,8k, both hdims and masks, no SDPA-efficient, "
                        "--budget-s 120 unless given (repeats are NOT reduced)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--tokens", type=int, default=bc.TOKENS_PER_BATCH,
                   help="tokens per batch: batch = tokens/seqlen (default 16384)")
    p.add_argument("--hidden", type=int, default=bc.HIDDEN,
                   help="hidden size: heads = hidden/hdim (default 2048)")
    p.add_argument("--iters", type=int, default=bc.DEFAULT_ITERS,
                   help=f"timed iterations per measurement (>= {bc.MIN_ITERS})")
    p.add_argument("--warmup", type=int, default=bc.DEFAULT_WARMUP)
    p.add_argument("--sets", type=int, default=bc.DEFAULT_SETS,
                   help="input sets rotated between calls (default 3; each q/k/v/dO tensor is "
                        "64 MB on the default grid, larger than the 60 MB L2)")
    p.add_argument("--repeats", type=int, default=bc.DEFAULT_REPEATS,
                   help="backwards compared bitwise (default 5)")
    p.add_argument("--pad-us", type=float, default=1000.0,
                   help="GPU sleep before each timed call to hide launch overhead (0 = off)")
    p.add_argument("--sm-margin", type=int, default=0, help="passed to flash_attn_dash")
    p.add_argument("--all-schedules", action="store_true",
                   help="also run shift on causal and symmetric_shift on full masks")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--check-seqlen", type=int, default=1024,
                   help="max seqlen of the small gradient check problem (b=2, h=2)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: later rows are recorded as skipped (rows of "
                        "flash_attn_dash get 1.25x the budget)")
    p.add_argument("--row-timeout", type=float, default=300.0,
                   help="watchdog: a row running longer is treated as a hang -> partial JSON, "
                        "exit 3 (0 = off). Includes JIT compilation (FA4) of the first call.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write results here (JSON)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any row errored, failed its check, or a deterministic row "
                        "was not bitwise reproducible")
    p.add_argument("--dry-run", action="store_true", help="print the planned rows and exit")
    return p


def plan(args):
    seqlens = bc.parse_list(args.seqlen, bc.parse_seqlen)
    hdims = bc.parse_list(args.hdim, int) or bc.HDIMS
    masks = bc.parse_list(args.mask) or ([args.mask_only] if args.mask_only else bc.MASKS)
    default = bc.IMPL_GROUPS["default"]
    if args.quick:
        seqlens = seqlens or bc.QUICK_SEQLENS
        default = [k for k in default if k != "sdpa-efficient"]
        if args.budget_s is None:
            args.budget_s = 120.0
    seqlens = seqlens or bc.SEQLENS
    if args.iters < bc.MIN_ITERS:
        raise SystemExit(f"{PROG}: --iters must be >= {bc.MIN_ITERS} (reduce the grid instead)")
    if args.sets < 1 or args.repeats < 2:
        raise SystemExit(f"{PROG}: --sets >= 1 and --repeats >= 2 required")
    for m in masks:
        if m not in bc.MASKS:
            raise SystemExit(f"{PROG}: unknown mask {m!r} (full, causal)")
    try:
        impls = bc.select_impls(args.impl, default)
        grid = bc.attn_grid(seqlens, hdims, masks, args.tokens, args.hidden)
    except ValueError as e:
        raise SystemExit(f"{PROG}: {e}")
    return grid, impls


def shape_str(sh) -> str:
    return (f"hdim{sh['hdim']} {sh['mask']:<6} s={bc.seqlen_label(sh['seqlen']):>3} "
            f"b={sh['batch']} h={sh['heads']}")


class Runner(bc.BenchRunner):
    IMPLS = bc.IMPLS

    # ------------------------------------------------------------------ inputs
    def make_inputs(self, sh):
        torch = self.torch
        shape = (sh["batch"], sh["seqlen"], sh["heads"], sh["hdim"])
        sets = []
        for i in range(self.args.sets):
            g = torch.Generator(device=self.dev).manual_seed(self.args.seed * 1000 + i)
            mk = lambda: torch.randn(shape, generator=g, device=self.dev, dtype=self.dtype)
            q, k, v, do = mk(), mk(), mk(), mk()
            for t in (q, k, v):
                t.requires_grad_(True)
            sets.append((q, k, v, do))
        return sets

    # ------------------------------------------------------------------ checks
    def check_out_slice(self, out, q, k, v, causal):
        """Output rows [0,64) and [s-64,s) of batch 0, heads {0, h-1} vs fp32 reference."""
        torch = self.torch
        s, h = q.shape[1], q.shape[2]
        n = min(64, s)
        rows = torch.unique(torch.cat([torch.arange(n), torch.arange(s - n, s)])).to(self.dev)
        heads = torch.tensor(sorted({0, h - 1}), device=self.dev)
        with torch.no_grad():
            qs, ks, vs = (t[:1].index_select(2, heads).detach() for t in (q, k, v))
            ref = bc.attention_ref(qs, ks, vs, causal, rows=rows, upcast=True)
            pt = bc.attention_ref(qs, ks, vs, causal, rows=rows, upcast=False)
            x = out[:1].index_select(2, heads)[:, rows]
            return bc.tol_check(x, ref, pt)

    def check_grads_small(self, fn, sh, ctx):
        """out/dq/dk/dv on b=2, h=2, s=min(seqlen, --check-seqlen) vs fp32 reference."""
        torch = self.torch
        s = min(sh["seqlen"], self.args.check_seqlen)
        g = torch.Generator(device=self.dev).manual_seed(self.args.seed + 12345)
        shape = (2, s, 2, sh["hdim"])
        q, k, v, do = (torch.randn(shape, generator=g, device=self.dev, dtype=self.dtype)
                       for _ in range(4))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        with ctx():
            out = fn(*leaves)
            got = torch.autograd.grad(out, leaves, do)
        res = dict(shape=list(shape))
        refs = {}
        for name, up in (("ref", True), ("pt", False)):
            lv = [(t.float() if up else t).clone().requires_grad_(True) for t in (q, k, v)]
            o = bc.attention_ref(*lv, sh["causal"], upcast=up)
            gr = torch.autograd.grad(o, lv, do.to(o.dtype))
            refs[name] = (o.detach(),) + tuple(x.detach() for x in gr)
        for i, nm in enumerate(("out", "dq", "dk", "dv")):
            x = out.detach() if i == 0 else got[i - 1]
            res[nm] = bc.tol_check(x, refs["ref"][i], refs["pt"][i])
        res["ok"] = all(res[nm]["ok"] for nm in ("out", "dq", "dk", "dv"))
        return res

    # ------------------------------------------------------------------ one row
    def run_row(self, impl, sh, sets):
        args = self.args
        row = impl.describe()
        row.update(dtype=args.dtype, batch=sh["batch"], seqlen=sh["seqlen"], heads=sh["heads"],
                   heads_kv=sh["heads_kv"], hdim=sh["hdim"], mask=sh["mask"],
                   causal=sh["causal"], status="ok", reason=None, stage=None, fwd=None, bwd=None,
                   bitwise_repeat=None, n_repeats=None, repeat_max_abs_dev=None, check=None,
                   schedule_used=None, wall_s=None)
        if self.guard(row, sets, ours=impl.family == "dash"):
            return row
        if not impl.applies_to(sh["mask"]) and not args.all_schedules:
            row.update(status="skipped", reason=f"schedule {impl.schedule} is for "
                       f"{'/'.join(impl.masks)} masks (--all-schedules runs it anyway)")
            return row
        try:
            fn = bc.make_attn_fn(impl, sh["causal"], sm_margin=args.sm_margin)
        except bc.ImplUnavailable as e:
            row.update(status="skipped", reason=str(e))
            return row

        def ctx():
            return bc.torch_deterministic(True) if impl.torch_deterministic else NULL_CTX

        b, s, h, d = sh["batch"], sh["seqlen"], sh["heads"], sh["hdim"]
        fwd_flops = bc.attn_fwd_flops(b, h, s, s, d, sh["causal"])

        def body(stage):
            check_out = None if args.no_check else (
                lambda out, q, k, v: self.check_out_slice(out, q, k, v, sh["causal"]))
            bc.measure_fwd_bwd(row, fn, sets, args, fwd_flops, stage, check_out, ctx)
            if not args.no_check:
                stage.name = "check_grads"
                row["check"]["small"] = self.check_grads_small(fn, sh, ctx)
                row["check"]["ok"] = bool(row["check"]["ok"] and row["check"]["small"]["ok"])
            stage.name = "schedule_used"
            q, k, v, _ = sets[0]
            row["schedule_used"] = bc.schedule_used(impl, q, k, v, sh["causal"], args.sm_margin)
        self.timed(row, impl, f"{impl.key} {shape_str(sh)}", body)
        return row

    def progress_line(self, row, idx, total):
        return progress_line(row, idx, total)


NULL_CTX = contextlib.nullcontext()  # reusable, reentrant


def progress_line(row, idx, total) -> str:
    def t(p):
        x = row.get(p)
        return (f"{x['ms']:8.3f} ms {x['tflops']:6.1f} TF" if x and x.get("tflops") is not None
                else f"{'-':>20}")
    chk = row.get("check") or {}
    chk_s = {True: "ok", False: "FAIL"}.get(chk.get("ok"), "-")
    bw = {True: "yes", False: "NO", None: "-"}[row.get("bitwise_repeat")]
    extra = ""
    if row["status"] != "ok":
        extra = f"  [{row['status']}: {(row.get('reason') or '')[:90]}]"
    if row.get("schedule_used"):
        extra += f"  sched={row['schedule_used']}"
    return (f"[{idx:3d}/{total}] {row['label']:<26} hdim{row['hdim']:<3} {row['mask']:<6} "
            f"{bc.seqlen_label(row['seqlen']):>3}  fwd {t('fwd')}  bwd {t('bwd')}  "
            f"bitwise={bw:<3} check={chk_s}{extra}")


def summary_text(rows) -> str:
    """Per hdim x mask: implementations x seqlen, cells 'bwd / fwd' TFLOP/s."""
    parts = ["", "Summary: TFLOP/s as 'bwd / fwd'; * = dq/dk/dv bit-identical over repeats, "
                 "! = correctness check failed, - = skipped, err/oom/hang = failed"]
    for (hdim, mask), g in bc.group_attn(rows).items():
        hdr = [f"hdim {hdim} {mask}"] + [bc.seqlen_label(s) for s in g["seqlens"]]
        body = bc.impl_table_rows(g, g["seqlens"])
        tax = []
        for s in g["seqlens"]:
            x = bc.determinism_tax(g, s)
            tax.append("-" if x is None else f"{100 * x:.1f}%")
        body.append(["det tax (bwd)"] + tax)
        parts += ["", bc.text_table(hdr, body)]
    not_measured = [r for r in rows if r["status"] != "ok" and not (
        r["status"] == "skipped" and (r.get("reason") or "").startswith("schedule "))]
    parts += bc.problem_lines(rows, not_measured,
                              lambda r: f"hdim{r['hdim']}/{r['mask']}/{bc.seqlen_label(r['seqlen'])}")
    return "\n".join(parts)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    grid, impls = plan(args)
    if args.dry_run:
        print(f"{len(grid)} shapes x {len(impls)} implementations = {len(grid) * len(impls)} rows")
        print("implementations: " + ", ".join(impls))
        for sh in grid:
            print("  " + shape_str(sh))
        return 0
    bc.require_cuda(PROG, has_dry_run=True)
    import torch
    meta = bc.collect_metadata(sys.argv if argv is None else [PROG] + list(argv))
    cap = torch.cuda.get_device_capability() if bc.bench_device() == "cuda" else None
    if cap is not None and cap != (9, 0):
        bc.log(f"WARNING: GPU compute capability {cap} is not sm90; flash_attn_dash rows will "
               "likely be skipped")
    config = dict(vars(args))
    config.update(grid=grid, impls=impls, timing=(
        "CUDA events per call, median; fwd = one attention call (inputs require grad); bwd = "
        "torch.autograd.grad(out, (q,k,v), dout, retain_graph=True) incl. pre/post kernels; "
        "inputs rotated over `sets` sets; GPU sleep of pad_us before each call"),
        flops="fwd = 4*b*h*s^2*d (halved for causal); bwd = 2.5*fwd")
    writer = bc.ResultWriter(args.json, "attn", meta, config)
    bc.log_run_header(PROG, meta)
    bc.log(f"{len(grid)} shapes x {len(impls)} impls, iters={args.iters} warmup={args.warmup} "
           f"sets={args.sets} repeats={args.repeats} budget={args.budget_s}")
    budget = bc.Budget(args.budget_s)
    _, code = bc.run_rows(lambda wd: Runner(args, writer, wd, budget), (grid, impls), writer, args, budget,
                          summary_text, dict(impl="?", hdim=0, mask="?", seqlen=0), " (hung kernel?)")
    if code is not None:
        return code
    rows = writer.rows
    if args.strict:
        bad = [r for r in rows if r["status"] in ("error", "oom", "timeout") or bc.check_failed(r)
               or (r.get("deterministic") and r.get("bitwise_repeat") is False)]
        if bad:
            bc.log(f"--strict: {len(bad)} failing rows")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
