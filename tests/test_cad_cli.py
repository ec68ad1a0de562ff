"""``cad-plan`` through an argparse parser built here (the console script wires add_parser in later)."""
from __future__ import annotations

import argparse
import json

import pytest

from flash_attn_dash.cad import cli, plan_cad
from flash_attn_dash.cad.workload import pareto_doc_lens


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flash-attn-dash")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_text_report_of_a_pareto_batch(capsys):
    assert cli.run(parse(["cad-plan", "--world", "8", "--pareto", "0"])) == 0
    text = capsys.readouterr().out
    plan = plan_cad(pareto_doc_lens(8, 65536, 0), heads=32, heads_kv=8, head_dim=128)
    assert f"imbalance (max/mean load): {plan.imbalance_before:.3f} -> {plan.imbalance_after:.3f}" in text
    assert f"moved chunks: {plan.moved_chunks} ({len(plan.moves)} moves)" in text
    assert "bytes between ranks per phase: q " in text and " dkv " in text
    assert len([line for line in text.splitlines() if line.split()[:1] in [[str(r)] for r in range(8)]]) == 8


def test_json_of_lengths_dealt_round_robin(capsys):
    argv = ["cad-plan", "--world", "2", "--lengths", "4096,128,300,900", "--chunk-size", "256", "--tolerance",
            "0", "--heads", "8", "--heads-kv", "2", "--head-dim", "64", "--json"]
    assert cli.run(parse(argv)) == 0
    data = json.loads(capsys.readouterr().out)
    plan = plan_cad([[4096, 300], [128, 900]], 256, 0.0, heads=8, heads_kv=2, head_dim=64)
    assert data["doc_lens"] == [[4096, 300], [128, 900]]
    assert data["fingerprint"] == plan.fingerprint and data["moved_chunks"] == plan.moved_chunks > 0
    assert data["imbalance_before"] > 1.8 and data["imbalance_after"] == pytest.approx(plan.imbalance_after)
    assert data["bytes_per_phase"] == plan.bytes_per_phase and data["planner_ms"] >= 0


def test_png(tmp_path, capsys):
    path = tmp_path / "loads.png"
    assert cli.run(parse(["cad-plan", "--world", "4", "--pareto", "3", "--tokens-per-rank", "8192",
                          "--chunk-size", "512", "--png", str(path)])) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out
    assert cli.run(parse(["cad-plan", "--world", "2", "--lengths", "300,200", "--tolerance", "inf",
                          "--png", str(path)])) == 0  # no tolerance line to draw


@pytest.mark.parametrize("argv, message", [
    (["cad-plan", "--pareto", "0"], "--world"),
    (["cad-plan", "--world", "0", "--pareto", "0"], "--world"),
    (["cad-plan", "--world", "2"], "--lengths"),
    (["cad-plan", "--world", "2", "--lengths", "1,2", "--pareto", "0"], "not allowed with argument"),
    (["cad-plan", "--world", "2", "--lengths", "1,x"], "--lengths"),
    (["cad-plan", "--world", "2", "--pareto", "0", "--chunk-size", "100"], "multiple of 128"),
    (["cad-plan", "--world", "2", "--pareto", "0", "--tolerance", "-1"], "--tolerance"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        parse(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--world", "4", "--lengths", "100,200,300"], "--lengths: 3 documents cannot give each of 4 ranks one"),
    (["--world", "2", "--lengths", "100,200", "--tokens-per-rank", "512"], "applies to --pareto only"),
    (["--world", "2", "--pareto", "1", "--tokens-per-rank", "64"], "--tokens-per-rank must be >= 128"),
    (["--world", "2", "--lengths", "4096,128", "--memory-budget", "1000"], "over memory_budget_bytes"),
])
def test_unplannable_arguments_return_2(argv, message, capsys):
    assert cli.run(parse(["cad-plan", *argv])) == 2
    err = capsys.readouterr().err
    assert err.startswith("cad-plan: error: ") and message in err
