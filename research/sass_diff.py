"""Compare the SASS of two builds' kernel objects, function by function (for "no code change" refactors).

    python tools/sass_diff.py BUILD_A BUILD_B [--cuobjdump PATH] [--show N]

Each BUILD is a folder of `make kernels` objects (*.o). Functions are matched by their demangled name after
KEY_RULES (template arguments that a refactor renames but that do not change code); instructions are compared
without addresses and encodings. Prints one line per function: identical, identical up to a consistent renaming of
registers, or the count of differing lines. Exit status 1 if any function differs or is missing on one side.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

# BwdTraits<E, 64, 128, 128, 24, 240> (the variant table's tile and registers as template arguments) and the
# older BwdTraits<E, 64> name the same kernel configuration.
# The sliding-window, sink and softcap flags (bwd Is_local, Is_softcap, fwd kWindow, kSink, kSoftcap) added to the kernels'
# template arguments: false is the kernel that existed before it. The softcap flag, the newest, goes first: false is
# dropped, true becomes a SOFTCAP mark (so the older rules cannot turn a softcap kernel into another kernel's key).
_BWD3 = r"(bwd_kernel_sm90<[\w:]*BwdTraits<[^<>]*>(?:, (?:true|false)){2})"
_FWD2 = r"(flash_fwd_kernel_sm90<[\w:]*FwdKernelTraits<[^<>]*>(?:, (?:true|false)){2})"
# The GQA fold flag (bwd GqaFold, the kernel's last template argument), newer still, goes before them: false is
# the kernel that existed before it.
# The forward's varlen flag (kVarlen, its last template argument), newer than all of them, goes first: false is the
# kernel that existed before it.
_FWD4 = r"(flash_fwd_kernel_sm90<[\w:]*FwdKernelTraits<[^<>]*>(?:, (?:true|false)){3})"
# The backward's varlen flag (Varlen, after GqaFold) likewise.
_BWD_VARLEN = r"(bwd_kernel_sm90<.*?, (?:true|false)), (false|true)>\("
# The backward's stage counts and dK/dV layout (BwdTraits' last three arguments, newest of all): their defaults
# (2, 2, false) are the configuration that existed before them.
# The V head dim (FwdKernelTraits' and BwdTraits' last argument, newer than all of the above) goes before them: equal
# to the QK head dim is the kernel that existed before it.
_V_HEAD_DIM = [(re.compile(r"(FwdKernelTraits<(\d+), [^<>]*?), \2>"), r"\1>"),
               (re.compile(r"(BwdTraits<[^,<>]+, (\d+), [^<>]*?), \2>"), r"\1>")]
KEY_RULES = _V_HEAD_DIM + [(re.compile(r"(BwdTraits<[^<>]*), 2, 2, false>"), r"\1>"),
             (re.compile(_FWD4 + r", false>"), r"\1>"),
             (re.compile(_FWD4 + r", true>"), r"\1, VARLEN>"),
             (re.compile(_BWD_VARLEN), lambda m: m.group(1) + (">(" if m.group(2) == "false" else ", VARLEN>(")),
             (re.compile(r"(bwd_(?:preprocess|postprocess_dq|sink_grad)_kernel<.*?)(>?), false>\("),
              lambda m: m.group(1) + m.group(2) + (" >(" if m.group(2) else ">(")),
             (re.compile(r"(bwd_kernel_sm90<.*?)(>?), false>\("), lambda m: m.group(1) + m.group(2) + (" >(" if m.group(2) else ">(")),
             (re.compile(_BWD3 + r", false(, (?:true|false),)"), r"\1\2"),
             (re.compile(_BWD3 + r", true(, (?:true|false),)"), r"\1, SOFTCAP\2"),
             (re.compile(_FWD2 + r", false>"), r"\1>"),
             (re.compile(_FWD2 + r", true>"), r"\1, SOFTCAP>"),
             (re.compile(r"BwdTraits<([^,<>]+), (\d+)(?:, \d+){4}>"), r"BwdTraits<\1, \2>"),
             (re.compile(r"(bwd_kernel_sm90<[\w:]*BwdTraits<[^<>]*>, (?:true|false)), false,"), r"\1,"),
             (re.compile(r"(flash_fwd_kernel_sm90<[\w:]*FwdKernelTraits<[^<>]*>), false(?:, false)?>"), r"\1 >")]
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/")
_REG = re.compile(r"\bU?R[0-9]+\b|\bU?P[0-6]\b")


def registers_renamed(a: list[str], b: list[str]) -> bool:
    """Whether b is a with registers consistently renamed (a bijection between register names)."""
    if len(a) != len(b):
        return False
    fwd: dict[str, str] = {}
    back: dict[str, str] = {}
    for x, y in zip(a, b):
        if _REG.sub("R", x).replace(".reuse", "") != _REG.sub("R", y).replace(".reuse", ""):
            return False
        for ra, rb in zip(_REG.findall(x), _REG.findall(y)):
            if fwd.setdefault(ra, rb) != rb or back.setdefault(rb, ra) != ra:
                return False
    return True


def demangle(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def functions(obj: Path, cuobjdump: str) -> dict[str, list[str]]:
    text = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    bodies: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.strip().startswith("Function : "):
            name = line.split(":", 1)[1].strip()
            bodies[name] = []
        elif name is not None and (m := _INSTR.search(line)):
            bodies[name].append(m.group(1))
    keys = demangle(list(bodies))
    for rule, repl in KEY_RULES:
        keys = [rule.sub(repl, k) for k in keys]
    return dict(zip(keys, bodies.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--show", type=int, default=0, help="print the first N differing lines of each function")
    args = ap.parse_args(argv)
    bad = 0
    for obj_a in sorted(args.a.glob("*.o")):
        obj_b = args.b / obj_a.name
        if not obj_b.is_file():
            print(f"{obj_a.name}: missing in {args.b}")
            bad += 1
            continue
        fa, fb = functions(obj_a, args.cuobjdump), functions(obj_b, args.cuobjdump)
        for key in sorted(set(fa) | set(fb)):
            if key not in fa or key not in fb:
                print(f"{obj_a.name}: {key}: only in {'b' if key not in fa else 'a'}")
                bad += 1
                continue
            diff = [(x, y) for x, y in zip(fa[key], fb[key]) if x != y]
            extra = abs(len(fa[key]) - len(fb[key]))
            if not diff and not extra:
                print(f"{obj_a.name}: identical  {key[:110]}")
                continue
            if registers_renamed(fa[key], fb[key]):
                print(f"{obj_a.name}: identical up to register names ({len(diff)} lines)  {key[:110]}")
                continue
            bad += 1
            print(f"{obj_a.name}: DIFFERS ({len(diff)} lines, {len(fa[key])} vs {len(fb[key])} instructions)  {key[:110]}")
            for x, y in diff[:args.show]:
                print(f"    - {x}\n    + {y}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
