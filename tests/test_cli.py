"""``flash-attn-dash``: version, ``plan``'s table, JSON and PNG, and argument errors."""

from __future__ import annotations

import json

import pytest

from flash_attn_dash import __version__
from flash_attn_dash.cli import main


def test_table_lists_every_schedule(capsys):
    assert main(["plan", "--seqlen", "2048", "--hdim", "64"]) == 0
    full = capsys.readouterr().out
    assert main(["plan", "--seqlen", "2048", "--hdim", "128", "--causal", "--sms", "114"]) == 0
    causal = capsys.readouterr().out
    for name in ("ascending", "descending", "shift"):
        assert f"\n{name} " in full
    for name in ("ascending", "descending", "symmetric_shift"):
        assert f"\n{name} " in causal
    assert "batch=8 heads=32" in full and "grid 114" in causal
    for out in (full, causal):
        assert out.count("<- auto") == 1 and "auto -> " in out
    assert "non-deterministic backward walks: shift" in full
    assert "non-deterministic backward walks: symmetric_shift" in causal


def test_json(capsys):
    assert main(["plan", "--seqlen", "1024", "--hdim", "128", "--causal", "--json", "--sm-margin", "18",
                 "--c", "3", "--r", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["grid"] == 114 and data["batch"] == 16 and data["heads"] == 16 and data["unit"] == "cost units"
    assert (data["block_m"], data["block_n"], data["num_m"], data["num_n"]) == (64, 128, 16, 8)
    names = [s["schedule"] for s in data["schedules"]]
    assert names == ["ascending", "descending", "symmetric_shift"]
    assert sum(s["auto"] for s in data["schedules"]) == 1
    picked = next(s for s in data["schedules"] if s["auto"])
    assert picked["schedule"] == data["auto"]["schedule"]
    assert data["non_deterministic_walk"] == "symmetric_shift"
    for s in data["schedules"]:
        assert s["makespan"] > 0 and 0 <= s["bubble_fraction"] < 1
        assert s["speedup_over_ascending"] == pytest.approx(data["schedules"][0]["makespan"] / s["makespan"])


def test_json_reports_fallback(capsys):
    assert main(["plan", "--seqlen", "1000", "--seqlen-k", "2000", "--hdim", "64", "--causal", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    sym = next(s for s in data["schedules"] if s["schedule"] == "symmetric_shift")
    assert sym["schedule_used"] == "descending" and "seqlen_q == seqlen_k" in sym["fallback"]
    assert data["auto"]["schedule"] != "symmetric_shift"
    assert data["non_deterministic_walk"] == "descending"  # the same fallback as the deterministic order


def test_png(tmp_path, capsys):
    path = tmp_path / "plan.png"
    assert main(["plan", "--seqlen", "1024", "--hdim", "64", "--causal", "--png", str(path), "--max-ctas", "6"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["plan", "--seqlen", "1024", "--hdim", "96"], "--hdim"),
    (["plan", "--seqlen", "0", "--hdim", "64"], "--seqlen"),
    (["plan", "--seqlen", "abc", "--hdim", "64"], "--seqlen"),
    (["plan", "--hdim", "64"], "--seqlen"),
    (["plan", "--seqlen", "1024", "--hdim", "64", "--sm-margin", "132"], "--sm-margin"),
    (["plan", "--seqlen", "1024", "--hdim", "64", "--sm-margin", "-1"], "--sm-margin"),
    (["plan", "--seqlen", "1024", "--hdim", "64", "--r", "-2"], "--r"),
    (["plan", "--seqlen", "1024", "--hdim", "64", "--c", "0"], "--c"),
    ([], "command"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as err:
        main(["--version"])
    assert err.value.code == 0
    assert capsys.readouterr().out == f"flash-attn-dash {__version__}\n"


@pytest.mark.parametrize("argv, message", [
    (["--sm-margin", "132"], "argument --sm-margin: must be smaller than --sms=132, got 132"),
    (["--sms", "8", "--sm-margin", "9"], "argument --sm-margin: must be smaller than --sms=8, got 9"),
    (["--c", "0"], "argument --c: the compute cost must be > 0"),
])
def test_plan_checks_show_plan_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(["plan", "--seqlen", "1024", "--hdim", "64", *argv])
    assert err.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: flash-attn-dash plan ")
    assert lines[-1] == f"flash-attn-dash plan: error: {message}"
