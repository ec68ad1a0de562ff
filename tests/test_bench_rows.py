"""benchmarks/bench_attn.py and bench_block.py row by row on the CPU (FAD_BENCH_CPU=1: the harness self-test, our rows
on the CPU reference; numbers meaningless): every stage of a row runs, the JSON records what ran and why a row did
not, without a GPU."""
from __future__ import annotations

import json
import sys

import pytest

from benchmarks import bench_attn, bench_block
from benchmarks import common as bc

torch = pytest.importorskip("torch")


@pytest.fixture
def cpu_bench(monkeypatch):
    monkeypatch.setenv("FAD_BENCH_CPU", "1")
    monkeypatch.setattr(bc, "MIN_ITERS", 1)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # FA4 absent, also where it is installed


TIMING = ["--iters", "1", "--warmup", "0", "--sets", "1", "--repeats", "2", "--pad-us", "0"]


def test_attn_rows(cpu_bench, tmp_path):
    out = tmp_path / "attn.json"
    code = bench_attn.main(["--impl", "dash,dash-det,dash-det-diagonal,fa4", "--hdim", "64", "--seqlen", "128",
                            "--tokens", "256", "--hidden", "128", "--check-seqlen", "128", "--json", str(out)]
                           + TIMING)
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "attn" and doc["complete"] is True
    rows = {(r["impl"], r["mask"]): r for r in doc["rows"]}
    assert sorted(rows) == sorted((i, m) for i in ("dash", "dash-det", "dash-det-diagonal", "fa4")
                                  for m in ("full", "causal"))
    for (impl, mask), r in rows.items():
        if impl == "fa4":
            assert r["status"] == "skipped" and "flash_attn.cute" in r["reason"]
        elif impl == "dash-det-diagonal" and mask == "full":  # a causal order on a full mask
            assert r["status"] == "skipped" and "--all-schedules" in r["reason"]
        else:
            assert r["status"] == "ok", r["reason"]
            assert (r["batch"], r["seqlen"], r["heads"], r["hdim"]) == (2, 128, 2, 64)
            assert r["bwd"]["tflops"] == pytest.approx(bc.tflops(r["bwd"]["flops"], r["bwd"]["ms"]))
            assert r["bitwise_repeat"] is True and r["check"]["ok"] is True
            assert all(r["check"]["small"][g]["ok"] for g in ("out", "dq", "dk", "dv"))
    assert rows[("dash-det-diagonal", "causal")]["schedule_used"] == "diagonal"


def test_block_rows(cpu_bench, tmp_path):
    out = tmp_path / "block.json"
    code = bench_block.main(["--model", "tiny-gqa", "--seqlen", "64", "--impl", "sdpa,dash-det,fa4", "--json",
                             str(out)] + TIMING)
    assert code == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["fa4"]["status"] == "skipped" and "flash_attn.cute" in rows["fa4"]["reason"]
    for impl in ("sdpa", "dash-det"):
        r = rows[impl]
        assert r["status"] == "ok", r["reason"]
        assert (r["model"], r["seqlen"], r["heads"], r["heads_kv"]) == ("tiny-gqa", 64, 4, 2)
        assert r["bitwise_repeat"] is True and r["step"]["ms"] > 0
    det = rows["dash-det"]
    assert det["ref_impl"] == "sdpa" and det["out_max_abs_diff_vs_ref"] < 0.05 and det["dx_max_abs_diff_vs_ref"] < 0.05
