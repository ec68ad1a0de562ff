#!/usr/bin/env python
"""Turn bench_attn.py / bench_block.py JSON into Markdown tables and PNG charts.

For RESULT.json it writes, next to the JSON (or into --outdir):
  attn:  RESULT.md (bwd table per hdim x mask like h200-baselines.md, a fwd table, the
         determinism tax, checks/failures), RESULT.png (TFLOP/s vs seqlen, fwd and bwd rows,
         one column per hdim x mask, one line per implementation) and RESULT-tax.png
         (1 - best deterministic of ours / best non-deterministic of all, per grid point);
  block: RESULT.md (step time per model, relative to SDPA) and RESULT.png.
--baseline adds the 2026-11-30 H200 reference numbers (benchmarks/h200_baselines.json, or
--baseline-file PATH) as dashed lines / italic table rows. Needs matplotlib only for the PNGs (--no-png skips them);
torch is not needed.
"""

from __future__ import annotations

import argparse
import os
import sys


if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common as bc  # noqa: E402
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BASELINE = os.path.join(HERE, "h200_baselines.json")
DEFAULT_REF_ROWS = {"bwd": ["FA3 det", "FA4 det", "best deterministic", "best non-deterministic"],
                    "fwd": ["FA3", "cuDNN"]}


# --------------------------------------------------------------------------- baseline
def load_baseline(path: str) -> dict:
    import json
    with open(path) as f:
        return json.load(f)


def baseline_series(base: dict, pass_: str, hdim: int, mask: str, names=None) -> dict:
    """{impl name: {seqlen: (tflops, bitwise)}} for one table of the reference document."""
    out = {}
    for r in base.get("rows", []):
        if r["pass"] != pass_ or int(r["hdim"]) != int(hdim) or r["mask"] != mask:
            continue
        if names is not None and r["impl"] not in names:
            continue
        out[r["impl"]] = {int(s): (v, bool(r.get("bitwise", {}).get(s)))
                          for s, v in r["tflops"].items()}
    if names is not None:  # keep the requested order
        out = {n: out[n] for n in names if n in out}
    return out


def baseline_tax(base: dict, hdim: int, mask: str, det_name: str) -> dict:
    """{seqlen: 1 - det_name / best non-deterministic} from the reference backward table."""
    s = baseline_series(base, "bwd", hdim, mask)
    det, best = s.get(det_name), s.get("best non-deterministic")
    if not det or not best:
        return {}
    return {k: 1.0 - det[k][0] / best[k][0] for k in det if k in best and best[k][0] > 0}


# --------------------------------------------------------------------------- markdown
def header_md(doc: dict, title: str) -> str:
    m = doc.get("meta", {})
    commit = m.get("git_commit") or "unknown"
    if m.get("git_dirty"):
        commit += " (uncommitted changes)"
    if m.get("git_branch"):
        commit += f" on {m['git_branch']}"
    lines = [f"# {title}", "",
             f"- date: {m.get('date', '?')}" + (f" (finished {m['finished']})"
                                                if m.get("finished") else ""),
             f"- GPU: {m.get('gpu', '?')}, {m.get('sm_count', '?')} SMs, "
             f"sm {m.get('compute_capability', '?')}, driver {m.get('driver', '?')}",
             f"- torch {m.get('torch', '?')}, CUDA {m.get('cuda', '?')}, "
             f"cuDNN {m.get('cudnn', '?')}",
             f"- flash_attn_dash {m.get('flash_attn_dash') or '?'} "
             f"(kernels available: {m.get('flash_attn_dash_kernels')}), "
             f"FlashAttention-4 {m.get('flash_attn_4') or 'not installed'}",
             f"- git commit: {commit}",
             f"- command: `{m.get('command', '?')}`"]
    if not doc.get("complete", True):
        lines.append(f"- **INCOMPLETE RUN**: {doc.get('exit_reason') or 'did not finish'}")
    return "\n".join(lines)


def _fmt_best(b) -> str:
    if b is None:
        return "-"
    v, _, row = b
    return f"**{v:.0f}{'*' if row.get('bitwise_repeat') else ''}**"


