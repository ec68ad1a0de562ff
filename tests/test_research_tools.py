"""The research probes (research/): their pure parts on CPU, and that each script parses its arguments and stops
cleanly without a GPU."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _run(args):
    return subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_fwd_overhead_fit_recovers_launch_tile_and_block_terms():
    from research import fwd_overhead as fo

    launch, tile, block = 0.004, 0.02, 0.011  # ms; overhead = tile / block steps
    rows = [{"batch": b, "blocks": n, "ms": launch + b * (tile + n * block)} for b in (8, 4) for n in (4, 8, 16, 32, 64)]
    fit = fo.fit_overhead(rows, "ms")
    assert math.isclose(fit["launch_ms"], launch, rel_tol=1e-6)
    assert math.isclose(fit["overhead_steps"], tile / block, rel_tol=1e-6)
    assert fo.least_squares([(1, 0), (1, 1), (1, 2)], [1, 3, 5]) == pytest.approx([1, 2])
    with pytest.raises(ValueError, match="do not determine"):  # one batch size: launch and tile terms collide
        fo.fit_overhead([r for r in rows if r["batch"] == 8], "ms")
    with pytest.raises(ValueError, match="one feature row per y"):
        fo.least_squares([(1.0,)], [1.0, 2.0])
    r = _run(["research/fwd_overhead.py", "--seqlen-k", "2k,2k"])
    assert r.returncode == 2 and "two distinct" in r.stderr


@pytest.mark.parametrize("script", ["fwd_variants.py", "fwd_overhead.py", "ncu_attn.py", "profile_bwd.py",
                                    "bwd_timeline.py", "sass_diff.py", "ncu_sass.py", "varlen_fwd_balance.py",
                                    "portable_orders.py"])
def test_cli_help(script):
    r = _run([os.path.join("research", script), "--help"])
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout


def test_without_cuda_the_probes_stop_with_exit_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the no-CUDA exit path is not reachable")
    for args in (["fwd_variants.py", "x", "--hdim", "128"], ["fwd_overhead.py"], ["bwd_timeline.py"],
                 ["ncu_attn.py", "--impl", "dash,fa4"]):
        r = _run([os.path.join("research", args[0]), *args[1:]])
        assert r.returncode == 2 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = _run(["research/fwd_variants.py", "x", "--hdim", "80"])
    assert r.returncode == 2 and "--hdim takes" in r.stderr


def test_sass_diff_register_renaming():
    from research.sass_diff import registers_renamed

    a = ["IMAD R1, R2, R3, RZ", "ISETP.GE.AND P0, PT, R1, UR4, PT"]
    assert registers_renamed(a, ["IMAD R7, R2, R3, RZ", "ISETP.GE.AND P1, PT, R7, UR4, PT"])
    assert not registers_renamed(a, ["IMAD R7, R2, R3, RZ", "ISETP.GE.AND P1, PT, R1, UR4, PT"])  # R1 -> R7 and R1
    assert not registers_renamed(a, ["IMAD R7, R2, R2, RZ", "ISETP.GE.AND P1, PT, R7, UR4, PT"])  # R2, R3 -> R2
    assert not registers_renamed(a, a[:1])


def test_sass_diff_keys_drop_a_v_head_dim_equal_to_the_qk_one():
    """research/sass_diff.py: a kernel whose traits name a V head dim equal to the QK one keys as the kernel before
    the V head dim existed; an MLA kernel (192, 128) keeps its own key."""
    from research.sass_diff import KEY_RULES

    def key(name):
        for rule, repl in KEY_RULES:
            name = rule.sub(repl, name)
        return name

    fwd = "flash_fwd_kernel_sm90<FwdKernelTraits<192, 128, 96, 2, bf16, 1, true{}>, false, false, false, false>"
    assert key(fwd.format(", 192")) == key(fwd.format(""))
    assert key(fwd.format(", 128")) != key(fwd.format(""))
    bwd = "bwd_kernel_sm90<BwdTraits<bf16, 192, 64, 96, 24, 240, 2, 1, true{}>, true, false, false, true, Ascending>("
    assert key(bwd.format(", 192")) == key(bwd.format(""))
    assert key(bwd.format(", 128")) != key(bwd.format(""))
    plain = "bwd_kernel_sm90<BwdTraits<bf16, 128, 64, 128, 40, 232, 2, 2, false{}>, true, false, false, true, Shift>("
    assert key(plain.format(", 128")) == key(plain.format("")) == key(
        "bwd_kernel_sm90<BwdTraits<bf16, 128>, true, false, false, true, Shift>(")


def test_ncu_sass_reads_the_step_loop_and_keeps_same_named_kernels_apart(tmp_path):
    """research/ncu_sass.py on a two-kernel source page: a block repeated verbatim is dropped, a different kernel of
    the same name (a JIT's two builds) is kept, and the step loop is the instructions executed as often as the most
    frequent HGMMA."""
    from research import ncu_sass

    header = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
              '"Instructions Executed","stall_short_sb","stall_wait"')

    def block(name, rows):
        lines = [f'"Kernel Name","{name}",', header]
        lines += [f'"0x{i:x}","{src}","{smp}","0","{ex}","{sb}","{smp - sb}"' for i, (src, smp, ex, sb) in enumerate(rows)]
        return "\n".join(lines)

    a = [("HGMMA.64x64x16.F32.BF16 R1, gdesc[UR4], RZ", 5, 64, 0), ("FFMA R2, R3, R4, R5", 30, 64, 30),
         ("@!P0 BRA 0x10", 2, 8, 0)]
    b = [("HGMMA.64x80x16.F32.BF16 R1, gdesc[UR4], RZ", 5, 40, 0), ("MUFU.EX2 R2, R2", 1, 40, 0)]
    path = tmp_path / "sass.csv"
    path.write_text("\n".join([block("k1", a), block("k1", a), block("k1", b)]) + "\n")
    kernels = ncu_sass.read_kernels(path)
    assert [(n, len(r)) for n, r in kernels] == [("k1", 3), ("k1", 2)]
    text = ncu_sass.summarize(kernels[0][1], top=2)
    assert "step loop: 2 instructions per warp and step (64 executions each), 1 HGMMA" in text
    assert "short_sb 81.1%" in text and "FFMA R2, R3, R4, R5" in text.splitlines()[-2]
    assert "outside the step loop: 8 instructions executed (5.9%); top 2 by executions:" in text
    assert "@!P0 BRA 0x10" in text.splitlines()[text.splitlines().index(
        "  outside the step loop: 8 instructions executed (5.9%); top 2 by executions:") + 1]
    assert ncu_sass.opcode("@!P0  BRA 0x10") == "BRA" and ncu_sass.opcode("  HGMMA.64x64x16 R1") == "HGMMA"


def test_varlen_fwd_balance_model():
    """research/varlen_fwd_balance.py: a table sorted longest first and dealt in alternating rounds balances a
    uniform causal pack to within 4%, the per-sequence round robin to 0.8 at best; an even split is perfect."""
    from research import varlen_fwd_balance as vb

    costs = vb.causal_costs([2048] * 8, 16, 128)
    assert len(costs) == 8 * 16 * 16 and sorted(set(costs)) == list(range(1, 17))
    assert vb.balance(sorted(costs, reverse=True), 132, True) > 0.96 > 0.8 > vb.balance(costs, 132, False)
    assert vb.balance([3] * 264, 132, False) == 1.0
    assert sum(vb.pareto_pack(16384, 0)) == 16384


def test_varlen_fwd_claims_model():
    """research/varlen_fwd_balance.py's dynamic claims (the varlen forward's scheduler) on the per-sequence table:
    within 2% of even on the uniform causal pack where the round robin is below 0.8, within 4% when each CTA claims a
    tile ahead; and a case worked by hand."""
    from research import varlen_fwd_balance as vb

    costs = vb.causal_costs([2048] * 8, 16, 128)
    claims, ahead = vb.claimed_balance(costs, 132, False), vb.claimed_balance(costs, 132, True)
    assert claims > 0.98 and claims > ahead > 0.96 and vb.balance(costs, 132, False) < 0.8
    # 2 CTAs, tiles 3 1 1 1 2: CTA 1 frees at 1 and 2 and takes tiles 2 and 3, CTA 0 (lower, at the tie at 3) tile 4
    # and ends at 5 (ideal 4); claiming ahead, CTA 0 takes tile 2 at 0, CTA 1 tile 3 at 0 and tile 4 at 1: both end
    # at 4; the round robin ends CTA 0 at 6.
    assert vb.claimed_balance([3, 1, 1, 1, 2], 2, False) == 0.8
    assert vb.claimed_balance([3, 1, 1, 1, 2], 2, True) == 1.0
    assert vb.balance([3, 1, 1, 1, 2], 2, False) == 4 / 6


def _shell_function(script: str, name: str) -> str:
    """The text of shell function `name` in research/`script` (to run it alone)."""
    with open(os.path.join(ROOT, "research", script)) as f:
        text = f.read()
    func = text[text.index(f"{name}() {{"):]
    return func[:func.index("\n}\n") + 3]


def _write_patch(path, paths: list[str]):
    """A patch file at `path` that changes one line of each of `paths`."""
    path.write_text("".join(f"--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-x\n+y\n" for p in paths))
    return path


def test_patch_ab_relinks_only_for_kernel_changes(tmp_path):
    """research/patch_ab.sh's kernel_change: a patch touching what the extension compiles needs a relink, a
    Python-only one runs on the installed build."""
    func = _shell_function("patch_ab.sh", "kernel_change")

    def patch(name: str, paths: list[str]):
        return _write_patch(tmp_path / name, paths)

    cases = {patch("host.patch", ["flash_attn_dash/launch.py", "tests/test_x.py"]): 1,
             patch("hopper.patch", ["flash_attn_dash/variants.py", "hopper/generated/bwd_hdim256_bf16.cu"]): 0,
             patch("binding.patch", ["csrc/flash_api.cpp"]): 0,
             patch("setup.patch", ["setup.py"]): 0}
    for path, rc in cases.items():
        res = subprocess.run(["bash", "-c", f'{func}\nkernel_change "$1"', "-", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == rc, (path.name, res.stderr)


def test_prebuild_reuses_objects_only_of_units_the_patch_cannot_reach(tmp_path):
    """research/prebuild.sh's reaches: FROM's object of a unit stands in for the patched tree's only when the unit's
    #include closure under hopper/ holds no file the patches touch (the unit itself included)."""
    func = _shell_function("prebuild.sh", "reaches")

    def patch(name: str, paths: list[str]):
        return _write_patch(tmp_path / name, paths)

    fwd, bwd = "hopper/generated/fwd_hdim128_bf16.cu", "hopper/generated/bwd_hdim128_bf16.cu"
    cases = {(fwd, patch("bwd.patch", ["hopper/bwd/epilogue.hpp", "hopper/bwd/mainloop.hpp"])): 1,
             (fwd, patch("policies.patch", ["hopper/schedule/policies.hpp", "flash_attn_dash/schedule/orders.py"])): 1,
             (bwd, tmp_path / "policies.patch"): 0,
             (fwd, patch("common.patch", ["hopper/common/utils.hpp"])): 0,
             (bwd, tmp_path / "common.patch"): 0,
             (fwd, patch("unit.patch", ["flash_attn_dash/variants.py", fwd])): 0,
             (bwd, tmp_path / "unit.patch"): 1,
             (fwd, tmp_path / "bwd.patch", patch("fwd.patch", ["hopper/fwd/mainloop.hpp"])): 0}
    for (unit, *paths), rc in cases.items():
        res = subprocess.run(["bash", "-c", f'{func}\nreaches "$@"', "-", str(ROOT), unit, *map(str, paths)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == rc, (unit, [p.name for p in paths], res.stderr)


def test_portable_orders_overlapped_model_on_one_cta():
    """On one CTA a hand-off of half a step never waits: every step costs one compute (the add overlaps the next),
    plus the last add and one claim per tile after the first on the dynamic grid; a static grid claims nothing."""
    from flash_attn_dash.schedule import build_plan
    from research.portable_orders import overlapped_makespan

    for schedule in ("descending", "split", "symmetric_shift"):
        plan = build_plan("causal", 1024, 1024, 64, 128, 2, 3, 1, schedule)
        claims = plan.batch * plan.heads * plan.grid.num_n - 1 if schedule != "symmetric_shift" else 0
        got = overlapped_makespan(plan, r=0.3, lam=0.5, kappa=0.4, ctail=0.2)
        assert got == pytest.approx(plan.num_steps + 0.3 + 0.4 * claims), schedule
        # A hand-off of five steps outlasts a short tile's walk: its next tile waits.
        assert overlapped_makespan(plan, r=0.3, lam=5.0, kappa=0.4, ctail=0.2) > got + 1, schedule
