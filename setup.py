"""Build script: the pure-Python package everywhere, plus `flash_attn_dash._C` where it can be built.

The CUDA extension is built when torch (a CUDA build) is importable in the build environment, nvcc is
found and FLASH_DASH_SKIP_CUDA_BUILD is unset; build against the installed torch with
`pip install --no-build-isolation -e .`. Elsewhere only the Python parts install, and the build says so.
Knobs: FLASH_DASH_HDIMS, FLASH_DASH_DTYPES, FLASH_DASH_SKIP_CUDA_BUILD, MAX_JOBS, and
FLASH_DASH_PREBUILT_DIR (a folder of `make kernels` objects to link instead of compiling the .cu files; an object whose
digest stamp is not this tree's is compiled instead).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import build_config  # noqa: E402

# pip runs this file for metadata and then for the build; only the build says what it builds, and records it in
# flash_attn_dash/_build_info.json, which `flash-attn-dash info` and flash_attn_dash.build_info() show (pip hides
# this output unless -v).
_BUILDING = any(cmd in sys.argv for cmd in ("build", "build_ext", "bdist_wheel", "editable_wheel", "develop",
                                            "install"))
BUILD_INFO = ROOT / "flash_attn_dash" / "_build_info.json"


def _say(msg: str) -> None:
    if _BUILDING:
        print(f"flash-attn-dash: {msg}", file=sys.stderr)


def _record(kernels: list[str], reason: str | None) -> None:
    if _BUILDING:
        BUILD_INFO.write_text(json.dumps({"kernels": kernels, "no_kernels_reason": reason}, indent=1) + "\n")


def _why_no_cuda_build() -> str | None:
    if os.environ.get("FLASH_DASH_SKIP_CUDA_BUILD", "0") not in ("", "0", "FALSE", "false"):
        return "FLASH_DASH_SKIP_CUDA_BUILD is set"
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return "torch is not importable in the build environment (use --no-build-isolation on GPU machines)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None:
        return "nvcc / CUDA_HOME not found"
    if not build_config.kernel_sources():
        return "no kernel instantiations match FLASH_DASH_HDIMS / FLASH_DASH_DTYPES"
    if build_config.cutlass_include() is None:
        raise RuntimeError(
            "CUDA build requested but the CUTLASS headers are missing: pip install --no-deps nvidia-cutlass==4.2.0.0"
        )
    return None


def _prebuilt_object(folder: Path, source: str) -> Path | None:
    """The object of ``source`` in FLASH_DASH_PREBUILT_DIR when it was compiled from this tree (its `make kernels`
    stamp matches build_config.source_digest); None for a missing or stale one, which is compiled instead (said so)."""
    stem = Path(source).stem
    obj, stamp = folder / f"{stem}.o", folder / f"{stem}.digest"
    if not obj.is_file():
        return None
    if stamp.is_file() and stamp.read_text().strip() == build_config.source_digest(source):
        return obj
    _say(f"prebuilt {obj} {'is stale' if stamp.is_file() else 'has no digest stamp'}: compiling {source}")
    return None


def _cuda_extension():
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    sources = ["csrc/flash_api.cpp"]
    extra_objects = []
    prebuilt = os.environ.get("FLASH_DASH_PREBUILT_DIR")
    for src in build_config.kernel_sources():
        obj = _prebuilt_object(Path(prebuilt), src) if prebuilt else None
        if obj is not None:
            extra_objects.append(str(obj.resolve()))
        else:
            sources.append(src)
    defines = build_config.compile_defines()
    _say(f"building kernels {[Path(s).stem for s in build_config.kernel_sources()]}"
         + (f" ({len(extra_objects)} prebuilt)" if extra_objects else ""))
    ext = CUDAExtension(
        name="flash_attn_dash._C",
        sources=sources,
        include_dirs=[str(ROOT / "hopper"), str(ROOT / "csrc"), build_config.cutlass_include()],
        extra_objects=extra_objects,
        extra_compile_args={
            "cxx": ["-O3", *defines],  # torch picks the C++ standard its headers need
            # torch disables the half operators by default; CUTLASS needs them.
            "nvcc": build_config.nvcc_flags() + [
                "-U__CUDA_NO_HALF_OPERATORS__",
                "-U__CUDA_NO_HALF_CONVERSIONS__",
                "-U__CUDA_NO_HALF2_OPERATORS__",
                "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            ],
        },
    )
    return [ext], {"build_ext": BuildExtension}


reason = _why_no_cuda_build()
if reason is None:
    ext_modules, cmdclass = _cuda_extension()
    _record([v.name for v in build_config.selected_variants()], None)
else:
    _say(f"NO CUDA KERNELS BUILT: {reason}. Installing the pure-Python parts (reference, schedule model, CLI).")
    _record([], reason)
    ext_modules, cmdclass = [], {}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