def attn_markdown(doc: dict, base: dict = None, ref_rows=None, title=None) -> str:
    rows = doc["rows"]
    groups = bc.group_attn(rows)
    cfg = doc.get("config", {})
    parts = [header_md(doc, title or "flash-attn-dash attention benchmark"), "",
             f"{cfg.get('dtype', 'bf16')}, {cfg.get('tokens', bc.TOKENS_PER_BATCH)} tokens per "
             f"batch (batch = tokens/seqlen), hidden {cfg.get('hidden', bc.HIDDEN)} "
             f"(heads = hidden/hdim). TFLOP/s: fwd = 4·b·h·s²·d (halved for causal), "
             f"bwd = 2.5 × fwd, median of {cfg.get('iters', '?')} timed calls (CUDA events) "
             f"after {cfg.get('warmup', '?')} warm-ups, inputs rotated over {cfg.get('sets', '?')} "
             "sets; bwd = the whole `torch.autograd.grad` call. "
             f"`*` = dq/dk/dv bit-identical over {cfg.get('repeats', '?')} repeated backwards, "
             "`!` = correctness check failed, `–` = skipped, err/oom/hang = failed "
             "(see the end)."]
    ref_rows = ref_rows or DEFAULT_REF_ROWS
    for (hdim, mask), g in groups.items():
        seq = g["seqlens"]
        hdr = ["implementation"] + [bc.seqlen_label(s) for s in seq]
        body = [[g["labels"][i]] + [bc.attn_cell(g["rows"].get((i, s)), "bwd") for s in seq]
                for i in g["impls"]]
        body.append(["**best deterministic (ours)**"] +
                     [_fmt_best(bc.best_tflops(g, s, "bwd", bc.is_ours_det)) for s in seq])
        body.append(["**best deterministic (all)**"] +
                     [_fmt_best(bc.best_tflops(g, s, "bwd", bc.is_det)) for s in seq])
        body.append(["**best non-deterministic (all)**"] +
                     [_fmt_best(bc.best_tflops(g, s, "bwd", bc.is_nondet)) for s in seq])
        tax = [bc.determinism_tax(g, s) for s in seq]
        body.append(["determinism tax (ours)"] +
                     ["-" if t is None else f"{100 * t:.1f}%" for t in tax])
        if base:
            for name, ser in baseline_series(base, "bwd", hdim, mask, ref_rows["bwd"]).items():
                if not any(s in ser for s in seq):
                    continue
                body.append([f"_ref {base.get('measured', '')}: {name}_"] +
                            [(f"_{ser[s][0]:.0f}{'*' if ser[s][1] else ''}_" if s in ser else "")
                             for s in seq])
        parts += ["", f"## Backward, hdim {hdim}, {mask} mask (TFLOP/s)", "",
                  bc.md_table(hdr, body)]

    seq_all = sorted({s for g in groups.values() for s in g["seqlens"]})
    hdr = ["implementation", "hdim", "mask"] + [bc.seqlen_label(s) for s in seq_all]
    body = []
    for (hdim, mask), g in groups.items():
        for i in g["impls"]:
            cells = [bc.attn_cell(g["rows"].get((i, s)), "fwd") for s in seq_all]
            if any(c not in ("", "–") for c in cells):
                body.append([g["labels"][i], hdim, mask] + cells)
        if base:
            for name, ser in baseline_series(base, "fwd", hdim, mask, ref_rows["fwd"]).items():
                if not any(s in ser for s in seq_all):
                    continue
                body.append([f"_ref: {name}_", hdim, mask] +
                            [(f"_{ser[s][0]:.0f}_" if s in ser else "") for s in seq_all])
    parts += ["", "## Forward (TFLOP/s, 4·b·h·s²·d, halved for causal)", "",
              bc.md_table(hdr, body)]

    hdr = ["hdim", "mask", "series"] + [bc.seqlen_label(s) for s in seq_all]
    body = []
    for (hdim, mask), g in groups.items():
        cells = []
        for s in seq_all:
            t = bc.determinism_tax(g, s) if s in g["seqlens"] else None
            cells.append("-" if t is None else f"{100 * t:.1f}%")
        body.append([hdim, mask, "ours: 1 − best det (ours) / best non-det (all)"] + cells)
        if base:
            for det_name in ("FA3 det", "best deterministic"):
                bt = baseline_tax(base, hdim, mask, det_name)
                if not any(s in bt for s in seq_all):
                    continue
                body.append([hdim, mask, f"_ref: 1 − {det_name} / best non-det_"] +
                            [(f"_{100 * bt[s]:.1f}%_" if s in bt else "") for s in seq_all])
    parts += ["", "## Determinism tax (backward)", "", bc.md_table(hdr, body)]

    sched = [r for r in rows if r.get("schedule_used") and r.get("schedule") == "auto"
             and r.get("deterministic")]
    if sched:
        body = [[r["label"], r["hdim"], r["mask"], bc.seqlen_label(r["seqlen"]),
                 r["schedule_used"]] for r in sched]
        parts += ["", "## Schedule picked by `auto`", "",
                  bc.md_table(["implementation", "hdim", "mask", "seqlen", "schedule"], body)]

    parts += ["", "## Checks and failures", ""]
    parts += failure_lines(rows) or ["All rows ran; every correctness check passed; every "
                                     "deterministic row was bit-identical over repeats."]
    return "\n".join(parts) + "\n"


