"""benchmarks/bench_cad.py on the CPU: argument handling and the JSON it writes (tiny shapes, no timings checked)."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import bench_cad  # noqa: E402
from flash_attn_dash.cad import plan_cad  # noqa: E402
from flash_attn_dash.cad.workload import pareto_doc_lens  # noqa: E402


def test_cpu_smoke_json(tmp_path, capsys):
    path = tmp_path / "cad.json"
    assert bench_cad.main(["--cpu", "--world", "2,3", "--tokens-per-rank", "512", "--seed", "4", "--repeats", "2",
                           "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["schema"] == "flash-attn-dash-bench-cad" and data["config"]["device"] == "cpu"
    assert [row["world_size"] for row in data["rows"]] == [2, 3]
    for row in data["rows"]:
        world = row["world_size"]
        assert row["doc_lens"] == pareto_doc_lens(world, 512, 4, scale=32)
        plan = plan_cad(row["doc_lens"], 128, 0.05, heads=2, heads_kv=1, head_dim=16, dtype_bytes=4)
        assert row["fingerprint"] == plan.fingerprint and row["bytes_per_phase"] == plan.bytes_per_phase
        assert row["load_imbalance_after"] == plan.imbalance_after and row["moved_chunks"] == plan.moved_chunks
        for key in ("per_rank_before", "per_rank_after"):
            assert len(row[key]) == world
            assert sum(r["rows"] for r in row[key]) == 512 * world  # every query row timed once
            assert all(r["ms"] > 0 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in row[key])
        assert sum(r["tasks"] for r in row["per_rank_after"]) == row["chunks"]
        assert row["linear_ms"] > 0 and row["planner_ms"] >= 0 and row["target_met"] is None
        assert row["layer_speedup_no_overlap"] <= row["layer_speedup_overlapped"]
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["W", "docs", "chunks"] and len(out.splitlines()) == 3


def test_target_is_judged_at_8_ranks(tmp_path):
    path = tmp_path / "cad.json"
    assert bench_cad.main(["--cpu", "--world", "8", "--tokens-per-rank", "256", "--json", str(path)]) == 0
    row = json.loads(path.read_text())["rows"][0]
    assert row["target_met"] == (row["load_imbalance_after"] <= 1.05)


@pytest.mark.parametrize("argv, message", [
    (["--world", "0"], "--world"),
    (["--world", "2,x"], "--world"),
    (["--chunk-size", "100"], "multiple of 128"),
    (["--tokens-per-rank", "64"], "--tokens-per-rank"),
    (["--tolerance", "-1"], "--tolerance"),
    (["--repeats", "0"], "--repeats"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        bench_cad.main(["--cpu", *argv])
    assert err.value.code == 2 and message in capsys.readouterr().err


def test_no_cuda_exits_2(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_cad.main(["--world", "2"]) == 2
    assert "use --cpu" in capsys.readouterr().err
