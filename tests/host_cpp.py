"""Builds small host programs around hopper/ headers (the schedulers are plain C++), for the CPU tests."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HOPPER = Path(__file__).resolve().parents[1] / "hopper"


def build_host_program(tmp_path_factory, name: str, source: str) -> Path:
    """Compile ``source`` (C++17, ``-I hopper``) into an executable; skip the test when no host compiler exists."""
    cxx = next((c for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c and shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no host C++ compiler (g++/c++/clang++)")
    work = tmp_path_factory.mktemp(name)
    src = work / f"{name}.cpp"
    src.write_text(source)
    exe = work / name
    res = subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(HOPPER), str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"host build of {name}.cpp failed:\n{res.stderr}"
    return exe


def run_int_cases(exe: Path, cases: list[tuple]) -> list[int]:
    """Run a host program that reads one case of ints per line and prints one int per case."""
    lines = "".join(" ".join(str(x) for x in c) + "\n" for c in cases)
    out = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, timeout=600, check=True).stdout
    return [int(x) for x in out.split()]