def failure_lines(rows) -> list:
    out = []
    for r in rows:
        where = f"{r.get('impl')} {r.get('model', '')}".strip()
        where += f" hdim {r.get('hdim')} {r.get('mask')} {bc.seqlen_label(r.get('seqlen') or 0)}"
        if bc.check_failed(r):
            chk = r["check"]
            det = []
            for part in ("out_slice", "small"):
                c = chk.get(part)
                if not isinstance(c, dict):
                    continue
                items = [(part, c)] if "err" in c else [
                    (f"{part}.{k}", v) for k, v in c.items() if isinstance(v, dict) and "err" in v]
                det += [f"{n}: err {v['err']:.3g} vs allowed {2 * v['err_pt'] + v['atol']:.3g}"
                        for n, v in items if not v.get("ok")]
            out.append(f"- **check FAILED** {where}: " + "; ".join(det))
        if r.get("deterministic") and r.get("bitwise_repeat") is False:
            extra = r.get("repeat_max_abs_dev") or r.get("nonbitwise")
            out.append(f"- **not bitwise reproducible** {where}: {extra}")
    groups = {}
    for r in rows:
        if r.get("status") in (None, "ok"):
            continue
        reason = (r.get("reason") or "")[:300]
        if r["status"] == "skipped" and reason.startswith("schedule "):
            continue
        key = (r.get("impl"), r.get("status"), r.get("stage"), reason)
        groups.setdefault(key, []).append(
            (f"{r['model']} " if r.get("model") else "") +
            (f"{r.get('hdim')}/{r.get('mask')}/" if not r.get("model") else "") +
            bc.seqlen_label(r.get("seqlen") or 0))
    for (impl, st, stage, reason), where in groups.items():
        at = f" at `{stage}`" if stage else ""
        out.append(f"- {impl}: {st}{at} ({', '.join(where)}): {reason}")
    return out


def block_models(rows):
    models = []
    for r in rows:
        if r.get("model") not in models:
            models.append(r.get("model"))
    return models


