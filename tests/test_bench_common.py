"""CPU unit tests of the benchmark helpers (no GPU, no timings).

FLOP formulas, grid / implementation selection, reference attention + tolerance rule,
JSON writer, JSON -> Markdown tables, PNG plotting from synthetic results, the
h200_baselines.json transcription, and the scripts' --help / --dry-run / no-CUDA exit.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
BASELINE_JSON = os.path.join(BENCH, "h200_baselines.json")
# shared/ sits beside the checkout (developers and CI alike)
BASELINE_MD = os.path.join(ROOT, "..", "shared", "design", "h200-baselines.md")


sys.path.insert(0, ROOT)
from benchmarks import bench_attn as battn  # noqa: E402
from benchmarks import bench_block as bblock  # noqa: E402
from benchmarks import common as bc  # noqa: E402
from benchmarks import plot  # noqa: E402


# --------------------------------------------------------------------------- FLOPs
def test_fwd_flops_full_and_causal():
    assert bc.attn_fwd_flops(1, 1, 1024, 1024, 64, False) == 4 * 1024 * 1024 * 64
    assert bc.attn_fwd_flops(2, 16, 4096, 4096, 128, False) == 4 * 2 * 16 * 4096 ** 2 * 128
    assert bc.attn_fwd_flops(2, 16, 4096, 4096, 128, True) == 2 * 2 * 16 * 4096 ** 2 * 128
    # bottom-right causal with sq < sk: avg_sk = (sk - sq + sk) / 2
    assert bc.attn_fwd_flops(1, 1, 100, 300, 8, True) == 2 * 100 * 250 * 16
    assert bc.attn_fwd_flops(1, 1, 300, 100, 8, True) == 2 * 300 * 50 * 16
    assert bc.attn_fwd_flops(1, 1, 64, 64, 64, False, hdim_v=128) == 2 * 64 * 64 * 192


def test_bwd_flops_and_tflops():
    f = bc.attn_fwd_flops(4, 16, 4096, 4096, 128, True)
    assert bc.attn_bwd_flops(4, 16, 4096, 4096, 128, True) == 2.5 * f
    assert bc.tflops(1e12, 1000.0) == pytest.approx(1.0)
    assert bc.tflops(5e12, 10.0) == pytest.approx(500.0)
    assert bc.tflops(1e12, 0.0) is None and bc.tflops(1e12, None) is None


def test_grid_flops_match_baseline_convention():
    # baseline convention: 4*b*h*s^2*d, 16k tokens, hidden 2048 -> identical for every grid row
    for sh in bc.attn_grid():
        f = bc.attn_fwd_flops(sh["batch"], sh["heads"], sh["seqlen"], sh["seqlen"], sh["hdim"],
                              sh["causal"])
        exp = 4 * 16384 * sh["seqlen"] * 2048 / (2 if sh["causal"] else 1)
        assert f == pytest.approx(exp)


def test_block_flops():
    cfg = bblock.MODELS["llama3-8b"]
    fl = bc.block_flops(cfg, 1, 8192)
    params = 4096 * (32 + 16) * 128 + 4096 * 4096 + 3 * 4096 * 14336
    assert fl["linear_fwd"] == 2 * 8192 * params
    assert fl["attn_fwd"] == bc.attn_fwd_flops(1, 32, 8192, 8192, 128, True)
    assert fl["step"] == pytest.approx(3 * fl["linear_fwd"] + 3.5 * fl["attn_fwd"])
    vit = bc.block_flops(bblock.MODELS["vit-2048"], 1, 4096)
    assert vit["linear_fwd"] == 2 * 4096 * (2048 * 3 * 2048 + 2048 * 2048 + 2 * 2048 * 8192)


# --------------------------------------------------------------------------- grid / selection
def test_default_grid():
    g = bc.attn_grid()
    assert len(g) == 2 * 2 * 6
    for sh in g:
        assert sh["batch"] * sh["seqlen"] == 16384
        assert sh["heads"] * sh["hdim"] == 2048
        assert sh["causal"] == (sh["mask"] == "causal")
    assert [(s["hdim"], s["mask"], s["seqlen"]) for s in g[:7]] == (
        [(64, "full", s) for s in bc.SEQLENS] + [(64, "causal", 512)])
    assert g[0]["batch"] == 32 and g[0]["heads"] == 32
    assert g[-1] == dict(batch=1, seqlen=16384, heads=16, heads_kv=16, hdim=128,
                         mask="causal", causal=True)


def test_grid_errors_and_labels():
    with pytest.raises(ValueError):
        bc.attn_grid([3000])
    with pytest.raises(ValueError):
        bc.attn_grid([512], [96])
    with pytest.raises(ValueError):
        bc.attn_grid([512], [64], ["sliding"])
    assert [bc.seqlen_label(s) for s in bc.SEQLENS] == ["512", "1k", "2k", "4k", "8k", "16k"]
    assert bc.parse_list(["2k,8k", "512"], bc.parse_seqlen) == [2048, 8192, 512]
    assert bc.parse_seqlen("32K") == 32768


def test_select_impls():
    default = bc.IMPL_GROUPS["default"]
    assert bc.select_impls(None, default) == default
    assert bc.select_impls(["dash-det*"], default) == [
        "dash-det", "dash-det-ascending", "dash-det-descending", "dash-det-shift",
        "dash-det-symshift", "dash-det-split", "dash-det-diagonal"]
    assert bc.select_impls(["sdpa"], default) == ["sdpa"]  # exact key beats the group
    assert bc.select_impls(["fa4-all,sdpa-all"], default) == ["sdpa-cudnn", "sdpa-flash",
                                                              "sdpa-efficient", "fa4", "fa4-det"]
    assert bc.select_impls(["fa4"], default) == ["fa4"]
    assert bc.select_impls(["all"], default) == list(bc.IMPLS)
    with pytest.raises(ValueError):
        bc.select_impls(["nope"], default)
    assert not bc.IMPLS["dash-det-shift"].applies_to("causal")
    assert not bc.IMPLS["dash-det-symshift"].applies_to("full")
    assert all(bc.IMPLS[k].deterministic for k in bc.IMPL_GROUPS["ours"][1:])


def test_attn_plan_quick_and_full():
    args = battn.build_parser().parse_args(["--quick"])
    grid, impls = battn.plan(args)
    assert len(grid) == 8 and {s["seqlen"] for s in grid} == {2048, 8192}
    assert {s["hdim"] for s in grid} == {64, 128} and {s["mask"] for s in grid} == set(bc.MASKS)
    assert "sdpa-efficient" not in impls and "dash-det" in impls and "fa4-det" in impls
    assert args.budget_s == 120.0 and args.iters >= bc.MIN_ITERS
    args = battn.build_parser().parse_args(["--causal", "--hdim", "128", "--seqlen", "1k,4k"])
    grid, _ = battn.plan(args)
    assert [(s["mask"], s["hdim"], s["seqlen"]) for s in grid] == [("causal", 128, 1024),
                                                                   ("causal", 128, 4096)]
    grid, impls = battn.plan(battn.build_parser().parse_args([]))
    assert len(grid) == 24 and impls == bc.IMPL_GROUPS["default"]
    with pytest.raises(SystemExit):
        battn.plan(battn.build_parser().parse_args(["--iters", "10"]))


def test_block_plan():
    args = bblock.build_parser().parse_args(["--quick"])
    shapes, impls = bblock.plan(args)
    assert shapes == [("llama3-8b", 8192)]
    assert impls[0] == "sdpa" and set(impls) == {"sdpa", "dash", "dash-det", "dash-det-ascending", "fa4", "fa4-det"}
    shapes, _ = bblock.plan(bblock.build_parser().parse_args([]))
    assert len(shapes) == 12 and {m for m, _ in shapes} == set(bblock.DEFAULT_MODELS)
    assert {s for _, s in shapes} == {4096, 8192, 16384, 32768}
    m = bblock.MODELS
    assert (m["llama3-8b"]["heads"], m["llama3-8b"]["heads_kv"], m["llama3-8b"]["hidden"],
            m["llama3-8b"]["intermediate"]) == (32, 8, 4096, 14336)
    assert (m["qwen2.5-7b"]["heads"], m["qwen2.5-7b"]["heads_kv"], m["qwen2.5-7b"]["hidden"],
            m["qwen2.5-7b"]["intermediate"]) == (28, 4, 3584, 18944)
    assert m["vit-2048"]["causal"] is False
    for c in m.values():
        assert c["heads"] * c["hdim"] in (c["hidden"], c["heads"] * c["hdim"])
        assert c["heads"] % c["heads_kv"] == 0 and c["hdim"] in (64, 128)


# --------------------------------------------------------------------------- reference / tolerance
def test_attention_ref_and_tolerance():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 33, 4, 16, generator=g) for _ in range(3))
    for causal in (False, True):
        ref = bc.attention_ref(q, k, v, causal)
        sd = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                            v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        assert torch.allclose(ref, sd, atol=1e-5)
        rows = torch.tensor([0, 5, 32])
        assert torch.allclose(bc.attention_ref(q, k, v, causal, rows=rows), ref[:, rows], atol=1e-6)
    # GQA: 4 query heads on 2 kv heads == explicit repeat
    k2, v2 = k[:, :, :2], v[:, :, :2]
    assert torch.allclose(bc.attention_ref(q, k2, v2, True),
                          bc.attention_ref(q, k2.repeat_interleave(2, 2),
                                           v2.repeat_interleave(2, 2), True))
    # bottom-right causal with sk > sq: the last query row sees every key
    qs = q[:, :5]
    out = bc.attention_ref(qs, k, v, True)
    assert torch.allclose(out[:, -1], bc.attention_ref(qs, k, v, False)[:, -1], atol=1e-6)
    # tolerance rule: bf16 kernel-like output passes, a perturbed one fails
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    ref = bc.attention_ref(qb, kb, vb, True, upcast=True)
    pt = bc.attention_ref(qb, kb, vb, True, upcast=False)
    good = ref.bfloat16()
    r = bc.tol_check(good, ref, pt)
    assert r["ok"] and r["err"] <= r["err_pt"] * 2 + r["atol"]
    assert not bc.tol_check(good * 1.5, ref, pt)["ok"]
    assert not bc.tol_check(good + float("nan"), ref, pt)["ok"]


# --------------------------------------------------------------------------- JSON writer
def test_result_writer_roundtrip(tmp_path):
    p = tmp_path / "sub" / "r.json"
    w = bc.ResultWriter(str(p), "attn", {"date": "x"}, {"iters": 20})
    assert json.loads(p.read_text())["rows"] == []
    w.add(bc.clean_floats({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2.0}}))
    w.finish(True)
    doc = bc.load_results(str(p))
    assert doc["complete"] and doc["rows"] == [{"a": None, "b": [1.0, None], "c": {"d": 2.0}}]
    assert doc["schema"] == bc.SCHEMA and doc["kind"] == "attn"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError):
        bc.load_results(str(bad))


def test_summarize_ms():
    s = bc.summarize_ms([3.0, 1.0, 2.0, 10.0, 2.5])
    assert s["ms"] == 2.5 and s["ms_min"] == 1.0 and s["ms_max"] == 10.0 and s["n"] == 5


# --------------------------------------------------------------------------- synthetic results
SYN_MAP = {  # our impl key -> baseline row used to make up numbers
    "dash": "DASH non-det", "dash-det": "DASH shift det", "dash-det-ascending": "FA3 det",
    "dash-det-descending": "DASH descending det", "dash-det-shift": "DASH shift det",
    "dash-det-symshift": "DASH shift det", "sdpa-cudnn": "cuDNN non-det",
    "sdpa-flash": "SDPA-flash (FA2) non-det", "sdpa-efficient": None,
    "fa4": "FA4 non-det", "fa4-det": "FA4 det"}
FWD_MAP = {"sdpa-cudnn": "cuDNN", "fa4": "FA4", "fa4-det": "FA4"}


def synthetic_attn_doc():
    base = plot.load_baseline(BASELINE_JSON)
    rows = []
    for sh in bc.attn_grid():
        bwd = plot.baseline_series(base, "bwd", sh["hdim"], sh["mask"])
        fwd = plot.baseline_series(base, "fwd", sh["hdim"], sh["mask"])
        for key, name in SYN_MAP.items():
            impl = bc.IMPLS[key]
            row = impl.describe()
            row.update({k: sh[k] for k in ("batch", "seqlen", "heads", "heads_kv", "hdim",
                                            "mask", "causal")})
            row.update(dtype="bf16", status="ok", reason=None, stage=None,
                       check={"ok": True}, schedule_used=None)
            if not impl.applies_to(sh["mask"]):
                row.update(status="skipped", reason="schedule x is for y masks", fwd=None,
                           bwd=None, check=None)
            elif name is None:
                row.update(status="error", reason="RuntimeError: synthetic failure",
                           stage="bwd", fwd=None, bwd=None, check=None)
            else:
                tb, bit = bwd[name][sh["seqlen"]]
                tf = fwd.get(FWD_MAP.get(key, "FA3"))[sh["seqlen"]][0]
                row["fwd"] = dict(ms=1.0, tflops=tf)
                row["bwd"] = dict(ms=2.0, tflops=tb)
                row["bitwise_repeat"] = bool(impl.deterministic or bit)
                if key == "dash-det":
                    row["schedule_used"] = "shift" if sh["mask"] == "full" else "descending"
            rows.append(row)
    # one failing correctness check, one non-bitwise deterministic row
    for r in rows:
        if r["impl"] == "dash-det-descending" and r["hdim"] == 64 and r["seqlen"] == 512 \
                and r["mask"] == "causal":
            r["check"] = dict(ok=False, out_slice=dict(err=1.0, err_pt=0.01, atol=0.01, ok=False))
        if r["impl"] == "dash-det-ascending" and r["hdim"] == 128 and r["seqlen"] == 1024 \
                and r["mask"] == "full":
            r["bitwise_repeat"] = False
            r["repeat_max_abs_dev"] = dict(dq=1e-4, dk=0.0, dv=0.0)
    meta = dict(date="2026-12-01T00:00:00+00:00", gpu="NVIDIA H200", sm_count=132,
                compute_capability="9.0", driver="580.159", torch="2.13.0", cuda="13.0",
                cudnn=91900, git_commit="abc123", git_dirty=False, git_branch="main",
                command="python benchmarks/bench_attn.py --json x.json")
    return dict(schema=bc.SCHEMA, schema_version=1, kind="attn", meta=meta,
                config=dict(iters=20, warmup=5, sets=3, repeats=5, dtype="bf16", tokens=16384,
                            hidden=2048), rows=rows, complete=True, exit_reason=None)


def synthetic_block_doc():
    rows = []
    for model in ("llama3-8b", "vit-2048"):
        cfg = bblock.MODELS[model]
        for s in (4096, 8192):
            for key, ms in (("sdpa", 100.0), ("dash", 90.0), ("dash-det", 92.0),
                            ("dash-det-ascending", 95.0)):
                row = bc.IMPLS[key].describe()
                row.update(model=model, seqlen=s, batch=1, mask="causal" if cfg["causal"]
                           else "full", status="ok", reason=None, stage=None,
                           fwd=dict(ms=ms / 3), step=dict(ms=ms * s / 4096),
                           bwd_ms_est=ms * s / 4096 - ms / 3,
                           bitwise_repeat=key != "dash" and key != "sdpa",
                           nonbitwise=None if key.startswith("dash-det") else ["x"],
                           out_max_abs_diff_vs_ref=None if key == "sdpa" else 1e-3,
                           dx_max_abs_diff_vs_ref=None if key == "sdpa" else 2e-3)
                rows.append(row)
    rows.append(dict(bc.IMPLS["dash-det"].describe(), model="vit-2048", seqlen=16384,
                     batch=1, mask="full", status="oom", reason="OutOfMemoryError: x",
                     stage="step", fwd=None, step=None, bwd_ms_est=None))
    meta = dict(date="2026-12-01", gpu="NVIDIA H200", sm_count=132, driver="580",
                torch="2.13", cuda="13.0", git_commit="abc", command="python bench_block.py")
    return dict(schema=bc.SCHEMA, schema_version=1, kind="block", meta=meta,
                config=dict(iters=20, repeats=5, batch=1, dtype="bf16",
                            models={m: bblock.MODELS[m] for m in ("llama3-8b", "vit-2048")}),
                rows=rows, complete=False, exit_reason="watchdog timeout in x")


def _table(md, heading):
    """Rows (lists of cells) of the Markdown table following `heading`."""
    lines = md.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith(heading))
    out = []
    for line in lines[i + 1:]:
        if not line.startswith("|"):
            if out:
                break
            continue
        if not line.startswith("|---"):
            out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def test_group_best_and_tax():
    doc = synthetic_attn_doc()
    groups = bc.group_attn(doc["rows"])
    assert list(groups) == [(64, "full"), (64, "causal"), (128, "full"), (128, "causal")]
    g = groups[(64, "full")]
    assert g["seqlens"] == bc.SEQLENS and g["impls"][0] == "dash"
    # hdim 64 full 2k: ours best det = DASH shift 404, best non-det = FA3-2508? not a row of
    # ours; among synthetic rows: DASH 437, cuDNN 370, FA2 229, FA4 436 -> 437
    best_d = bc.best_tflops(g, 2048, "bwd", bc.is_ours_det)
    best_n = bc.best_tflops(g, 2048, "bwd", bc.is_nondet)
    assert best_d[0] == 404 and best_n[0] == 437 and best_n[1] == "dash"
    assert bc.determinism_tax(g, 2048) == pytest.approx(1 - 404 / 437)
    # a row whose check failed never counts as best
    gc = groups[(64, "causal")]
    assert bc.best_tflops(gc, 512, "bwd", bc.is_ours_det)[1] != "dash-det-descending"
    assert bc.attn_cell(gc["rows"][("dash-det-descending", 512)], "bwd").endswith("*!")
    assert bc.attn_cell(gc["rows"][("sdpa-efficient", 512)], "bwd") == "err"
    assert bc.attn_cell(gc["rows"][("dash-det-shift", 512)], "bwd") == "–"


def test_attn_markdown(tmp_path):
    doc = synthetic_attn_doc()
    base = plot.load_baseline(BASELINE_JSON)
    md = plot.attn_markdown(doc, base)
    head = md.split("\n## ")[0]
    for s in ("2026-12-01", "NVIDIA H200", "132 SMs", "driver 580.159", "torch 2.13.0",
              "CUDA 13.0", "abc123", "python benchmarks/bench_attn.py --json x.json"):
        assert s in head, s
    t = _table(md, "## Backward, hdim 64, full mask")
    assert t[0] == ["implementation", "512", "1k", "2k", "4k", "8k", "16k"]
    byname = {r[0]: r[1:] for r in t}
    assert byname["dash det auto"][0] == "253*"  # det rows bitwise -> '*'
    assert byname["dash non-det"][0] == "248"
    assert byname["dash det symmetric_shift"] == ["–"] * 6
    assert byname["SDPA-efficient non-det"] == ["err"] * 6
    assert byname["**best non-deterministic (all)**"][2] == "**437**"
    assert byname["determinism tax (ours)"][2] == f"{100 * (1 - 404 / 437):.1f}%"
    assert byname["_ref 2026-11-30: FA3 det_"][0] == "_183*_"
    tc = {r[0]: r[1:] for r in _table(md, "## Backward, hdim 64, causal mask")}
    assert tc["dash det descending"][0] == "138*!"
    t128 = {r[0]: r[1:] for r in _table(md, "## Backward, hdim 128, full mask")}
    assert t128["dash det ascending"][1] == "318"  # not bitwise -> no star
    fwd = _table(md, "## Forward")
    assert fwd[0][:3] == ["implementation", "hdim", "mask"]
    assert ["cuDNN non-det", "64", "full", "294", "375", "433", "422", "437", "445"] in fwd
    assert any(r[0] == "_ref: FA3_" for r in fwd)
    assert "## Determinism tax" in md and "## Schedule picked by `auto`" in md
    fails = md.split("## Checks and failures")[1]
    assert "check FAILED** dash-det-descending" in fails
    assert "not bitwise reproducible** dash-det-ascending" in fails
    assert "sdpa-efficient: error at `bwd`" in fails
    assert "schedule x" not in fails  # inapplicable schedules are not failures
    md_nobase = plot.attn_markdown(doc, None)
    assert "_ref" not in md_nobase


def test_plot_attn_files(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic_attn_doc()
    p = tmp_path / "2026-12-01-attn.json"
    p.write_text(json.dumps(doc))
    out = plot.process(str(p), baseline=BASELINE_JSON)
    assert out["md"] == str(tmp_path / "2026-12-01-attn.md")
    assert sorted(os.path.basename(x) for x in out["png"]) == ["2026-12-01-attn-tax.png",
                                                               "2026-12-01-attn.png"]
    for x in out["png"]:
        with open(x, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(x) > 10000
    assert open(out["md"]).read().startswith("# Attention benchmark: 2026-12-01-attn")
    # CLI entry, other outdir, no baseline, Markdown only
    assert plot.main([str(p), "--outdir", str(tmp_path / "o"), "--no-png"]) == 0
    assert os.path.exists(tmp_path / "o" / "2026-12-01-attn.md")
    assert not os.path.exists(tmp_path / "o" / "2026-12-01-attn.png")
    assert "_ref" not in open(tmp_path / "o" / "2026-12-01-attn.md").read()
    # --baseline before the positional files must not swallow one of them
    q = tmp_path / "second.json"
    q.write_text(json.dumps(doc))
    assert plot.main(["--baseline", str(p), str(q), "--outdir", str(tmp_path / "b"),
                      "--no-png"]) == 0
    for stem in ("2026-12-01-attn", "second"):
        assert "_ref 2026-11-30" in open(tmp_path / "b" / f"{stem}.md").read()


def test_plot_partial_results(tmp_path):
    """A run cut short (few rows, errors only in a group) must still render."""
    pytest.importorskip("matplotlib")
    doc = synthetic_attn_doc()
    doc["rows"] = [r for r in doc["rows"] if r["hdim"] == 64 and r["mask"] == "full"
                   and r["seqlen"] <= 1024] + [
        dict(impl="dash-det", label="dash det auto", family="dash", deterministic=True,
             hdim=128, mask="causal", seqlen=512, status="timeout", reason="watchdog")]
    doc["complete"], doc["exit_reason"] = False, "watchdog timeout"
    p = tmp_path / "partial.json"
    p.write_text(json.dumps(doc))
    out = plot.process(str(p), baseline=BASELINE_JSON)
    md = open(out["md"]).read()
    assert "INCOMPLETE RUN" in md and "hang" in md
    assert len(out["png"]) == 2


def test_block_markdown_and_png(tmp_path):
    doc = synthetic_block_doc()
    md = plot.block_markdown(doc)
    t = {r[0]: r[1:] for r in _table(md, "## llama3-8b")}
    assert t["attention"] == ["4k", "8k"]
    assert t["SDPA default"] == ["100.0", "200.0"]
    assert t["dash det auto"][0] == "92.0* (0.920×)"
    assert t["step cost of determinism (dash det auto vs dash non-det)"][0] == "+2.2%"
    assert t["dash det auto vs dash det ascending"][0] == "-3.2%"
    v = {r[0]: r[1:] for r in _table(md, "## vit-2048")}
    assert v["dash det auto"][2] == "oom"
    assert "INCOMPLETE RUN" in md and "dash-det: oom at `step`" in md
    pytest.importorskip("matplotlib")
    p = tmp_path / "blk.json"
    p.write_text(json.dumps(doc))
    out = plot.process(str(p))
    assert [os.path.basename(x) for x in out["png"]] == ["blk.png"]


def test_bench_summaries_render():
    txt = battn.summary_text(synthetic_attn_doc()["rows"])
    assert "hdim 64 full" in txt and "253* / 242" in txt and "det tax" in txt
    assert "sdpa-efficient" in txt  # listed under "Not measured"
    txt = bblock.summary_text(synthetic_block_doc()["rows"])
    assert "llama3-8b" in txt and "92.0* (0.920)" in txt


# --------------------------------------------------------------------------- baseline JSON
def test_baseline_json():
    base = plot.load_baseline(BASELINE_JSON)
    rows = base["rows"]
    assert len(rows) == 4 * 14 + 12
    s = plot.baseline_series(base, "bwd", 64, "full")
    assert s["FA3 det"][512] == (183.0, True) and s["FA3 non-det"][512] == (214.0, False)
    assert s["best non-deterministic"][16384][0] == 510.0
    s = plot.baseline_series(base, "bwd", 128, "causal", ["best deterministic", "FA4 det"])
    assert list(s) == ["best deterministic", "FA4 det"] and s["FA4 det"][8192][0] == 491.0
    f = plot.baseline_series(base, "fwd", 128, "full")
    assert f["cuDNN"][512][0] == 444.0
    tax = plot.baseline_tax(base, 64, "full", "FA3 det")
    assert tax[2048] == pytest.approx(1 - 308 / 442)
    for r in rows:
        assert sorted(int(k) for k in r["tflops"]) == bc.SEQLENS


@pytest.mark.skipif(not os.path.exists(BASELINE_MD), reason="design doc not available")
def test_baseline_json_matches_markdown():
    """Every number of h200-baselines.md is in the JSON (cell text -> value, '*' -> bitwise)."""
    base = plot.load_baseline(BASELINE_JSON)
    text = open(BASELINE_MD).read()
    n = 0
    for r in base["rows"]:
        name = f"**{r['impl']}**" if r["summary"] else r["impl"]
        cells = []
        for s in bc.SEQLENS:
            v = f"{r['tflops'][str(s)]:.0f}" + ("*" if r["bitwise"][str(s)] else "")
            cells.append(f"**{v}**" if r["summary"] else v)
        if r["pass"] == "bwd":
            line = "| " + " | ".join([name] + cells) + " |"
        else:
            line = "| " + " | ".join([name, str(r["hdim"]), r["mask"]] + cells) + " |"
        assert line in text, line
        n += 1
    assert n == 68


# --------------------------------------------------------------------------- CLI
def _run(args, env_extra=None):
    env = dict(os.environ)
    env.pop("FAD_BENCH_CPU", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("script", ["bench_attn.py", "bench_block.py", "plot.py", "bench_host.py"])
def test_cli_help(script):
    r = _run([os.path.join("benchmarks", script), "--help"])
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout


def test_cli_dry_run_and_no_cuda():
    r = _run(["benchmarks/bench_attn.py", "--dry-run"])
    assert r.returncode == 0 and "24 shapes x 11 implementations = 264 rows" in r.stdout
    r = _run(["benchmarks/bench_block.py", "--quick", "--dry-run"])
    assert r.returncode == 0 and "llama3-8b" in r.stdout
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the no-CUDA exit path is not reachable")
    for script, args in (("bench_attn.py", ["--quick"]), ("bench_block.py", ["--quick"])):
        r = _run([os.path.join("benchmarks", script)] + args)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "no CUDA device" in r.stderr and "Traceback" not in r.stderr


def test_readme_section_uses_only_the_named_run(tmp_path):
    from benchmarks import update_readme as mod

    def row(impl, bwd, fwd=None, bitwise=True):
        return {"impl": impl, "hdim": 128, "mask": "causal", "seqlen": 8192, "status": "ok", "bitwise_repeat": bitwise,
                "bwd": {"tflops": bwd}, "fwd": {"tflops": fwd} if fwd else None}

    rows = [row("dash-det", 512.4, 600.0), row("dash", 520.0, 601.0, False), row("fa4-det", 500.0, 640.0),
            row("fa4", 560.0, 640.0, False), row("sdpa-cudnn", 480.0, 590.0, False)]
    doc = {"meta": {"date": "2026-12-01T00:00:00", "git_commit": "abcdef123", "flash_attn_4": "4.0.0b36"}, "rows": rows}
    text = mod.section(doc, "run.json")
    assert "| 128 | causal | ours det `auto` | 512* |" in text
    assert "| 128 | causal | FA4 non-det | 560 |" in text and "| 128 | causal | cuDNN non-det | 480 |" in text
    assert "| 128 | causal | FA4 | 640 |" in text  # forward table
    assert f"| 128 | causal | bwd det `auto` / FA4 det | {512.4 / 500.0:.3f} |" in text
    assert f"| 128 | causal | fwd / FA4 | {601.0 / 640.0:.3f} |" in text  # the non-det row's forward
    assert "commit abcdef1" in text and "4.0.0b36" in text and "_" not in text.split("\n")[4]
    no_fa4 = mod.section({"meta": doc["meta"], "rows": rows[:2]}, "run.json")
    assert "FA4" not in no_fa4.split("Full tables")[0].split("FlashAttention-4")[1] and "Ratios" not in no_fa4


def test_record_failure_skips_our_value_errors_and_records_the_rest():
    row = {}
    bc.record_failure(row, bc.IMPLS["dash-det-shift"], ValueError("schedule='shift' is defined for full masks"), "fwd")
    assert row["status"] == "skipped" and "full masks" in row["reason"] and row["stage"] == "fwd"
    row = {}
    bc.record_failure(row, bc.IMPLS["sdpa-cudnn"], ValueError("no kernel"), "bwd")
    assert row["status"] == "error" and row["reason"].startswith("ValueError") and "traceback" in row


def test_fatal_if_context_broken(monkeypatch):
    row = {"reason": "RuntimeError: boom"}
    monkeypatch.setattr(bc, "cuda_healthy", lambda: None)
    assert bc.fatal_if_context_broken(row, "dash 2k") is None and row["reason"] == "RuntimeError: boom"
    monkeypatch.setattr(bc, "cuda_healthy", lambda: "illegal address")
    fatal = bc.fatal_if_context_broken(row, "dash 2k")
    assert fatal == "CUDA context unusable after dash 2k: illegal address" and row["reason"].endswith(fatal)


def test_bench_host_runs_without_a_gpu(tmp_path):
    out = tmp_path / "host.json"
    r = _run(["benchmarks/bench_host.py", "--calls", "20", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 12 and all(row["new_shape_us"] > 0 and row["launch"]["grid"] >= 1 for row in rows)
    assert "worst first decision of a shape" in r.stdout
    r = _run(["benchmarks/bench_host.py", "--calls", "3"])
    assert r.returncode == 2 and "--calls" in r.stderr
