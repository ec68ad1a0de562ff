#!/usr/bin/env python
"""One transformer block, forward + backward, with a pluggable attention (flash-attn-dash
benchmarks).

Block (torch.nn.Module `Block`): norm -> fused QKV projection -> RoPE -> attention ->
output projection -> residual -> norm -> MLP -> residual. Shapes:
  llama3-8b   h 32, kv 8, d 128, hidden 4096, SwiGLU 14336, RMSNorm, RoPE, causal
  qwen2.5-7b  h 28, kv 4, d 128, hidden 3584, SwiGLU 18944, RMSNorm, RoPE, QKV bias, causal
  vit-2048    h 16, kv 16, d 128, hidden 2048, GELU MLP 8192, LayerNorm, no RoPE, full mask
batch 1, seqlen 4k/8k/16k/32k, bf16. The attention function receives (b, s, h, d) q and
(b, s, h_kv, d) k/v: GQA goes natively to flash_attn_dash / FA4, and to SDPA through
repeat_interleave (default) or enable_gqa (--sdpa-gqa native).

Timed (CUDA events, median of --iters >= 20 after --warmup, inputs rotated among --sets):
  fwd:  out = block(x)   (x and the weights require grad)
  step: out = block(x); torch.autograd.grad(out, [x] + weights, dout)   (forward + backward)
  bwd_ms_est = step - fwd.
Each row also records whether all gradients were bit-identical over --repeats steps and the
max |out - out_sdpa| and |dx - dx_sdpa| against the SDPA row of the same shape.
Exit codes as bench_attn.py (0 ok, 1 harness/--strict, 2 no CUDA, 3 aborted).
"""

from __future__ import annotations

import argparse
import os
import sys


if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common as bc  # noqa: E402
PROG = "bench_block.py"

MODELS = {
    "llama3-8b": dict(hidden=4096, heads=32, heads_kv=8, hdim=128, intermediate=14336,
                      causal=True, mlp="swiglu", norm="rms", rope=True, qkv_bias=False,
                      rope_theta=500000.0),
    "qwen2.5-7b": dict(hidden=3584, heads=28, heads_kv=4, hdim=128, intermediate=18944,
                       causal=True, mlp="swiglu", norm="rms", rope=True, qkv_bias=True,
                       rope_theta=1000000.0),
    "vit-2048": dict(hidden=2048, heads=16, heads_kv=16, hdim=128, intermediate=8192,
                     causal=False, mlp="gelu", norm="layer", rope=False, qkv_bias=True,
                     rope_theta=None),
    # harness self-tests only (not in the default list)
    "tiny-gqa": dict(hidden=256, heads=4, heads_kv=2, hdim=64, intermediate=512, causal=True,
                     mlp="swiglu", norm="rms", rope=True, qkv_bias=True, rope_theta=10000.0),
    "tiny-vit": dict(hidden=256, heads=4, heads_kv=4, hdim=64, intermediate=512, causal=False,
                     mlp="gelu", norm="layer", rope=False, qkv_bias=True, rope_theta=None),
}
DEFAULT_MODELS = ["llama3-8b", "qwen2.5-7b", "vit-2048"]
BLOCK_SEQLENS = [4096, 8192, 16384, 32768]
BLOCK_IMPLS = ["dash-det", "dash-det-ascending", "dash", "fa4-det", "fa4", "sdpa"]
QUICK_MODELS = ["llama3-8b"]
QUICK_SEQLENS = [8192]
REF_IMPL = "sdpa"


