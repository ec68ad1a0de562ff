"""Write README.md's "Measured results" section from the newest committed attention benchmark JSON.

    python benchmarks/update_readme.py [RESULT.json]

The section sits between <!-- results:begin --> and <!-- results:end -->; every number in it comes from the
named JSON file: ours, FlashAttention-4 and cuDNN measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
BWD = [("dash", "ours non-det"), ("dash-det", "ours det `auto`"), ("fa4", "FA4 non-det"), ("fa4-det", "FA4 det"),
       ("sdpa-cudnn", "cuDNN non-det")]
FWD = [("dash", "ours"), ("fa4", "FA4"), ("sdpa-cudnn", "cuDNN")]
# (label, numerator (impl, pass), denominator (impl, pass)) of the ratio table
RATIOS = [("bwd det `auto` / FA4 det", ("dash-det", "bwd"), ("fa4-det", "bwd")),
          ("bwd det `auto` / FA4 non-det", ("dash-det", "bwd"), ("fa4", "bwd")),
          ("bwd non-det / FA4 non-det", ("dash", "bwd"), ("fa4", "bwd")),
          ("fwd / FA4", ("dash", "fwd"), ("fa4", "fwd"))]


def newest_attn_json(results: Path) -> Path:
    runs = sorted(results.glob("*-attn*.json"), key=lambda p: json.loads(p.read_text())["meta"]["date"])
    if not runs:
        raise SystemExit(f"no *-attn*.json in {results}")
    return runs[-1]


def _tflops(row: dict | None, pass_: str) -> float | None:
    if row is None or row.get("status") != "ok" or not row.get(pass_):
        return None
    return row[pass_]["tflops"]


def _cell(row: dict | None, pass_: str) -> str:
    tf = _tflops(row, pass_)
    if tf is None:
        return "–"
    star = "*" if pass_ == "bwd" and row.get("bitwise_repeat") else ""
    return f"{tf:.0f}{star}"


def _label(s: int) -> str:
    return f"{s // 1024}k" if s >= 1024 else str(s)


def section(doc: dict, json_name: str) -> str:
    """The README's results section: every number from one run (``json_name``), ours beside FA4 and cuDNN."""
    rows = {(r["impl"], r["hdim"], r["mask"], r["seqlen"]): r for r in doc["rows"]}
    present = {r["impl"] for r in doc["rows"] if r.get("status") == "ok"}
    seqlens = sorted({r["seqlen"] for r in doc["rows"]})
    hdims = sorted({r["hdim"] for r in doc["rows"]})
    head = "| hdim | mask | implementation | " + " | ".join(_label(s) for s in seqlens) + " |"
    rule = "|" + "---|" * (3 + len(seqlens))
    meta = doc["meta"]
    lines = [f"One H200, one run: `benchmarks/results/{json_name}` ({meta.get('date', '?')[:10]}, commit "
             f"{str(meta.get('git_commit', '?'))[:7]}, FlashAttention-4 {meta.get('flash_attn_4') or 'not installed'}; "
             "bf16, 16k tokens, hidden 2048; TFLOP/s; `*` = bit-identical gradients over 5 repeats).", "",
             "Backward:", "", head, rule]
    for pass_, impls in (("bwd", BWD), ("fwd", FWD)):
        if pass_ == "fwd":
            lines += ["", "Forward:", "", head, rule]
        for hdim in hdims:
            for mask in ("full", "causal"):
                for impl, label in impls:
                    if impl in present:
                        cells = [_cell(rows.get((impl, hdim, mask, s)), pass_) for s in seqlens]
                        lines.append(f"| {hdim} | {mask} | {label} | " + " | ".join(cells) + " |")
    if "fa4" in present:
        lines += ["", "Ratios to FlashAttention-4 (same run; > 1 means we are faster):", "", head.replace(
            "implementation", "ratio"), rule]
        for hdim in hdims:
            for mask in ("full", "causal"):
                for label, (ni, npass), (di, dpass) in RATIOS:
                    cells = []
                    for s in seqlens:
                        n, d = _tflops(rows.get((ni, hdim, mask, s)), npass), _tflops(rows.get((di, hdim, mask, s)), dpass)
                        cells.append(f"{n / d:.3f}" if n and d else "–")
                    lines.append(f"| {hdim} | {mask} | {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Full tables, charts and the determinism tax: `benchmarks/results/{Path(json_name).stem}.md`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", nargs="?", help="attention JSON (default: the newest in benchmarks/results)")
    args = ap.parse_args(argv)
    path = Path(args.result) if args.result else newest_attn_json(ROOT / "benchmarks" / "results")
    doc = json.loads(path.read_text())
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md lacks the {BEGIN} / {END} markers")
    pre, rest = text.split(BEGIN, 1)
    _, post = rest.split(END, 1)
    readme.write_text(pre + BEGIN + "\n" + section(doc, path.name) + "\n" + END + post)
    print(f"README.md results section written from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