def block_markdown(doc: dict, title=None) -> str:
    rows = doc["rows"]
    cfg = doc.get("config", {})
    parts = [header_md(doc, title or "flash-attn-dash transformer block benchmark"), "",
             f"One decoder block, batch {cfg.get('batch', 1)}, {cfg.get('dtype', 'bf16')}: "
             "step = forward + `torch.autograd.grad` w.r.t. input and all weights, median of "
             f"{cfg.get('iters', '?')} timed steps (CUDA events). Cells: step ms, `*` = all "
             f"gradients bit-identical over {cfg.get('repeats', '?')} steps, (×) = step time "
             "relative to the first row of each table"
             + (" (SDPA, default backend)." if rows and rows[0].get("impl") == "sdpa" else ".")]
    models_cfg = cfg.get("models", {})
    for m in block_models(rows):
        rs = [r for r in rows if r.get("model") == m]
        seq = sorted({int(r["seqlen"]) for r in rs})
        impls = []
        for r in rs:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        cell = {(r["impl"], int(r["seqlen"])): r for r in rs}
        label = {r["impl"]: r.get("label", r["impl"]) for r in rs}
        hdr = ["attention"] + [bc.seqlen_label(s) for s in seq]
        body, brk = [], []
        for i in impls:
            line, bl = [label[i]], [label[i]]
            for s in seq:
                r, b0 = cell.get((i, s)), cell.get((impls[0], s))
                if r is None or not r.get("step"):
                    line.append(bc.status_cell(r) if r else "")
                    bl.append("")
                    continue
                txt = f"{r['step']['ms']:.1f}{'*' if r.get('bitwise_repeat') else ''}"
                if b0 is not r and b0 and b0.get("step"):
                    txt += f" ({r['step']['ms'] / b0['step']['ms']:.3f}×)"
                line.append(txt)
                bl.append(f"{r['fwd']['ms']:.1f} / {r['bwd_ms_est']:.1f}"
                          if r.get("fwd") and r.get("bwd_ms_est") is not None else "")
            body.append(line)
            brk.append(bl)

        def ratio(a, b, s):
            ra, rb = cell.get((a, s)), cell.get((b, s))
            if ra and rb and ra.get("step") and rb.get("step"):
                return f"{100 * (ra['step']['ms'] / rb['step']['ms'] - 1):+.1f}%"
            return "-"
        if "dash-det" in impls and "dash" in impls:
            body.append(["step cost of determinism (dash det auto vs dash non-det)"] +
                        [ratio("dash-det", "dash", s) for s in seq])
        if "dash-det" in impls and "dash-det-ascending" in impls:
            body.append(["dash det auto vs dash det ascending"] +
                        [ratio("dash-det", "dash-det-ascending", s) for s in seq])
        mc = models_cfg.get(m, {})
        desc = ", ".join(f"{k} {mc[k]}" for k in ("heads", "heads_kv", "hdim", "hidden",
                                                  "intermediate", "mlp", "norm") if k in mc)
        if mc:
            desc += ", " + ("causal" if mc.get("causal") else "full mask") + (
                ", RoPE" if mc.get("rope") else "")
        parts += ["", f"## {m} ({desc}): step ms", "", bc.md_table(hdr, body),
                  "", "fwd / bwd (step − fwd) ms:", "", bc.md_table(hdr, brk)]
    parts += ["", "## Checks and failures", ""]
    parts += failure_lines(rows) or ["All rows ran; every deterministic row was bit-identical."]
    diffs = [r for r in rows if r.get("out_max_abs_diff_vs_ref") is not None]
    if diffs:
        parts += ["", "Max |out − out_ref| / |dx − dx_ref| against the SDPA row of the same "
                      "shape (bf16 noise expected): " + "; ".join(
                          f"{r['model']} {bc.seqlen_label(r['seqlen'])} {r['impl']}: "
                          f"{r['out_max_abs_diff_vs_ref']:.2e} / {r['dx_max_abs_diff_vs_ref']:.2e}"
                          for r in diffs)]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- charts
STYLE_FAMILY = {"dash": dict(ls="-", marker="o", lw=2.0),
                "sdpa": dict(ls="-", marker="s", lw=1.2),
                "fa4": dict(ls="-", marker="^", lw=1.2)}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


IMPL_COLORS = {"dash": "tab:blue", "dash-det": "tab:red", "dash-det-ascending": "tab:orange",
               "dash-det-descending": "tab:olive", "dash-det-shift": "tab:green",
               "dash-det-symshift": "tab:purple", "sdpa-cudnn": "tab:brown",
               "sdpa-flash": "tab:pink", "sdpa-efficient": "tab:gray", "sdpa": "tab:brown",
               "sdpa-flash-det": "tab:cyan", "sdpa-efficient-det": "darkgray",
               "fa4": "black", "fa4-det": "dimgray"}
REF_STYLES = [dict(ls="--", color="0.25"), dict(ls="-.", color="0.45"),
              dict(ls=":", color="0.1", lw=1.6), dict(ls=(0, (6, 2, 1, 2, 1, 2)), color="0.6")]


def _impl_colors(keys):
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    return {k: IMPL_COLORS.get(k, cmap(i % 20)) for i, k in enumerate(keys)}


