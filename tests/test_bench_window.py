"""benchmarks/bench_window.py on the CPU (FAD_BENCH_CPU=1: the harness self-test; numbers meaningless): rows, checks,
bitwise repeats and the JSON, and the FLOP count against a brute-force count of the window's pairs."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_window
from benchmarks import common as bc
from flash_attn_dash.reference import visible_mask


@pytest.mark.parametrize("sq,sk,window", [(300, 300, (127, 0)), (300, 500, (40, 7)), (500, 300, (-1, 0)),
                                           (64, 64, (-1, -1)), (100, 80, (0, 0))])
def test_visible_pairs_is_the_masks_count(sq, sk, window):
    mask = visible_mask(sq, sk, causal=False, window_size=window)
    assert bc.visible_pairs(sq, sk, window) == int(mask.sum())


def test_cpu_self_test(monkeypatch, tmp_path):
    monkeypatch.setenv("FAD_BENCH_CPU", "1")
    out = tmp_path / "w.json"
    assert bench_window.main(["--case", "gpt-oss", "--seqlen", "256", "--impl", "dash,dash-det,fa4", "--iters", "20",
                              "--warmup", "1", "--sets", "1", "--repeats", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["dash", "dash-det", "fa4"]
    for r in rows[:2]:
        assert r["status"] == "ok" and r["check"]["ok"] and r["bitwise_repeat"], r
        assert r["window"] == [127, 0] and r["bwd"]["tflops"] > 0
    assert rows[2]["status"] == "skipped" or not torch.cuda.is_available()


def test_order_rows_run_their_schedule(monkeypatch, tmp_path):
    """dash-det-<order> rows call flash_attn_func deterministic in that order (diagonal on gpt-oss's causal band);
    they are not default rows, and an unknown order is refused by name."""
    monkeypatch.setenv("FAD_BENCH_CPU", "1")
    fad = bench_window.bc.import_flash_attn_dash()
    attention, calls = fad.flash_attn_func, []

    def spy(*args, **kw):
        calls.append((kw["deterministic"], kw["schedule"]))
        return attention(*args, **kw)
    monkeypatch.setattr(fad, "flash_attn_func", spy)
    out = tmp_path / "w.json"
    assert bench_window.main(["--case", "gpt-oss", "--seqlen", "256", "--impl", "dash-det-diagonal,dash-det-descending",
                              "--iters", "20", "--warmup", "1", "--sets", "1", "--repeats", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["status"]) for r in rows] == [("dash-det-diagonal", "ok"), ("dash-det-descending", "ok")]
    assert {(True, "diagonal"), (True, "descending")} == set(calls)
    assert not set(bench_window.ORDER_IMPLS) & set(bench_window.IMPLS)
    with pytest.raises(SystemExit, match="unknown impl 'dash-det-sideways'"):
        bench_window.main(["--impl", "dash-det-sideways"])
