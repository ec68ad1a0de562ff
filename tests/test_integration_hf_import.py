"""transformers stays optional: importing flash_attn_dash, its integrations package or the hf module does not import
it, and register() without it says how to install it. Runs without transformers installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_imports_do_not_import_transformers():
    result = _run("import sys, flash_attn_dash, flash_attn_dash.integrations, flash_attn_dash.integrations.hf\n"
                  "flash_attn_dash.flash_attn_func, flash_attn_dash.flash_attn_varlen_func\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_register_without_transformers_says_how_to_install():
    result = _run("import sys\nsys.modules['transformers'] = None  # as if not installed\n"
                  "from flash_attn_dash.integrations import hf\n"
                  "try:\n    hf.register()\nexcept ImportError as err:\n    print(err)\n")
    assert result.returncode == 0, result.stderr
    assert "needs transformers >= 5.0: pip install 'flash-attn-dash[hf]'" in result.stdout
