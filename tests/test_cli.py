"""``flash-attn-dash``: version, ``plan``'s table, JSON and PNG, and argument errors (the chart itself:
test_cli_png.py)."""

from __future__ import annotations

import json
import os

import pytest

from flash_attn_dash import __version__, cli
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
    assert names == ["ascending", "descending", "symmetric_shift", "split", "diagonal"]
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
    (["plan", "--seqlen", "1024", "--hdim", "80"], "--hdim"),
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


def _no_simulation(*args, **kwargs):
    raise AssertionError("the --png path must be checked before the simulation")


def _one_line_png_error(argv, capsys) -> str:
    """Run plan with ``argv`` added, expect exit 2 with exactly one stderr line about --png, and return that line."""
    with pytest.raises(SystemExit) as err:
        main(["plan", "--seqlen", "1024", "--hdim", "64", *argv])
    assert err.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flash-attn-dash plan: error: argument --png: "), captured.err
    return lines[0]


@pytest.mark.parametrize("name, message", [
    ("missing/plan.png", "does not exist"),
    ("plan.jpg", "expected a file name ending in .png, got"),
    ("plan", "expected a file name ending in .png, got"),
    ("a_file/plan.png", "is not a directory"),
    ("a_dir.png", "got the directory"),
])
def test_bad_png_path_exits_2_before_simulating(name, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_dir.png").mkdir()
    monkeypatch.setattr(cli, "predict", _no_simulation)
    line = _one_line_png_error(["--png", str(tmp_path / name)], capsys)
    assert message in line and "expected a" in line  # what is wrong, and what is accepted


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_unwritable_png_directory_exits_2(tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    monkeypatch.setattr(cli, "predict", _no_simulation)
    try:
        line = _one_line_png_error(["--png", str(locked / "plan.png")], capsys)
    finally:
        locked.chmod(0o700)
    assert "cannot write" in line and "Permission denied" in line


def test_png_probe_leaves_no_file_and_keeps_an_existing_one(tmp_path, monkeypatch):
    class Probed(Exception):
        pass

    def check_then_stop(*args, **kwargs):
        raise Probed

    new, old = tmp_path / "new.png", tmp_path / "old.png"
    old.write_bytes(b"previous chart")
    monkeypatch.setattr(cli, "predict", check_then_stop)
    for path in (new, old):
        with pytest.raises(Probed):
            main(["plan", "--seqlen", "1024", "--hdim", "64", "--png", str(path)])
    assert not new.exists() and old.read_bytes() == b"previous chart"


def test_png_write_failure_after_simulating_exits_2(tmp_path, monkeypatch, capsys):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    path = str(tmp_path / "plan.png")
    monkeypatch.setattr(cli, "draw_gantt", disk_full)
    with pytest.raises(SystemExit) as err:
        main(["plan", "--seqlen", "1024", "--hdim", "64", "--json", "--png", path])
    assert err.value.code == 2
    captured = capsys.readouterr()
    json.loads(captured.out)  # the numbers were printed before the chart failed
    assert captured.err == (f"flash-attn-dash plan: error: argument --png: cannot write {path!r} "
                            "(No space left on device)\n")


def test_info_reports_the_build_and_the_table(capsys):
    from flash_attn_dash import variants

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert ("kernels built:" in out) != ("NO CUDA KERNELS BUILT" in out)
    for h in variants.HEAD_DIMS:
        assert f"head dim {h.label}:" in out
    assert "head dim (192, 128): forward 128x128 (full)" in out
    for s in variants.SCHEDULES:
        assert f"schedule {s.name} (id {s.id})" in out


def test_plan_takes_a_v_head_dim_pair(capsys):
    """--hdim 192v128 (MLA) plans the (192, 128) kernel's tiles and says so; a pair the table lacks is refused with the
    accepted names."""
    assert main(["plan", "--seqlen", "2048", "--hdim", "192v128", "--causal", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["head_dim"], data["head_dim_v"], data["block_m"], data["block_n"]) == (192, 128, 64, 96)
    assert main(["plan", "--seqlens", "512,300", "--hdim", "192v128"]) == 0
    assert "hdim=192v128 heads=10, tiles 64x96" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--seqlen", "1024", "--hdim", "192v64"])
    assert "argument --hdim: must be one of 64, 96, 128, 192, 256, 192v128" in capsys.readouterr().err


def test_cad_plan_is_a_sub_command(capsys):
    assert main(["cad-plan", "--world", "4", "--pareto", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 4 and len(data["load_after"]) == 4
    assert data["imbalance_after"] <= data["imbalance_before"]