def build_block(cfg: dict, attn_fn, seqlen: int, device, dtype):
    """Construct the Block module (kept in a function so torch is imported lazily)."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            if hasattr(F, "rms_norm"):
                return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight.float()).to(x.dtype)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Block(nn.Module):
        """Pre-norm transformer block; attn_fn(q, k, v, causal) on (b, s, h, d) tensors."""

        def __init__(self):
            super().__init__()
            c = cfg
            self.h, self.hk, self.d = c["heads"], c["heads_kv"], c["hdim"]
            self.causal = c["causal"]
            self.attn_fn = attn_fn
            hidden, inter = c["hidden"], c["intermediate"]
            norm = (lambda: RMSNorm(hidden)) if c["norm"] == "rms" else (lambda: nn.LayerNorm(hidden))
            self.norm1, self.norm2 = norm(), norm()
            self.qkv = nn.Linear(hidden, (self.h + 2 * self.hk) * self.d, bias=c["qkv_bias"])
            self.o_proj = nn.Linear(self.h * self.d, hidden, bias=c["mlp"] == "gelu")
            self.mlp_kind = c["mlp"]
            if c["mlp"] == "swiglu":
                self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
                self.down = nn.Linear(inter, hidden, bias=False)
            else:
                self.fc1 = nn.Linear(hidden, inter, bias=True)
                self.fc2 = nn.Linear(inter, hidden, bias=True)
            if c["rope"]:
                inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, self.d, 2).float() / self.d))
                ang = torch.outer(torch.arange(seqlen).float(), inv)
                emb = torch.cat((ang, ang), dim=-1)  # (s, d)
                self.register_buffer("cos", emb.cos()[None, :, None, :], persistent=False)
                self.register_buffer("sin", emb.sin()[None, :, None, :], persistent=False)
            else:
                self.cos = self.sin = None
            self.contiguous_qkv = True

        def rope(self, x):
            s = x.shape[1]
            return x * self.cos[:, :s] + rotate_half(x) * self.sin[:, :s]

        def forward(self, x):
            b, s, _ = x.shape
            y = self.norm1(x)
            qkv = self.qkv(y).view(b, s, self.h + 2 * self.hk, self.d)
            q, k, v = qkv.split([self.h, self.hk, self.hk], dim=2)
            if self.cos is not None:
                q, k = self.rope(q), self.rope(k)
            if self.contiguous_qkv:
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            a = self.attn_fn(q, k, v)
            x = x + self.o_proj(a.reshape(b, s, self.h * self.d))
            y = self.norm2(x)
            if self.mlp_kind == "swiglu":
                gate, up = self.gate_up(y).chunk(2, dim=-1)
                y = self.down(F.silu(gate) * up)
            else:
                y = self.fc2(F.gelu(self.fc1(y), approximate="tanh"))
            return x + y

    torch.manual_seed(0)
    with torch.device(device):  # initialise directly on the GPU (fast)
        blk = Block()
    blk = blk.to(dtype=dtype)
    if blk.cos is not None:
        blk.cos, blk.sin = blk.cos.to(dtype), blk.sin.to(dtype)
    return blk


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", metavar="LIST",
                   help=f"models (comma separated): {', '.join(MODELS)} "
                        f"(default {','.join(DEFAULT_MODELS)})")
    p.add_argument("--seqlen", action="append", metavar="LIST",
                   help="sequence lengths (default 4k,8k,16k,32k)")
    p.add_argument("--impl", action="append", metavar="LIST",
                   help=f"attention implementations (default {','.join(BLOCK_IMPLS)}); any key "
                        f"of bench_attn.py works ({', '.join(bc.IMPLS)})")
    p.add_argument("--quick", action="store_true",
                   help="llama3-8b at 8k only, --budget-s 40 unless given")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--iters", type=int, default=bc.DEFAULT_ITERS,
                   help=f"timed iterations (>= {bc.MIN_ITERS})")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=2, help="input sets rotated between calls")
    p.add_argument("--repeats", type=int, default=bc.DEFAULT_REPEATS,
                   help="steps compared bitwise (default 5)")
    p.add_argument("--pad-us", type=float, default=1000.0)
    p.add_argument("--sm-margin", type=int, default=0)
    p.add_argument("--sdpa-gqa", choices=["repeat", "native"], default="repeat",
                   help="how SDPA gets GQA: repeat_interleave k/v (default) or enable_gqa=True")
    p.add_argument("--no-contiguous", action="store_true",
                   help="pass q/k/v as views of the fused QKV output (default: .contiguous())")
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--row-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--strict", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    return p


def plan(args):
    models = bc.parse_list(args.model)
    seqlens = bc.parse_list(args.seqlen, bc.parse_seqlen)
    if args.quick:
        models = models or QUICK_MODELS
        seqlens = seqlens or QUICK_SEQLENS
        if args.budget_s is None:
            args.budget_s = 40.0
    models = models or DEFAULT_MODELS
    seqlens = seqlens or BLOCK_SEQLENS
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"{PROG}: unknown model {m!r}; known: {', '.join(MODELS)}")
    if args.iters < bc.MIN_ITERS:
        raise SystemExit(f"{PROG}: --iters must be >= {bc.MIN_ITERS}")
    if args.sets < 1 or args.repeats < 2:
        raise SystemExit(f"{PROG}: --sets >= 1 and --repeats >= 2 required")
    try:
        impls = bc.select_impls(args.impl, BLOCK_IMPLS)
    except ValueError as e:
        raise SystemExit(f"{PROG}: {e}")
    # the SDPA row first: the others are compared with it
    if REF_IMPL in impls:
        impls = [REF_IMPL] + [i for i in impls if i != REF_IMPL]
    return [(m, s) for m in models for s in seqlens], impls


class BlockRunner(bc.BenchRunner):
    IMPLS = bc.IMPLS

    def __init__(self, args, writer, watchdog, budget):
        super().__init__(args, writer, watchdog, budget)
        self.ref = None  # the reference row's output and dx for the shape (REF_IMPL runs first)

    def make_inputs(self, shape):
        """Block (same weights for every implementation) and the rotated input sets; the shape's reference row is
        still to come."""
        model, seqlen = shape
        self.ref = None
        torch, args = self.torch, self.args
        cfg = MODELS[model]
        blk = build_block(cfg, None, seqlen, self.dev, self.dtype)
        blk.contiguous_qkv = not args.no_contiguous
        gen = torch.Generator(device=self.dev).manual_seed(args.seed)
        x_shape = (args.batch, seqlen, cfg["hidden"])
        xs = []
        for _ in range(args.sets):
            x = torch.randn(x_shape, generator=gen, device=self.dev, dtype=self.dtype)
            do = torch.randn(x_shape, generator=gen, device=self.dev, dtype=self.dtype)
            xs.append((x.requires_grad_(True), do))
        return blk, xs

    def run_row(self, impl, shape, inputs):
        torch, args = self.torch, self.args
        model, seqlen = shape
        cfg = MODELS[model]
        row = impl.describe()
        row.update(model=model, seqlen=seqlen, batch=args.batch, dtype=args.dtype,
                   heads=cfg["heads"], heads_kv=cfg["heads_kv"], hdim=cfg["hdim"],
                   hidden=cfg["hidden"], intermediate=cfg["intermediate"],
                   mask="causal" if cfg["causal"] else "full", causal=cfg["causal"],
                   status="ok", reason=None, stage=None, fwd=None, step=None, bwd_ms_est=None,
                   bitwise_repeat=None, n_repeats=None, nonbitwise=None,
                   out_max_abs_diff_vs_ref=None, dx_max_abs_diff_vs_ref=None, ref_impl=None,
                   schedule_used=None, wall_s=None)
        if self.guard(row, inputs, ours=impl.family == "dash"):
            return row
        if not impl.applies_to(row["mask"]):
            row.update(status="skipped", reason=f"schedule {impl.schedule} is for "
                       f"{'/'.join(impl.masks)} masks")
            return row
        try:
            afn = bc.make_attn_fn(impl, cfg["causal"], sm_margin=args.sm_margin,
                                  gqa=args.sdpa_gqa)
        except bc.ImplUnavailable as e:
            row.update(status="skipped", reason=str(e))
            return row
        blk, xs = inputs
        ctx = (lambda: bc.torch_deterministic(True)) if impl.torch_deterministic else (
            lambda: _NULL)
        fl = bc.block_flops(cfg, args.batch, seqlen)
        blk.attn_fn = afn
        params = [p for _, p in blk.named_parameters()]
        names = ["x"] + [n for n, _ in blk.named_parameters()]
        n = len(xs)

        def fwd(i):
            with ctx():
                blk(xs[i % n][0])

        def step(i):
            x, do = xs[i % n]
            with ctx():
                out = blk(x)
                return out, torch.autograd.grad(out, [x] + params, do)

        def body(stage):
            out0, first = step(0)
            bc.sync()
            ref = self.ref
            if ref is not None:
                row["ref_impl"] = ref["impl"]
                row["out_max_abs_diff_vs_ref"] = (out0.float() - ref["out"].float()).abs().max().item()
                row["dx_max_abs_diff_vs_ref"] = (first[0].float() - ref["dx"].float()).abs().max().item()
            elif impl.key == REF_IMPL:
                self.ref = dict(impl=impl.key, out=out0.detach(), dx=first[0].detach())
            out0 = None

            stage.name = "repeat"
            equal, diff = True, set()
            for _ in range(args.repeats - 1):
                _, g = step(0)
                for nm, a, b in zip(names, g, first):
                    if not torch.equal(a, b):
                        equal = False
                        diff.add(nm)
                g = None
            first = None
            row.update(bitwise_repeat=equal, n_repeats=args.repeats,
                       nonbitwise=sorted(diff)[:12] or None)

            stage.name = "fwd"
            ts = bc.time_cuda(fwd, args.iters, args.warmup, args.pad_us)
            row["fwd"] = bc.summarize_ms(ts)
            row["fwd"].update(flops=fl["fwd"], tflops=bc.tflops(fl["fwd"], row["fwd"]["ms"]))
            stage.name = "step"
            ts = bc.time_cuda(lambda i: step(i), args.iters, args.warmup, args.pad_us)
            row["step"] = bc.summarize_ms(ts)
            row["step"].update(flops=fl["step"], tflops=bc.tflops(fl["step"], row["step"]["ms"]),
                               tokens_per_s=args.batch * seqlen / (row["step"]["ms"] * 1e-3))
            row["bwd_ms_est"] = row["step"]["ms"] - row["fwd"]["ms"]
            stage.name = "schedule_used"
            h, hk, d = cfg["heads"], cfg["heads_kv"], cfg["hdim"]
            if impl.family == "dash":
                q = torch.empty(args.batch, seqlen, h, d, device=self.dev, dtype=self.dtype)
                kv = torch.empty(args.batch, seqlen, hk, d, device=self.dev, dtype=self.dtype)
                row["schedule_used"] = bc.schedule_used(impl, q, kv, kv, cfg["causal"], args.sm_margin)
        self.timed(row, impl, f"{model} s={seqlen} {impl.key}", body)
        blk.attn_fn = None
        bc.free_cuda()
        return row

    def progress_line(self, row, idx, total):
        return progress_line(row, idx, total)


_NULL = __import__("contextlib").nullcontext()


def progress_line(row, idx, total):
    def t(p):
        x = row.get(p)
        return f"{x['ms']:9.2f} ms" if x else f"{'-':>12}"
    bw = {True: "yes", False: "NO", None: "-"}[row.get("bitwise_repeat")]
    extra = "" if row["status"] == "ok" else f"  [{row['status']}: {(row.get('reason') or '')[:90]}]"
    if row.get("nonbitwise"):
        extra += f"  differs: {','.join(row['nonbitwise'][:4])}"
    if row.get("out_max_abs_diff_vs_ref") is not None:
        extra += (f"  |out-ref|={row['out_max_abs_diff_vs_ref']:.2e}"
                  f" |dx-ref|={row['dx_max_abs_diff_vs_ref']:.2e}")
    return (f"[{idx:3d}/{total}] {row['model']:<11} {bc.seqlen_label(row['seqlen']):>3} "
            f"{row['label']:<22} fwd {t('fwd')}  step {t('step')}  bitwise={bw}{extra}")


def summary_text(rows):
    parts = ["", "Summary: step (fwd+bwd) ms; * = all gradients bit-identical over repeats; "
                 "in brackets: step time relative to the first implementation"]
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    for m in models:
        rs = [r for r in rows if r["model"] == m]
        seqlens = sorted({r["seqlen"] for r in rs})
        impls = []
        for r in rs:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        cell = {(r["impl"], r["seqlen"]): r for r in rs}
        body = []
        for i in impls:
            line = [next(r["label"] for r in rs if r["impl"] == i)]
            for s in seqlens:
                r = cell.get((i, s))
                base = cell.get((impls[0], s))
                if r is None or not r.get("step"):
                    line.append(bc.status_cell(r) if r else "")
                    continue
                txt = f"{r['step']['ms']:.1f}{'*' if r.get('bitwise_repeat') else ''}"
                if base and base.get("step") and base is not r:
                    txt += f" ({r['step']['ms'] / base['step']['ms']:.3f})"
                line.append(txt)
            body.append(line)
        parts += ["", bc.text_table([m] + [bc.seqlen_label(s) for s in seqlens], body)]
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        parts += ["", "Not measured:"]
        for r in bad:
            parts.append(f"  {r['model']} {bc.seqlen_label(r['seqlen'])} {r['impl']}: "
                         f"{r['status']}{' at ' + r['stage'] if r.get('stage') else ''}: "
                         f"{(r.get('reason') or '')[:160]}")
    return "\n".join(parts)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    shapes, impls = plan(args)
    if args.dry_run:
        print(f"{len(shapes)} shapes x {len(impls)} implementations = "
              f"{len(shapes) * len(impls)} rows; implementations: {', '.join(impls)}")
        for m, s in shapes:
            fl = bc.block_flops(MODELS[m], args.batch, s)
            print(f"  {m:<11} s={bc.seqlen_label(s):>3}  {MODELS[m]}  "
                  f"step {fl['step'] / 1e12:.1f} TFLOP ({100 * 3.5 * fl['attn_fwd'] / fl['step']:.0f}% attention)")
        return 0
    bc.require_cuda(PROG, has_dry_run=True)
    meta = bc.collect_metadata(sys.argv if argv is None else [PROG] + list(argv))
    config = dict(vars(args))
    config.update(models={m: MODELS[m] for m, _ in shapes}, shapes=shapes, impls=impls,
                  timing="CUDA events per call, median; fwd = block(x); step = block(x) + "
                         "torch.autograd.grad(out, [x]+weights, dout); bwd_ms_est = step - fwd",
                  flops="matmul FLOPs: linears 2*tokens*params (bwd 2x), attention 4*b*h*s^2*d "
                        "(halved for causal, bwd 2.5x)")
    writer = bc.ResultWriter(args.json, "block", meta, config)
    bc.log_run_header(PROG, meta)
    budget = bc.Budget(args.budget_s)
    _, code = bc.run_rows(lambda wd: BlockRunner(args, writer, wd, budget), (shapes, impls), writer, args,
                          budget, summary_text, dict(model="?", seqlen=0, impl="?"))
    if code is not None:
        return code
    if args.strict and any(r["status"] in ("error", "oom", "timeout") or (
            r.get("deterministic") and r.get("bitwise_repeat") is False) for r in writer.rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
