"""CPU tests of benchmarks/bench_varlen.py and of bench_host.py's varlen section (no GPU, no meaningful timings).

Pack generator, FLOP count, argument parsing and implementation selection, the nested-tensor SDPA wrapper (on the
math backend), the summary's ratios, the JSON rows of a CPU self-test run and the no-CUDA exit.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import bench_host  # noqa: E402
from benchmarks import bench_varlen as bv  # noqa: E402
from benchmarks import common as bc  # noqa: E402


# --------------------------------------------------------------------------- packs
@pytest.mark.parametrize("tokens", [256, 16384, 65536])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_pareto_pack_is_a_function_of_tokens_and_seed_and_within_bounds(tokens, seed):
    p = bv.pareto_pack(tokens, seed)
    assert p == bv.pareto_pack(tokens, seed)
    assert sum(p.lengths) == tokens and all(bv.PARETO_MIN <= n <= tokens for n in p.lengths)
    assert p.offsets()[0] == 0 and p.offsets()[-1] == tokens and len(p.offsets()) == len(p.lengths) + 1
    d = p.describe()
    assert d["lengths"] == list(p.lengths) and d["n_docs"] == len(p.lengths) and d["max_seqlen"] == max(p.lengths)
    assert d["pack"] == f"{bc.seqlen_label(tokens)} s{seed}" and d["seed"] == seed and d["seqlen"] is None


def test_pareto_packs_are_pinned_and_long_tailed():
    # The committed benchmark packs: a change of the generator changes every pareto row, so it must be deliberate.
    assert [(len(bv.pareto_pack(t, s).lengths), bv.pareto_pack(t, s).max_len)
            for t in (16384, 65536) for s in (0, 1)] == [(20, 7435), (41, 2338), (95, 7435), (86, 17166)]
    assert bv.pareto_pack(16384, 0).lengths != bv.pareto_pack(16384, 1).lengths
    lengths = sorted(bv.pareto_pack(65536, 1).lengths)
    assert lengths[-1] > 20 * lengths[len(lengths) // 2]  # a long tail over a short median


def test_uniform_and_small_packs():
    p = bv.uniform_pack(16384, 2048)
    assert p.lengths == (2048,) * 8 and p.label == "2k" and p.seqlen == 2048
    with pytest.raises(ValueError, match="not divisible"):
        bv.uniform_pack(16384, 3000)
    assert bv.small_pack(p, 2048).lengths == (1024, 1024)
    assert bv.small_pack(bv.uniform_pack(1024, 256), 2048).lengths == (256, 256)
    small = bv.small_pack(bv.pareto_pack(65536, 1), 2048)
    assert small == bv.pareto_pack(2048, 1) and small.kind == "pareto"


# --------------------------------------------------------------------------- FLOPs
def brute_force_pairs(length, causal):
    return sum(1 for i in range(length) for j in range(length) if not causal or j <= i)


@pytest.mark.parametrize("lengths", [[1], [2, 1, 5], [17, 3, 64, 1, 9], [128, 7]])
@pytest.mark.parametrize("causal", [False, True])
def test_pack_flops_against_a_brute_force_count(lengths, causal):
    heads, hdim = 3, 16
    want = 4 * heads * hdim * sum(brute_force_pairs(n, causal) for n in lengths)
    assert bv.pack_fwd_flops(lengths, heads, hdim, causal) == want


def test_pack_flops_on_uniform_packs_match_the_dense_convention():
    b, s, h, d = 8, 2048, 16, 128
    lengths = bv.uniform_pack(b * s, s).lengths
    assert bv.pack_fwd_flops(lengths, h, d, False) == bc.attn_fwd_flops(b, h, s, s, d, False)
    # bench_attn counts s^2/2 for causal, the exact count is s(s+1)/2
    assert bv.pack_fwd_flops(lengths, h, d, True) == pytest.approx(bc.attn_fwd_flops(b, h, s, s, d, True) * (s + 1) / s)


# --------------------------------------------------------------------------- arguments
def plan(*argv):
    return bv.plan(bv.build_parser().parse_args(list(argv)))


def test_default_plan():
    shapes, impls = plan()
    assert impls == [k for k in bv.IMPLS if not k.startswith("dash-varlen-kernels") and k not in bv.ORDER_ROWS]
    pareto = [sh for sh in shapes if sh["pack"].kind == "pareto"]
    uniform = [sh for sh in shapes if sh["pack"].kind == "uniform"]
    assert len(pareto) == 2 * 2 * 2 and {sh["mask"] for sh in pareto} == {"causal"}
    assert len(uniform) == 6 * 2 * 2 and {sh["mask"] for sh in uniform} == {"full", "causal"}
    assert {sh["pack"].tokens for sh in uniform} == {16384} and {sh["pack"].seqlen for sh in uniform} == set(bc.SEQLENS)
    assert {(sh["hdim"], sh["heads"], sh["heads_k"]) for sh in shapes} == {(64, 32, 32), (128, 16, 16)}
    assert all(sh["causal"] == (sh["mask"] == "causal") for sh in shapes)
    # ours dense runs on uniform packs only: 5 implementations on pareto packs, 8 on uniform ones
    assert sum(bv.IMPLS[k].runs_on(sh) for sh in shapes for k in impls) == 8 * 5 + 24 * 8
    # the named-order rows: diagonal on causal masks only (the 8 pareto shapes and 12 causal uniform ones)
    orders = plan("--impl", "ours-varlen-orders")[1]
    assert sum(bv.IMPLS[k].runs_on(sh) for sh in shapes for k in orders) == 2 * 32 + 20


def test_quick_plan_and_options():
    args = bv.build_parser().parse_args(["--quick"])
    shapes, _ = bv.plan(args)
    assert args.budget_s == 120.0
    assert {sh["pack"].seed for sh in shapes if sh["pack"].kind == "pareto"} == {0}
    assert {sh["pack"].seqlen for sh in shapes if sh["pack"].kind == "uniform"} == set(bc.QUICK_SEQLENS)
    shapes, _ = plan("--packs", "pareto", "--pack-tokens", "4k", "--seeds", "3,4", "--mask", "full,causal",
                     "--hdim", "128", "--heads-k", "4")
    assert [(sh["pack"].label, sh["mask"]) for sh in shapes] == [
        ("4k s3", "full"), ("4k s4", "full"), ("4k s3", "causal"), ("4k s4", "causal")]
    assert {(sh["heads"], sh["heads_k"]) for sh in shapes} == {(16, 4)}


def test_impl_selection():
    assert plan("--impl", "ours")[1] == [k for k in bv.IMPLS if k.startswith("dash-")]
    assert plan("--impl", "fa4*,cudnn-varlen")[1] == ["fa4-varlen", "fa4-varlen-det", "cudnn-varlen"]
    assert plan("--impl", "dash-varlen-det", "--impl", "ours-dense")[1] == [
        "dash-varlen-det", "dash-dense", "dash-dense-det", "dash-dense-det-descending"]
    assert [k for k in bv.IMPLS if bv.IMPLS[k].bitwise_as_dense] == [
        "dash-varlen-det", "dash-varlen-det-descending", "dash-varlen-det-diagonal", "dash-varlen-kernels-det",
        "dash-dense-det-descending"]
    assert plan("--impl", "ours-varlen-orders")[1] == ["dash-varlen-det", "dash-varlen-det-descending",
                                                       "dash-varlen-det-diagonal"]
    assert not set(bv.ORDER_ROWS) & set(plan()[1])  # not in the default rows
    assert [k for k in bv.IMPLS if bv.IMPLS[k].varlen_kernels] == ["dash-varlen-kernels", "dash-varlen-kernels-det"]
    assert plan("--impl", "ours-varlen")[1] == ["dash-varlen", "dash-varlen-det", "dash-varlen-kernels",
                                                "dash-varlen-kernels-det"]
    assert bv.IMPLS["dash-dense"].describe()["api"] == "dense" and bv.IMPLS["fa4-varlen"].describe()["api"] == "varlen"


@pytest.mark.parametrize("argv, message", [
    (["--impl", "nope"], "unknown implementation 'nope'"),
    (["--heads-k", "3"], "--heads-k 3 must divide the 32 query heads"),
    (["--iters", "5"], "--iters must be >= 20"),
    (["--packs", "ragged"], "unknown pack kind 'ragged'"),
    (["--mask", "sliding"], "unknown mask 'sliding'"),
    (["--pack-tokens", "100"], "pareto packs need >= 128 tokens"),
    (["--seqlen", "3000"], "not divisible by seqlen 3000"),
    (["--check-tokens", "200"], "--check-tokens must be >= 256"),
])
def test_bad_arguments_exit_with_a_message(argv, message):
    with pytest.raises(SystemExit, match=message):
        plan(*argv)


# --------------------------------------------------------------------------- implementations
def test_nested_sdpa_wrapper_matches_per_document_attention():
    torch = pytest.importorskip("torch")
    pack = bv.Pack("pareto", 40, (3, 17, 20))
    heads, heads_k, d = 4, 2, 8
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(40, heads, d, generator=g) for _ in range(2))
    k, v = (torch.randn(40, heads_k, d, generator=g) for _ in range(2))
    cu = torch.tensor(pack.offsets(), dtype=torch.int32)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = bv.nested_sdpa_fn(pack, False, cu, "MATH")(*leaves)  # the math backend takes no causal nested input
    got = (out,) + torch.autograd.grad(out, leaves, do)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = torch.cat([bc.attention_ref(*(t[a:b][None] for t in ref_leaves), False)[0]
                     for a, b in zip(pack.offsets()[:-1], pack.offsets()[1:])])
    want = (ref,) + torch.autograd.grad(ref, ref_leaves, do)
    for x, y in zip(got, want):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y)
    with pytest.raises(bc.ImplUnavailable, match="No viable backend"):  # a backend without kernels for the inputs
        bv.nested_sdpa_fn(pack, True, cu, "MATH")(q, k, v)


def test_rows_that_cannot_run_here_are_unavailable(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # FA4 not installed
    pack = bv.uniform_pack(256, 128)
    with pytest.raises(bc.ImplUnavailable, match="flash_attn.cute"):
        bv.make_fn(bv.IMPLS["fa4-varlen-det"], pack, True, None)
    monkeypatch.delenv("FAD_BENCH_CPU", raising=False)
    monkeypatch.setattr(bc, "bench_device", lambda: "cpu")
    with pytest.raises(bc.ImplUnavailable, match="needs CUDA tensors"):
        bv.make_fn(bv.IMPLS["cudnn-varlen"], pack, True, None)


# --------------------------------------------------------------------------- output
def synthetic_row(impl, pack, bwd, fwd, check_ok=True):
    row = bv.IMPLS[impl].describe()
    row.update(pack.describe(), hdim=128, mask="causal", status="ok", reason=None, stage=None,
               fwd=dict(ms=1.0, tflops=fwd), bwd=dict(ms=2.0, tflops=bwd), bitwise_repeat=True,
               check=dict(ok=check_ok))
    return row


def test_summary_ratios():
    u, p = bv.uniform_pack(16384, 8192), bv.pareto_pack(16384, 0)
    rows = [synthetic_row("dash-varlen", u, 495.0, 600.0), synthetic_row("dash-dense", u, 500.0, 600.0),
            synthetic_row("dash-varlen-det", u, 480.0, 600.0),
            synthetic_row("dash-dense-det-descending", u, 400.0, 600.0, check_ok=False),
            synthetic_row("dash-varlen-det", p, 450.0, 500.0), synthetic_row("fa4-varlen-det", p, 500.0, 400.0),
            dict(synthetic_row("fa4-varlen", p, 0, 0), status="skipped", reason="FA4 missing", fwd=None, bwd=None),
            synthetic_row("dash-varlen-det-diagonal", p, 460.0, 500.0),
            synthetic_row("dash-varlen-det-descending", p, 400.0, 500.0)]
    text = bv.summary_text(rows)
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["varlen / dense non-det (>= 0.97)"].split()[-3:] == ["0.990", "/", "1.000"]
    assert lines["varlen det / dense det descending (>= 0.97)"].split()[-1] == "-"  # a failed check is no baseline
    assert lines["det / FA4 det (>= 1)"].split()[-3:] == ["0.900", "/", "1.250"]
    assert lines["det / FA4 non-det (>= 0.97)"].split()[-1] == "-"
    assert lines["det diagonal / det descending"].split()[-3:] == ["1.150", "/", "1.000"]
    assert "480* / 600" in text and "400*! / 600" in text
    assert "fa4-varlen" in text and "FA4 missing" in text and "pareto/16k s0/hdim128/causal" in text
    assert "WARNING: correctness check failed: dash-dense-det-descending/uniform/8k/hdim128/causal" in text


# --------------------------------------------------------------------------- runs
def test_cpu_self_test_rows(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("FAD_BENCH_CPU", "1")
    monkeypatch.setattr(bc, "MIN_ITERS", 1)  # structure only: the CPU timings mean nothing
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # FA4 absent, also where it is installed
    make_fn = bv.make_fn

    def nested_on_math(impl, pack, causal, cu, *features):  # reaches the first call, where math refuses causal
        if impl.family == "sdpa":
            return bv.nested_sdpa_fn(pack, causal, cu, "MATH")
        return make_fn(impl, pack, causal, cu, *features)
    monkeypatch.setattr(bv, "make_fn", nested_on_math)
    fad = bc.dash_module()
    dense_orders = []  # the schedule of every dense call (the rows' and the checks' per-document ones)

    class DenseOrders:
        def __getattr__(self, name):
            return getattr(fad, name)

        def flash_attn_func(self, *args, **kw):
            dense_orders.append(kw.get("schedule"))
            return fad.flash_attn_func(*args, **kw)
    monkeypatch.setattr(bc, "dash_module", DenseOrders)
    out = tmp_path / "varlen.json"
    code = bv.main(["--pack-tokens", "256", "--seeds", "0", "--tokens", "256", "--seqlen", "128", "--mask", "causal",
                    "--hidden", "128", "--hdim", "64", "--heads-k", "1", "--check-tokens", "256", "--iters", "1",
                    "--warmup", "0", "--sets", "1", "--repeats", "2", "--pad-us", "0", "--json", str(out), "--impl",
                    "dash-varlen-det,dash-dense-det-descending,fa4-varlen,cudnn-varlen"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "varlen" and doc["complete"] is True and doc["schema"] == bc.SCHEMA
    assert doc["config"]["pareto"]["scale"] == bv.PARETO_MIN
    rows = {(r["impl"], r["pack_kind"]): r for r in doc["rows"]}
    assert sorted(rows) == sorted([("dash-varlen-det", "pareto"), ("fa4-varlen", "pareto"),
                                   ("cudnn-varlen", "pareto"), ("dash-varlen-det", "uniform"),
                                   ("dash-dense-det-descending", "uniform"), ("fa4-varlen", "uniform"),
                                   ("cudnn-varlen", "uniform")])
    for (impl, kind), r in rows.items():
        pack = bv.pareto_pack(256, 0) if kind == "pareto" else bv.uniform_pack(256, 128)
        assert r["lengths"] == list(pack.lengths) and r["tokens"] == 256 and r["n_docs"] == len(pack.lengths)
        assert (r["heads"], r["heads_kv"], r["hdim"], r["mask"], r["causal"]) == (2, 1, 64, "causal", True)
        if impl.startswith("dash-"):
            assert r["status"] == "ok", r.get("reason")
            flops = bv.pack_fwd_flops(pack.lengths, 2, 64, True)
            assert r["fwd"]["flops"] == flops and r["bwd"]["flops"] == 2.5 * flops
            assert r["bwd"]["tflops"] == pytest.approx(bc.tflops(2.5 * flops, r["bwd"]["ms"]))
            assert r["bitwise_repeat"] is True and r["n_repeats"] == 2
            assert r["check"]["ok"] is True and r["check"]["out_slice"]["ok"] is True
            small = r["check"]["small"]
            assert small["bitwise_vs_dense"] is True and (small["heads"], small["heads_kv"]) == (4, 2)
            assert small["lengths"] == list(bv.small_pack(pack, 256).lengths)
            assert all(small[nm]["ok"] for nm in ("out", "dq", "dk", "dv"))
        elif impl == "fa4-varlen":
            assert r["status"] == "skipped" and r["fwd"] is None and "flash_attn.cute" in r["reason"]
        else:
            assert r["status"] == "skipped" and r["stage"] == "first_call" and "No viable backend" in r["reason"]
    # hdim 64, causal: deterministic varlen auto runs diagonal (launch.varlen_request), and the bitwise check compares
    # each document with its dense call in that order (the contract), not in descending
    assert rows[("dash-varlen-det", "pareto")]["schedule_used"] == {"diagonal": len(bv.pareto_pack(256, 0).lengths)}
    for kind in ("pareto", "uniform"):
        small = rows[("dash-varlen-det", kind)]["check"]["small"]
        assert small["dense_schedules"] == {"diagonal": len(small["lengths"])}
    assert rows[("dash-dense-det-descending", "uniform")]["schedule_used"] == "descending"
    small = rows[("dash-dense-det-descending", "uniform")]["check"]["small"]
    assert small["dense_schedules"] == {"descending": len(small["lengths"])}
    assert dense_orders.count("diagonal") == sum(len(rows[("dash-varlen-det", kind)]["check"]["small"]["lengths"])
                                                 for kind in ("pareto", "uniform"))


@pytest.mark.parametrize("lengths", [[1], [2, 1, 5], [17, 3, 64, 1, 9], [300, 7]])
@pytest.mark.parametrize("left", [0, 4, 127])
def test_windowed_pack_flops_against_a_brute_force_count(lengths, left):
    want = 4 * 3 * 16 * sum(1 for n in lengths for i in range(n) for j in range(n) if i - left <= j <= i)
    assert bv.pack_fwd_flops(lengths, 3, 16, True, left) == want


def test_window_needs_the_causal_masks():
    with pytest.raises(SystemExit, match="--window runs on the causal masks"):
        plan("--window", "127", "--mask", "full,causal")
    with pytest.raises(SystemExit, match="--window must be >= 0"):
        plan("--window", "-2")
    shapes, _ = plan("--window", "127", "--sink", "--packs", "uniform")
    assert {(sh["mask"], sh["window_left"], sh["sink"]) for sh in shapes} == {("causal", 127, True)}


def test_cpu_self_test_with_a_window_and_sinks(tmp_path, monkeypatch):
    """gpt-oss-shaped rows on the CPU reference: ours run the window and the sinks (checked against the benchmark's own
    reference with both, and bit for bit against per-document dense calls), cuDNN's nested rows say why they cannot."""
    pytest.importorskip("torch")
    monkeypatch.setenv("FAD_BENCH_CPU", "1")
    monkeypatch.setattr(bc, "MIN_ITERS", 1)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    out = tmp_path / "varlen.json"
    code = bv.main(["--pack-tokens", "512", "--seeds", "0", "--packs", "pareto", "--hidden", "128", "--hdim", "64",
                    "--heads-k", "1", "--window", "127", "--sink", "--check-tokens", "512", "--iters", "1",
                    "--warmup", "0", "--sets", "1", "--repeats", "2", "--pad-us", "0", "--json", str(out), "--impl",
                    "dash-varlen-det,dash-varlen,cudnn-varlen"])
    assert code == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    pack = bv.pareto_pack(512, 0)
    for impl in ("dash-varlen-det", "dash-varlen"):
        r = rows[impl]
        assert r["status"] == "ok", r.get("reason")
        assert (r["window_left"], r["sink"]) == (127, True)
        assert r["fwd"]["flops"] == bv.pack_fwd_flops(pack.lengths, 2, 64, True, 127)
        assert r["check"]["ok"] is True and r["check"]["small"]["bitwise_vs_dense"] is True
    assert rows["cudnn-varlen"]["status"] == "skipped" and "sliding window" in rows["cudnn-varlen"]["reason"]


