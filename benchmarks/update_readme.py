"""Write README.md's "Measured results" section from the newest committed attention benchmark JSON.

    python benchmarks/update_readme.py [RESULT.json]

The section sits between <!-- results:begin --> and <!-- results:end -->; every number in it comes from the
named JSON file (same run: ours and cuDNN) or from benchmarks/h200_baselines.json (reference rows, marked).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
OURS = [("dash", "ours non-det"), ("dash-det", "ours det `auto`"), ("sdpa-cudnn", "cuDNN non-det")]
REFS = [("best deterministic", "ref best det"), ("best non-deterministic", "ref best non-det")]


def newest_attn_json(results: Path) -> Path:
    runs = sorted(results.glob("*-attn*.json"), key=lambda p: json.loads(p.read_text())["meta"]["date"])
    if not runs:
        raise SystemExit(f"no *-attn*.json in {results}")
    return runs[-1]


def _cell(row: dict | None, pass_: str) -> str:
    if row is None or row.get("status") != "ok" or not row.get(pass_):
        return "–"
    star = "*" if pass_ == "bwd" and row.get("bitwise_repeat") else ""
    return f"{row[pass_]['tflops']:.0f}{star}"


def section(doc: dict, json_name: str, baselines: dict) -> str:
    rows = {(r["impl"], r["hdim"], r["mask"], r["seqlen"]): r for r in doc["rows"]}
    seqlens = sorted({r["seqlen"] for r in doc["rows"]})
    refs = {(r["impl"], r["hdim"], r["mask"]): r["tflops"] for r in baselines["rows"]
            if r["pass"] == "bwd" and r["impl"] in dict(REFS)}
    head = "| hdim | mask | implementation | " + " | ".join(f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens) + " |"
    lines = [
        f"Backward TFLOP/s on one H200 from `benchmarks/results/{json_name}` "
        f"({doc['meta'].get('date', '?')[:10]}, commit {str(doc['meta'].get('git_commit', '?'))[:7]}, "
        "bf16, 16k tokens, hidden 2048; `*` = bit-identical gradients over 5 repeats). "
        "Reference rows (italic) are the peers measured in `../shared/design/h200-baselines.md`.",
        "",
        head,
        "|" + "---|" * (3 + len(seqlens)),
    ]
    for hdim in sorted({r["hdim"] for r in doc["rows"]}):
        for mask in ("full", "causal"):
            for impl, label in OURS:
                cells = [_cell(rows.get((impl, hdim, mask, s)), "bwd") for s in seqlens]
                lines.append(f"| {hdim} | {mask} | {label} | " + " | ".join(cells) + " |")
            for impl, label in REFS:
                tf = refs.get((impl, hdim, mask), {})
                cells = [f"_{tf[str(s)]:.0f}_" if str(s) in tf else "–" for s in seqlens]
                lines.append(f"| {hdim} | {mask} | _{label}_ | " + " | ".join(cells) + " |")
    lines += ["", f"Forward, the full tables, charts and the determinism tax: `benchmarks/results/{Path(json_name).stem}.md`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", nargs="?", help="attention JSON (default: the newest in benchmarks/results)")
    args = ap.parse_args(argv)
    path = Path(args.result) if args.result else newest_attn_json(ROOT / "benchmarks" / "results")
    doc = json.loads(path.read_text())
    baselines = json.loads((ROOT / "benchmarks" / "h200_baselines.json").read_text())
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md lacks the {BEGIN} / {END} markers")
    pre, rest = text.split(BEGIN, 1)
    _, post = rest.split(END, 1)
    readme.write_text(pre + BEGIN + "\n" + section(doc, path.name, baselines) + "\n" + END + post)
    print(f"README.md results section written from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
