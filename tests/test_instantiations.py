"""The committed kernel instantiation files are exactly what the generator writes."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_instantiation_files_are_generated():
    result = subprocess.run([sys.executable, str(ROOT / "hopper" / "generate_instantiations.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_build_config_selects_by_knobs(monkeypatch):
    sys.path.insert(0, str(ROOT))
    import build_config

    monkeypatch.setenv("FLASH_DASH_HDIMS", "128")
    monkeypatch.setenv("FLASH_DASH_DTYPES", "bf16")
    monkeypatch.setenv("FLASH_DASH_PASSES", "bwd")
    assert build_config.kernel_sources() == ["hopper/instantiations/bwd_hdim128_bf16.cu"]
    assert build_config.compile_defines() == ["-DFLASH_DASH_HAS_BWD_HDIM128_BF16"]
    monkeypatch.setenv("FLASH_DASH_HDIMS", "80")
    try:
        build_config.kernel_sources()
    except ValueError as e:
        assert "FLASH_DASH_HDIMS" in str(e) and "[64, 128]" in str(e)
    else:
        raise AssertionError("an unsupported head dim must be rejected")