def test_no_cuda_exits_with_code_2(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the no-CUDA exit path is not reachable")
    monkeypatch.delenv("FAD_BENCH_CPU", raising=False)
    with pytest.raises(SystemExit) as e:
        bv.main(["--quick"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "bench_varlen.py: no CUDA device available" in err and "--dry-run" in err


def test_script_help_and_dry_run():
    env = dict(os.environ)
    env.pop("FAD_BENCH_CPU", None)

    def run(*argv):
        return subprocess.run([sys.executable, os.path.join("benchmarks", "bench_varlen.py"), *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=env)
    r = run("--help")
    assert r.returncode == 0 and "usage" in r.stdout and "--heads-k" in r.stdout
    r = run("--dry-run")
    assert r.returncode == 0, r.stderr
    assert "32 shapes, 8 implementations: 232 rows" in r.stdout and "pareto   64k s1 hdim128 causal docs=86" in r.stdout


# --------------------------------------------------------------------------- bench_host.py varlen section
def test_host_pack_lengths():
    for tokens, docs in bench_host.VARLEN_PACKS:
        lengths = bench_host.pack_lengths(tokens, docs)
        assert len(lengths) == docs and sum(lengths) == tokens and min(lengths) >= 1
        assert len(set(lengths[:-1])) == docs - 1  # every new pack's decision misses the cache
    with pytest.raises(ValueError, match="cannot fill"):
        bench_host.pack_lengths(100, 50)


def test_bench_host_varlen_section(tmp_path):
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_host.py", "--section", "varlen", "--varlen-calls", "10",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert "rows" not in doc  # the dense section did not run
    varlen = doc["varlen"]
    assert [(row["tokens"], row["docs"]) for row in varlen["rows"]] == bench_host.VARLEN_PACKS
    parts = {"check_varlen_args", "read_layout", "decisions_new", "decisions_cached", "schedule_used_new",
             "kernel_path"}
    assert all(set(row["us"]) == parts and min(row["us"].values()) > 0 for row in varlen["rows"])
    assert all(row["schedules"] == ["descending"] for row in varlen["rows"])
    assert "device-to-host copy" in varlen["excludes"] and "excluded: kernel launches" in r.stdout
    r = subprocess.run([sys.executable, "benchmarks/bench_host.py", "--varlen-calls", "3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--varlen-calls" in r.stderr
