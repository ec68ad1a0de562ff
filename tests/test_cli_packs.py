"""``flash-attn-dash plan --seqlens``: a varlen pack's table, JSON and chart, agreement with the dense planner on a
pack of one, and bad values named with what is accepted."""

from __future__ import annotations

import json

import pytest

from flash_attn_dash.cli import main


def test_pack_table(capsys):
    assert main(["plan", "--seqlens", "8192,2048,512,512", "--hdim", "128", "--causal"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("plan: causal pack of 4 sequences, seqlens_q=8192,2048,512,512 seqlens_k=same "
                               "hdim=128 heads=16, tiles 64x128 (M=128,32,8,8, N=64,16,4,4), grid 132 = 132 SMs")
    assert lines[2].split() == ["schedule", "runs", "as", "makespan", "us", "idle", "waits", "speedup", "portable"]
    rows = {line.split()[0]: line.split() for line in lines[3:6]}
    assert list(rows) == ["ascending", "descending", "symmetric_shift"]  # no shift on a causal pack
    assert rows["ascending"][5:] == ["1.000x", "all"]
    assert rows["descending"][-3:] == ["all", "<-", "auto"] and rows["symmetric_shift"][-1] == "none"
    assert out.count("<- auto") == 1
    assert "auto -> descending: deterministic varlen auto, the measured faster portable order for this head dim" in out
    assert "claim order (longest first): sequences 0,1,2,3" in out
    assert "symmetric_shift over a pair grid of 132 CTAs (s=2) shared by the pack" in out


def test_pack_json(capsys):
    assert main(["plan", "--seqlens", "300,1000,0,2048", "--seqlens-k", "300,1200,64,0", "--hdim", "64",
                 "--heads", "4", "--sms", "16", "--json", "--c", "3", "--r", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seqlens_q"] == [300, 1000, 0, 2048] and data["seqlens_k"] == [300, 1200, 64, 0]
    assert data["num_m"] == [3, 8, 0, 16] and data["num_n"] == [3, 10, 1, 0]
    assert data["claim_order"] == [1, 0, 2, 3] and data["grid"] == 16 and data["unit"] == "cost units"
    assert [s["schedule"] for s in data["schedules"]] == ["ascending", "descending", "shift"]
    by_name = {s["schedule"]: s for s in data["schedules"]}
    assert by_name["descending"]["auto"] and data["auto"]["schedule"] == "descending"
    assert by_name["descending"]["sequence_schedules"] == ["descending", "descending", None, None]
    assert by_name["descending"]["portable"] and by_name["descending"]["grid_kind"] == "dynamic"
    assert by_name["shift"]["grid_kind"] == "static" and by_name["shift"]["sequence_portable"] == [False, False,
                                                                                                 None, None]
    assert all(s["makespan"] > 0 for s in data["schedules"])


@pytest.mark.parametrize("argv", [["--causal"], [], ["--causal", "--window", "128,-1"]])
def test_pack_of_one_matches_the_dense_planner(argv, capsys):
    common = ["--hdim", "64", "--heads", "8", "--sms", "20", "--json", *argv]
    assert main(["plan", "--seqlen", "2048", "--batch", "1", *common]) == 0
    dense = json.loads(capsys.readouterr().out)
    assert main(["plan", "--seqlens", "2048", *common]) == 0
    pack = json.loads(capsys.readouterr().out)
    keys = ("schedule", "schedule_used", "num_ctas", "makespan", "bubble_fraction", "wait_fraction")
    assert [[s[k] for k in keys] for s in pack["schedules"]] == [[s[k] for k in keys] for s in dense["schedules"]]


def test_pack_png(tmp_path, capsys):
    path = tmp_path / "pack.png"
    assert main(["plan", "--seqlens", "1024,256,0", "--seqlens-k", "1024,256,128", "--hdim", "64", "--causal",
                 "--png", str(path), "--max-ctas", "4"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--seqlens", "1024,-2"], "argument --seqlens: expected comma-separated lengths >= 0, one per sequence"),
    (["--seqlens", "a,b"], "argument --seqlens: expected comma-separated lengths >= 0"),
    (["--seqlens", ""], "argument --seqlens: expected comma-separated lengths >= 0"),
    (["--seqlens", "1.5"], "argument --seqlens: expected comma-separated lengths >= 0"),
    (["--seqlens", "0,0"], "argument --seqlens: a pack needs a sequence with seqlen_q > 0 and seqlen_k > 0"),
    (["--seqlens", "1024,512", "--seqlens-k", "0,0"], "argument --seqlens: a pack needs a sequence"),
    (["--seqlens", "1024,512", "--seqlens-k", "1024"],
     "argument --seqlens-k: seqlens_k must have one length per sequence (2 in seqlens_q), got 1"),
    (["--seqlens", "1024", "--seqlens-k", "x"], "argument --seqlens-k: expected comma-separated lengths >= 0"),
    (["--seqlens", "1024", "--seqlen", "1024"], "argument --seqlen: not allowed with argument --seqlens"),
    (["--seqlens", "1024", "--batch", "2"], "argument --batch: not with --seqlens"),
    (["--seqlens", "1024", "--seqlen-k", "512"], "argument --seqlen-k: not with --seqlens"),
    (["--seqlen", "1024", "--seqlens-k", "512"], "argument --seqlens-k: only with --seqlens"),
    ([], "one of the arguments --seqlen --seqlens is required"),
])
def test_bad_pack_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(["plan", "--hdim", "64", *argv])
    assert err.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: flash-attn-dash plan ")
    assert message in lines[-1], lines[-1]
