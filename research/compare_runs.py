"""Compare bench_attn.py, bench_varlen.py or bench_window.py JSON runs of one call row by row: each variant's TFLOP/s
over the base's.

    python research/compare_runs.py BASE.json VARIANT.json [VARIANT.json ...]

Prints, per (impl, hdim, mask or case, seqlen or pack), the baseline's fwd/bwd TFLOP/s and each variant's ratio to it, then the
median ratio per variant and pass (rows that are not `ok` on both sides are left out).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def rows(path: Path) -> dict:
    doc = json.loads(path.read_text())
    # bench_varlen.py rows name their pack (uniform packs carry a seqlen too); bench_attn.py rows have no pack;
    # bench_window.py rows name their case instead of a mask.
    return {(r["impl"], r["hdim"], r.get("mask") or r["case"], r.get("pack") or r["seqlen"]): r
            for r in doc["rows"] if r.get("status") == "ok"}


def tflops(row: dict, pass_: str) -> float | None:
    return (row.get(pass_) or {}).get("tflops")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("variants", type=Path, nargs="+")
    args = ap.parse_args(argv)
    base = rows(args.base)
    runs = [(p.stem, rows(p)) for p in args.variants]
    print(f"{'impl':<12} {'hdim':>4} {'mask':>6} {'shape':>6} {'fwd':>6} {'bwd':>6}  "
          + "  ".join(f"{name[:18]:>18}" for name, _ in runs))
    ratios: dict = {(name, p): [] for name, _ in runs for p in ("fwd", "bwd")}
    for key in sorted(base, key=str):
        b = base[key]
        cells = []
        for name, r in runs:
            v = r.get(key)
            parts = []
            for p in ("fwd", "bwd"):
                x, y = tflops(b, p), tflops(v, p) if v else None
                if x and y:
                    ratios[name, p].append(y / x)
                    parts.append(f"{y / x:.3f}")
                else:
                    parts.append("  -  ")
            cells.append("/".join(parts))
        print(f"{key[0]:<12} {key[1]:>4} {key[2]:>6} {str(key[3]):>6} {tflops(b, 'fwd') or 0:6.0f} {tflops(b, 'bwd') or 0:6.0f}  "
              + "  ".join(f"{c:>18}" for c in cells))
    for name, _ in runs:
        med = {p: statistics.median(ratios[name, p]) if ratios[name, p] else float("nan") for p in ("fwd", "bwd")}
        print(f"median ratio {name}: fwd {med['fwd']:.3f}, bwd {med['bwd']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
