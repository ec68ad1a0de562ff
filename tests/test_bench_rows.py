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


class _Watchdog:
    def __init__(self):
        self.armed = []

    def arm(self, label):
        self.armed.append(label)

    def disarm(self):
        pass


class _Writer:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


class _Budget:
    def __init__(self, spent):
        self.spent = spent

    def exceeded(self, ours):
        return self.spent and not ours

    def reason(self, ours):
        return "budget spent"


def test_bench_runner_guards_and_records_failures(monkeypatch):
    """The loop every benchmark shares: a shape whose inputs fail gives each of its rows that error, a row that raises
    is recorded and the run goes on, an ImplUnavailable found while timing skips the row, a spent budget skips the
    peers' rows only, and runs_on leaves rows out."""
    monkeypatch.setattr(bc, "cuda_healthy", lambda: None)  # the context survives every failure here
    impls = {"ours": bc.Impl("ours", "ours", "dash", False), "peer": bc.Impl("peer", "peer", "fa4", False),
             "never": bc.Impl("never", "never", "dash", False)}

    class Runner(bc.BenchRunner):
        IMPLS = impls

        def make_inputs(self, shape):
            if shape == "broken":
                raise RuntimeError("CUDA out of memory (simulated)")
            return shape

        def runs_on(self, impl, shape):
            return impl.key != "never"

        def run_row(self, impl, shape, inputs):
            row = dict(impl=impl.key, shape=shape, status="ok", reason=None, stage=None, wall_s=None)
            if self.guard(row, inputs, ours=impl.family == "dash"):
                return row

            def body(stage):
                stage.name = "measure"
                if shape == "raises":
                    raise RuntimeError("kernel failed (simulated)")
                if shape == "unavailable" and impl.key == "peer":
                    raise bc.ImplUnavailable("no kernel for these inputs")
            self.timed(row, impl, f"{impl.key} {shape}", body)
            return row

        def progress_line(self, row, idx, total):
            return f"[{idx}/{total}] {row['impl']} {row['shape']} {row['status']}"

    args = type("Args", (), {"dtype": "bf16"})()
    writer, watchdog = _Writer(), _Watchdog()
    runner = Runner(args, writer, watchdog, _Budget(spent=False))
    runner.run(["ok", "broken", "raises", "unavailable"], ["ours", "peer", "never"])
    got = {(r["impl"], r["shape"]): (r["status"], r["stage"]) for r in writer.rows}
    assert got == {("ours", "ok"): ("ok", None), ("peer", "ok"): ("ok", None),
                   ("ours", "broken"): ("oom", "make_inputs"), ("peer", "broken"): ("oom", "make_inputs"),
                   ("ours", "raises"): ("error", "measure"), ("peer", "raises"): ("error", "measure"),
                   ("ours", "unavailable"): ("ok", None), ("peer", "unavailable"): ("skipped", "measure")}
    assert runner.fatal is None and runner.current is None and len(watchdog.armed) == 6
    assert all(r["wall_s"] is not None for r in writer.rows if r["stage"] != "make_inputs")
    writer = _Writer()
    Runner(args, writer, _Watchdog(), _Budget(spent=True)).run(["ok"], ["ours", "peer"])
    assert [(r["impl"], r["status"], r["reason"]) for r in writer.rows] == [("ours", "ok", None),
                                                                            ("peer", "skipped", "budget spent")]