def _seq_axis(ax, seqlens):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqlens)
    ax.set_xticklabels([bc.seqlen_label(s) for s in seqlens])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def plot_attn(doc: dict, png: str, tax_png: str, base: dict = None, ref_rows=None,
              title: str = "") -> list:
    plt = _plt()
    groups = bc.group_attn(doc["rows"])
    if not groups:
        return []
    ref_rows = ref_rows or DEFAULT_REF_ROWS
    keys = []
    for g in groups.values():
        keys += [k for k in g["impls"] if k not in keys]
    colors = _impl_colors(keys)
    fams = {r["impl"]: r.get("family", "") for r in doc["rows"]}
    ncol = len(groups)
    fig, axes = plt.subplots(2, ncol, figsize=(4.2 * ncol, 7.5), squeeze=False)
    handles = {}
    for c, ((hdim, mask), g) in enumerate(groups.items()):
        for r_, pass_ in enumerate(("fwd", "bwd")):
            ax = axes[r_][c]
            for k in g["impls"]:
                pts = [(s, bc.row_tflops(g["rows"][(k, s)], pass_)) for s in g["seqlens"]
                       if (k, s) in g["rows"]]
                pts = [(s, v) for s, v in pts if v is not None]
                if not pts:
                    continue
                st = STYLE_FAMILY.get(fams.get(k), dict(ls="-", marker="x", lw=1.0))
                (h,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[k],
                               ms=4, label=g["labels"][k], **st)
                handles.setdefault(g["labels"][k], h)
            if base:
                ser = baseline_series(base, pass_, hdim, mask, ref_rows[pass_])
                for j, (name, vals) in enumerate(ser.items()):
                    xs = sorted(vals)
                    st = dict(dict(lw=1.2), **REF_STYLES[j % len(REF_STYLES)])
                    (h,) = ax.plot(xs, [vals[x][0] for x in xs], label=f"ref: {name}", **st)
                    handles.setdefault(f"ref {pass_}: {name}", h)
            _seq_axis(ax, g["seqlens"])
            ax.set_title(f"{pass_} · hdim {hdim} · {mask}", fontsize=10)
            if c == 0:
                ax.set_ylabel(f"{pass_} TFLOP/s")
            ax.set_ylim(bottom=0)
    fig.suptitle(title or "attention throughput", fontsize=12)
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
               ncol=min(5, max(1, len(handles))), fontsize=8, frameon=False)
    nrow_leg = (len(handles) + 4) // 5
    fig.tight_layout(rect=(0, 0.035 * nrow_leg + 0.02, 1, 0.96))
    fig.savefig(png, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, ncol, figsize=(4.2 * ncol, 4.0), squeeze=False)
    for c, ((hdim, mask), g) in enumerate(groups.items()):
        ax = axes[0][c]
        seq = g["seqlens"]
        series = [("ours (best det / best non-det)",
                   {s: bc.determinism_tax(g, s) for s in seq}, "tab:blue", None)]
        if base:
            for det_name, col in (("FA3 det", "tab:gray"), ("best deterministic", "silver")):
                series.append((f"ref: {det_name}", baseline_tax(base, hdim, mask, det_name),
                               col, "//"))
        width = 0.8 / len(series)
        for j, (name, vals, col, hatch) in enumerate(series):
            xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(seq))]
            ys = [100 * vals[s] if vals.get(s) is not None else 0.0 for s in seq]
            ax.bar(xs, ys, width=width, color=col, hatch=hatch, edgecolor="black", lw=0.4,
                   label=name)
            for x, s, y in zip(xs, seq, ys):
                if vals.get(s) is None:
                    ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(seq)))
        ax.set_xticklabels([bc.seqlen_label(s) for s in seq])
        ax.set_title(f"hdim {hdim} · {mask}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if c == 0:
            ax.set_ylabel("determinism tax, % of best non-det bwd")
            hl = ax.get_legend_handles_labels()
    fig.suptitle("determinism tax: 1 − best deterministic (ours) / best non-deterministic (all)",
                 fontsize=11)
    fig.legend(*hl, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 0.94))
    fig.savefig(tax_png, dpi=120)
    plt.close(fig)
    return [png, tax_png]


