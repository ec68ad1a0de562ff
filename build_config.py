"""Build knobs and nvcc flags shared by setup.py and the Makefile.

The kernels are the variants of flash_attn_dash/variants.py; the knobs (environment) select a subset:
  FLASH_DASH_HDIMS   comma list of head dims to compile (any of the table; default: its default-build entries), each
                     by its build name: the head dim (128), or qk and v head dims as 192v128 where V's differs
  FLASH_DASH_DTYPES  comma list of dtypes to compile (default "bf16,fp16")
  FLASH_DASH_PASSES  comma list of passes to compile (default "fwd,bwd"; a subset is for kernel development)
  FLASH_DASH_SKIP_CUDA_BUILD=1  install the pure-Python parts only
  MAX_JOBS           parallel nvcc jobs (read by torch's ninja builder)

`python build_config.py sources` prints the selected translation units (the Makefile's list);
`python build_config.py digest TU.cu` prints the digest an object of that unit is stamped with (`make kernels` writes it
beside the object; setup.py links a prebuilt object only when its stamp is the tree's);
`python build_config.py report LOG...` summarises ptxas resource usage per kernel.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from flash_attn_dash import variants  # noqa: E402  (pure Python, no torch)



def _env_list(name: str, accepted: tuple, cast, default: tuple | None = None) -> list:
    """The comma list in environment variable ``name`` (each value one of ``accepted``), else ``default`` (all of
    ``accepted`` when None)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return list(accepted if default is None else default)
    values = [cast(x.strip()) for x in raw.split(",") if x.strip()]
    bad = [v for v in values if v not in accepted]
    if bad:
        raise ValueError(f"{name}={raw!r}: unsupported {', '.join(map(str, bad))}; accepted values are "
                         f"[{', '.join(map(str, accepted))}]")
    return values


def selected_head_dims() -> list[variants.HeadDim]:
    """The table entries ``FLASH_DASH_HDIMS`` names (``HeadDim.build_name``: ``128``, ``192v128``), else its
    default-build entries."""
    by_name = {h.build_name: h for h in variants.HEAD_DIMS}
    names = _env_list("FLASH_DASH_HDIMS", tuple(by_name), str,
                      default=tuple(h.build_name for h in variants.HEAD_DIMS if h.default_build))
    return [by_name[n] for n in names]


def selected_dtypes() -> list[str]:
    return _env_list("FLASH_DASH_DTYPES", variants.DTYPES, str)


def selected_variants() -> list[variants.Variant]:
    """The table's translation units for the selected passes, head dims and dtypes."""
    heads, dtypes = selected_head_dims(), selected_dtypes()
    passes = _env_list("FLASH_DASH_PASSES", variants.PASSES, str)
    return [v for v in variants.variants() if v.pass_ in passes and v.head in heads and v.dtype in dtypes]


def kernel_sources() -> list[str]:
    """Generated translation units of the selected variants (paths relative to the repository)."""
    return [f"hopper/generated/{v.name}.cu" for v in selected_variants()]


def compile_defines() -> list[str]:
    """-D flags telling the binding's kernel table (csrc/kernel_table.h) which instantiations exist."""
    return [f"-DFLASH_DASH_HAS_{v.name.upper()}" for v in selected_variants()]


def nvcc_flags() -> list[str]:
    return [
        "-std=c++17",
        "-O3",
        "-DNDEBUG",  # CUTLASS checks in device code cost a lot of speed
        "--use_fast_math",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        "-Xcompiler=-fPIC",  # objects from `make kernels` link into the torch extension
        "-gencode=arch=compute_90a,code=sm_90a",
        "-Xptxas=-v",
        "--ftemplate-backtrace-limit=0",
        "-DCUTLASS_DEBUG_TRACE_LEVEL=0",
    ]


def source_digest(source: str) -> str:
    """sha256 of what an object of translation unit ``source`` is compiled from: the nvcc flags, the unit and every
    header under hopper/ (all of them, not the unit's includes: a stale object costs a wrong answer, a needless
    recompile only time)."""
    h = hashlib.sha256(" ".join([*nvcc_flags(), _cutlass_version()]).encode())
    headers = sorted(p for p in (ROOT / "hopper").rglob("*") if p.suffix in (".h", ".hpp", ".cuh"))
    for path in [ROOT / source, *headers]:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _cutlass_version() -> str:
    import importlib.metadata

    try:
        return "nvidia-cutlass " + importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "nvidia-cutlass missing"


def cutlass_include() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    inc = Path(spec.origin).parent / "source" / "include"
    return str(inc) if (inc / "cute").is_dir() else None


_FUNC = re.compile(r"Compiling entry function '(\S+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


def report(logs: list[str]) -> int:
    """Print registers/stack/spills per kernel from ptxas -v logs; return the count of spilling kernels."""
    logs = [log for log in logs if Path(log).is_file()]
    if not logs:
        print("no kernel translation units compiled")
        return 0
    spilling = 0
    print(f"{'regs':>5} {'stack':>6} {'spill st/ld':>12}  kernel")
    for log in logs:
        name = None
        stack = spill = (0, 0)
        for line in Path(log).read_text().splitlines():
            if m := _FUNC.search(line):
                name = m.group(1)
                stack, spill = 0, (0, 0)
            elif name and (m := _STACK.search(line)):
                stack = int(m.group(1))
                if s := _SPILL.search(line):
                    spill = (int(s.group(1)), int(s.group(2)))
            elif name and (m := _REGS.search(line)):
                short = _demangle(name)
                print(f"{m.group(1):>5} {stack:>6} {spill[0]:>5}/{spill[1]:<6}  {Path(log).stem}: {short}")
                spilling += spill != (0, 0)
                name = None
    print(f"{spilling} kernel(s) spill")
    return spilling


def _demangle(name: str) -> str:
    try:
        import subprocess

        out = subprocess.run(["c++filt", name], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name
    # Keep the template arguments that tell kernels apart (mask, determinism, policy), drop namespaces.
    out = re.sub(r"\b(flash_dash|cutlass|cute|bwd)::", "", out)
    return re.sub(r"\s+", " ", out).replace("void ", "")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "report":
        report(sys.argv[2:])
    elif len(sys.argv) >= 2 and sys.argv[1] == "sources":
        print(" ".join(kernel_sources()))
    elif len(sys.argv) == 3 and sys.argv[1] == "digest":
        print(source_digest(sys.argv[2]))
    else:
        print(__doc__)
