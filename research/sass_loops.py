"""The MMA step loop of each kernel in a `make kernels` build, counted from its SASS.

    python research/sass_loops.py BUILD [--cuobjdump PATH] [--filter SUBSTRING] [--top N]

For every function, the loops are the backward branches (a BRA to a lower address); the step loop is the one with
the most HGMMA instructions per instruction. Prints its instruction count, HGMMA count and the N most frequent
opcodes (R2UR, IMAD, ... : the non-MMA work each step issues) and its local-memory accesses (spills; each object's
total last), so two builds can be compared without a GPU.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_diff import demangle  # noqa: E402

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/")
_BRA = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def sass_functions(obj: Path, cuobjdump: str) -> dict[str, list[tuple[int, str]]]:
    import subprocess

    text = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[tuple[int, str]]] = {}
    name = None
    for line in text.splitlines():
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            out[name] = []
            continue
        m = _LINE.search(line)
        if name and m:
            out[name].append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(instr: str) -> str:
    body = re.sub(r"^@!?U?P[T0-9]+\s+", "", instr)
    return body.split()[0].split(".")[0] if body else ""


def step_loop(body: list[tuple[int, str]]) -> list[str] | None:
    """The MMA step loop: the backward-branch loop with the most HGMMA per instruction. A loop around it (the tile
    loop, which holds more HGMMA where the forward's steps are inlined, ``fwd_inline_steps``) adds per-tile code and
    a loop the layout interleaves with it adds code of other paths, so neither is as dense; the forward's unmasked
    step loop (the hot one) is denser than its masked copy."""
    addr_index = {a: i for i, (a, _) in enumerate(body)}
    best: tuple[float, list[str]] | None = None
    for i, (_, instr) in enumerate(body):
        m = _BRA.search(instr)
        if not m:
            continue
        j = addr_index.get(int(m.group(1), 16))
        if j is None or j > i:
            continue
        loop = [x for _, x in body[j:i + 1]]
        density = sum(opcode(x) == "HGMMA" for x in loop) / len(loop)
        if density and (best is None or density > best[0]):
            best = (density, loop)
    return best[1] if best else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--filter", default="")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    cuobjdump = args.cuobjdump
    for obj in sorted(args.build.glob("*.o")):
        funcs = sass_functions(obj, cuobjdump)
        names = dict(zip(funcs, demangle(list(funcs))))
        local_total, local_kernels = 0, 0
        for mangled, body in funcs.items():
            pretty = names[mangled]
            if args.filter not in pretty or "kernel" not in pretty:
                continue
            loop = step_loop(body)
            if loop is None:
                continue
            hist = collections.Counter(opcode(x) for x in loop)
            top = " ".join(f"{op}:{n}" for op, n in hist.most_common(args.top))
            local = hist["LDL"] + hist["STL"]  # spilled values reloaded or saved every step
            local_total += local
            local_kernels += local > 0
            print(f"{obj.stem}  {pretty[:150]}\n    step loop {len(loop)} instr, HGMMA {hist['HGMMA']}, "
                  f"R2UR {hist['R2UR']}, local {local} | {top}")
        print(f"{obj.stem}: {local_total} local accesses (LDL/STL) in the step loops of {local_kernels} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
