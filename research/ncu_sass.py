"""Where a kernel's warps stall, instruction by instruction, from Nsight Compute's source page (CPU, no GPU needed).

    python research/ncu_sass.py SASS.csv[.gz] [--kernel SUBSTRING ...] [--top N]

SASS.csv is `ncu -i REPORT --page source --csv --print-source sass` (benchmarks/gpu_session.sh's ncu step writes it
gzipped). For each kernel whose name contains one of the substrings (default: every kernel with HGMMA), prints the
warp-level instructions executed, the PC-sampling stall samples by reason, the opcode mix, and the MMA step loop:
the instructions executed as often as the kernel's most frequent HGMMA (one per warp and step), with their samples,
so two implementations compare per step (instructions issued, where the warps wait) rather than per kernel; then
the instructions outside that loop executed most often (wait loops show up there).
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys
from pathlib import Path

_OPCODE = re.compile(r"^\s*(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)")


def opcode(sass: str) -> str:
    m = _OPCODE.match(sass)
    return m.group(1) if m else ""


def read_kernels(path: Path) -> list[tuple[str, list[dict[str, str]]]]:
    """(kernel name, its rows: one per SASS instruction) per profiled kernel. ncu prints some kernels' blocks twice:
    a block with the same name and the same SASS as an earlier one is dropped; two kernels that share a name (a JIT's
    deterministic and non-deterministic builds) stay apart."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        text = f.read()
    blocks: list[tuple[str, list[dict[str, str]]]] = []
    header = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            blocks.append((row[1], []))
            header = None
        elif row[0] == "Address":
            header = row
        elif blocks and header is not None:
            blocks[-1][1].append(dict(zip(header, row)))
    kept: list[tuple[str, list[dict[str, str]]]] = []
    seen = set()
    for name, rows in blocks:
        key = (name, tuple(r["Source"] for r in rows))
        if key not in seen:
            seen.add(key)
            kept.append((name, rows))
    return kept


def _int(x: str) -> int:
    try:
        return int(x.replace(",", ""))
    except ValueError:
        return 0


def summarize(rows: list[dict[str, str]], top: int) -> str:
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    executed = [_int(r["Instructions Executed"]) for r in rows]
    samples = [_int(r["Warp Stall Sampling (All Samples)"]) for r in rows]
    ops = [opcode(r["Source"]) for r in rows]
    out = [f"  instructions executed (warp level) {sum(executed):,}, stall samples {sum(samples):,}"]
    by_reason = collections.Counter()
    for r in rows:
        for c in stall_cols:
            by_reason[c] += _int(r[c])
    total = max(1, sum(by_reason.values()))
    out.append("  samples by reason: " + ", ".join(f"{c[6:]} {100 * n / total:.1f}%"
                                                  for c, n in by_reason.most_common(8)))
    hgmma = [e for e, o in zip(executed, ops) if o == "HGMMA"]
    if hgmma:
        per_step = max(hgmma)
        loop = [i for i, e in enumerate(executed) if e == per_step]
        mix = collections.Counter(ops[i] for i in loop)
        loop_samples = sum(samples[i] for i in loop)
        out.append(f"  step loop: {len(loop)} instructions per warp and step ({per_step:,} executions each), "
                   f"{sum(1 for i in loop if ops[i] == 'HGMMA')} HGMMA, {100 * loop_samples / max(1, sum(samples)):.1f}%"
                   f" of the samples")
        out.append("  step loop mix: " + " ".join(f"{o}:{n}" for o, n in mix.most_common(14)))
        # Outside the loop, an instruction executed far more often than its neighbours is a wait loop spinning
        # (mbarrier try_wait retries): those take issue slots from the MMA warps sharing the scheduler.
        in_loop = set(loop)
        rest = sorted((i for i in range(len(rows)) if i not in in_loop), key=lambda i: -executed[i])
        rest_executed = sum(executed[i] for i in rest)
        out.append(f"  outside the step loop: {rest_executed:,} instructions executed "
                   f"({100 * rest_executed / max(1, sum(executed)):.1f}%); top {top} by executions:")
        for i in rest[:top]:
            source = rows[i]["Source"].strip()[:70]
            out.append(f"    {rows[i]['Address'][-5:]} {executed[i]:>12,} {samples[i]:>6} {source}")
    out.append(f"  top {top} instructions by samples (address, samples, reasons, SASS):")
    order = sorted(range(len(rows)), key=lambda i: -samples[i])[:top]
    for i in order:
        reasons = collections.Counter({c[6:]: _int(rows[i][c]) for c in stall_cols})
        why = " ".join(f"{c}:{n}" for c, n in reasons.most_common(3) if n)
        out.append(f"    {rows[i]['Address'][-5:]} {samples[i]:>6} {why:<40} {rows[i]['Source'].strip()[:70]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--kernel", action="append", default=[], help="substring of the kernel names to report")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    for name, rows in read_kernels(args.csv):
        if not rows:
            continue
        chosen = any(k in name for k in args.kernel) if args.kernel else any(opcode(r["Source"]) == "HGMMA" for r in rows)
        if chosen:
            print(name[:160])
            print(summarize(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
