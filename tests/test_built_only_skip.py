"""tests/conftest.py's FLASH_DASH_TEST_BUILT_ONLY rule: under it a failure that is only the extension refusing a head dim
the build left out is reported as skipped; every other failure stays a failure, and without it nothing is skipped."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = '''
import pytest

NOT_BUILT = ("no backward kernel compiled for head_dim 64, head_dim_v 64 and dtype BFloat16; rebuild with "
             "FLASH_DASH_HDIMS including 64 and FLASH_DASH_DTYPES including it")


def test_reaches_an_unbuilt_head_dim():
    raise ValueError(NOT_BUILT)


def test_expects_another_error_first():
    with pytest.raises(ValueError, match="gqa_fold needs"):
        raise ValueError(NOT_BUILT)


def test_fails_otherwise():
    raise ValueError("gradients differ")


def test_passes():
    pass
'''


def _run(tmp_path: Path, built_only: bool) -> dict[str, int]:
    for name in ("conftest.py", "kernel_head_dims.py"):  # the hook and the rule it reads
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    (tmp_path / "test_synthetic.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "FLASH_DASH_TEST_BUILT_ONLY"}
    if built_only:
        env["FLASH_DASH_TEST_BUILT_ONLY"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], env=env,
                         capture_output=True, text=True, cwd=tmp_path).stdout
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped)", out.splitlines()[-1])}


def test_not_built_failures_are_skips_only_under_built_only(tmp_path):
    assert _run(tmp_path, built_only=True) == {"failed": 1, "skipped": 2, "passed": 1}
    assert _run(tmp_path, built_only=False) == {"failed": 3, "passed": 1}