def plot_block(doc: dict, png: str, title: str = "") -> list:
    plt = _plt()
    rows = doc["rows"]
    models = block_models(rows)
    if not models:
        return []
    keys = []
    for r in rows:
        if r["impl"] not in keys:
            keys.append(r["impl"])
    colors = _impl_colors(keys)
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4.2), squeeze=False)
    handles = {}
    for c, m in enumerate(models):
        ax = axes[0][c]
        rs = [r for r in rows if r.get("model") == m]
        seq = sorted({int(r["seqlen"]) for r in rs})
        ref = {int(r["seqlen"]): r["step"]["ms"] for r in rs
               if r["impl"] == keys[0] and r.get("step")}
        for k in keys:
            pts = [(int(r["seqlen"]), r["step"]["ms"] / ref[int(r["seqlen"])]) for r in rs
                   if r["impl"] == k and r.get("step") and int(r["seqlen"]) in ref]
            if not pts:
                continue
            pts.sort()
            lab = next(r.get("label", k) for r in rs if r["impl"] == k)
            st = STYLE_FAMILY.get(next(r.get("family") for r in rs if r["impl"] == k), {})
            (h,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[k], ms=4,
                           label=lab, **st)
            handles.setdefault(lab, h)
        _seq_axis(ax, seq)
        ax.set_title(m, fontsize=10)
        if c == 0:
            first = next((r.get("label") for r in rows if r["impl"] == keys[0]), keys[0])
            ax.set_ylabel(f"step time / {first} (lower is better)")
    fig.suptitle(title or "transformer block fwd+bwd step time", fontsize=12)
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
               ncol=min(5, max(1, len(handles))), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 0.94))
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return [png]


# --------------------------------------------------------------------------- driver
def process(path: str, outdir: str = None, baseline: str = None, png: bool = True,
            ref_rows=None) -> dict:
    """Write the .md (and PNGs) for one result JSON; returns {'md': path, 'png': [...]}."""
    doc = bc.load_results(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    outdir = outdir or os.path.dirname(os.path.abspath(path))
    os.makedirs(outdir, exist_ok=True)
    base = load_baseline(baseline) if baseline else None
    out = dict(md=os.path.join(outdir, stem + ".md"), png=[], warnings=[])
    kind = doc.get("kind")
    if kind == "attn":
        md = attn_markdown(doc, base, ref_rows, title=f"Attention benchmark: {stem}")
    elif kind == "block":
        md = block_markdown(doc, title=f"Transformer block benchmark: {stem}")
    else:
        raise ValueError(f"{path}: unknown kind {kind!r}")
    with open(out["md"], "w") as f:
        f.write(md)
    if png:
        try:
            if kind == "attn":
                out["png"] = plot_attn(doc, os.path.join(outdir, stem + ".png"),
                                       os.path.join(outdir, stem + "-tax.png"), base, ref_rows,
                                       title=stem)
            else:
                out["png"] = plot_block(doc, os.path.join(outdir, stem + ".png"), title=stem)
        except ImportError as e:
            out["warnings"].append(f"no PNG: matplotlib unavailable ({e})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="plot.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="result JSON file(s) from bench_attn/bench_block")
    p.add_argument("--outdir", help="write here instead of next to each JSON")
    p.add_argument("--baseline", action="store_true",
                   help="add the 2026-11-30 H200 reference rows (benchmarks/h200_baselines.json)")
    p.add_argument("--baseline-file", metavar="PATH",
                   help="reference rows from another file (implies --baseline)")
    p.add_argument("--baseline-rows", metavar="LIST",
                   help="reference rows to show, comma separated (default bwd: "
                        f"{', '.join(DEFAULT_REF_ROWS['bwd'])}; fwd: "
                        f"{', '.join(DEFAULT_REF_ROWS['fwd'])})")
    p.add_argument("--no-png", action="store_true", help="Markdown only")
    p.add_argument("--print", action="store_true", help="print the Markdown to stdout")
    args = p.parse_args(argv)
    ref_rows = None
    if args.baseline_rows:
        names = bc.parse_list([args.baseline_rows])
        ref_rows = {"bwd": names, "fwd": names}
    baseline = args.baseline_file or (DEFAULT_BASELINE if args.baseline else None)
    rc = 0
    for path in args.json:
        try:
            out = process(path, args.outdir, baseline, not args.no_png, ref_rows)
        except Exception as e:  # keep going with the other files
            print(f"plot.py: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
            continue
        for w in out["warnings"]:
            print(f"plot.py: {path}: {w}", file=sys.stderr)
        print(f"wrote {out['md']}" + "".join(f"\nwrote {x}" for x in out["png"]))
        if args.print:
            with open(out["md"]) as f:
                print("\n" + f.read())
    return rc


if __name__ == "__main__":
    sys.exit(main())
