"""``flash-attn-dash plan --window``: the band's table, JSON and chart, its canonical forms, and bad values."""

from __future__ import annotations

import json

import pytest

from flash_attn_dash.cli import main


def test_band_table_lists_every_schedule(capsys):
    assert main(["plan", "--seqlen", "8192", "--hdim", "64", "--causal", "--window", "128,-1", "--heads", "64",
                 "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: window (128, 0), seqlen_q=8192")  # --causal sets RIGHT=0
    for name in ("ascending", "descending", "shift", "symmetric_shift"):
        assert f"\n{name} " in out
    assert out.count("<- auto") == 1 and "\ndescending       descending" in out
    assert "auto -> descending: the rule for bands, picked by simulation" in out
    assert "symmetric_shift: descending over" in out and "complementary tile counts" in out
    assert "shift over a dynamic persistent grid of 132 CTAs (walks up the band" in out
    assert "non-deterministic backward walks: descending" in out


def test_band_json(capsys):
    assert main(["plan", "--seqlen", "4096", "--seqlen-k", "6000", "--hdim", "128", "--window", "512,64",
                 "--json", "--c", "3", "--r", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["window"] == [512, 64] and data["banded"] and data["mask"] == "full"
    assert [s["schedule"] for s in data["schedules"]] == ["ascending", "descending", "shift", "symmetric_shift",
                                                          "split", "diagonal"]
    assert data["auto"]["schedule"] == "descending" and data["non_deterministic_walk"] == "descending"
    sym = next(s for s in data["schedules"] if s["schedule"] == "symmetric_shift")
    assert sym["schedule_used"] == "descending" and "seqlen_q == seqlen_k" in sym["fallback"]
    ascending, descending = data["schedules"][:2]
    assert ascending["makespan"] > 1.5 * descending["makespan"]  # FlashAttention-3's order queues on a band


@pytest.mark.parametrize("argv, expect", [
    (["--window=-1,0"], "plan: causal,"),  # (-1, 0) is the causal mask
    (["--causal", "--window", "100000,-1"], "plan: causal,"),  # a side that clips nothing is unbounded
    (["--causal", "--window", "1000,-1"], "plan: window (1000, 0), no tile outside causal,"),
])
def test_windows_that_remove_no_tile_plan_as_the_mask(argv, expect, capsys):
    assert main(["plan", "--seqlen", "1024", "--hdim", "128", *argv]) == 0
    out = capsys.readouterr().out
    assert out.startswith(expect)
    assert "\nsymmetric_shift  symmetric_shift" in out and "\nshift " not in out
    assert "non-deterministic backward walks: symmetric_shift" in out


def test_band_png(tmp_path, capsys):
    path = tmp_path / "band.png"
    assert main(["plan", "--seqlen", "2048", "--hdim", "64", "--window", "256,256", "--png", str(path),
                 "--max-ctas", "4"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-2,0", "1", "1,2,3", "a,b", "1.5,2", ""])
def test_bad_window_exits_2(value, capsys):
    with pytest.raises(SystemExit) as err:
        main(["plan", "--seqlen", "1024", "--hdim", "64", f"--window={value}"])
    assert err.value.code == 2
    assert "--window" in capsys.readouterr().err


def test_gqa_band_plans_the_sibling_fold(capsys):
    """--heads-kv: on gpt-oss's band the plan is the GQA sibling fold's, as flash_attn_dash.launch runs it; on the
    causal mask it is not; a K/V head count that does not divide the heads, or one with a pack, is refused."""
    argv = ["plan", "--seqlen", "8192", "--hdim", "64", "--causal", "--heads", "64", "--heads-kv", "8", "--batch", "1",
            "--json"]
    assert main(argv + ["--window", "127,-1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["heads_kv"] == 8 and data["gqa_fold"]
    assert all("GQA-folded (8 query heads per tile)" in s["description"] for s in data["schedules"])
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["heads_kv"] == 8 and not data["gqa_fold"]
    assert not any("GQA-folded" in s["description"] for s in data["schedules"])
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--seqlen", "1024", "--hdim", "64", "--heads", "8", "--heads-kv", "3"])
    assert exc.value.code == 2 and "argument --heads-kv: must divide --heads=8, got 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--seqlens", "1024,512", "--hdim", "64", "--heads-kv", "2"])
    assert "argument --heads-kv: only with --seqlen" in capsys.readouterr().err
