"""sm90 backward kernels: gradients vs the fp32 reference, bitwise determinism, deadlock/coverage sweep
and model = kernel (dQ accumulation order trace vs flash_attn_dash.schedule). GPU only.

Tolerance rule: tests/grad_rule.py. Head dims include the pairs with a V head dim of their own (MLA's (192, 128), where
built): v, out, dout and dv then have head_dim_v(d) columns.
"""
from __future__ import annotations

import math
import random
import time

import pytest
import torch

from grad_rule import assert_tolerance_rule, ref_grads
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims, head_dim_v

from flash_attn_dash import variants


def _sm90_kernels() -> bool:
    try:
        import flash_attn_dash
    except ImportError:
        return False
    return (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability() == (9, 0)
        and flash_attn_dash.kernels_available()
    )


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _sm90_kernels(), reason="needs an sm90 GPU and the compiled kernels"),
]

DTYPES = gpu_dtypes()
HDIMS = gpu_head_dims(v_pairs=True)
SHAPES = [(1, 1), (113, 203), (128, 128), (799, 3), (1024, 1024)]
BIG_SHAPES = [(4224, 4224)]
# (batch, heads, heads_k): MHA, GQA 6/2, MQA 6/1
HEAD_CONFIGS = [(1, 1, 1), (3, 6, 6), (3, 6, 2), (1, 6, 1)]
# Each schedule with the masks it applies to (variants.SCHEDULES; the other combinations are rejected with a
# ValueError, see test_bwd_schedule_mask_mismatch_raises): parametrize over these pairs, so that no inapplicable
# combination is collected as a passing test.
SCHEDULE_MASKS = [(s.name, causal) for s in variants.SCHEDULES for causal in (False, True)
                  if ("causal" if causal else "full") in s.masks]
SCHEDULE_MASK_IDS = [f"{name}-{'causal' if causal else 'full'}" for name, causal in SCHEDULE_MASKS]
WATCHDOG_S = 10.0


def _blocks(d: int) -> tuple[int, int]:
    return variants.bwd_tile(int(d), head_dim_v(d))


def _inputs(b, sq, sk, h, hk, d, dtype, causal, seed=0, window_size=(-1, -1)):
    from flash_attn_dash.reference import attention_ref

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, head_dim_v(d), device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(b, sq, h, head_dim_v(d), device="cuda", dtype=dtype, generator=g)
    with torch.no_grad():
        out32, lse = attention_ref(q.float(), k.float(), v.float(), softmax_scale=d ** -0.5, causal=causal, upcast=True,
                                   window_size=window_size)
    return q, k, v, dout, out32.to(dtype).contiguous(), lse.float().contiguous()


def _bwd_into(dout, q, k, v, out, lse, dq, dk, dv, causal, deterministic, schedule, sm_margin=0, trace=None):
    """Low-level backward writing into dq/dk/dv (and the dQ arrival-order trace if given), with the launch
    flash_attn_dash.launch decides for ``schedule``."""
    from flash_attn_dash.ops import bwd_into

    bwd_into(dout, q, k, v, out, lse, dq, dk, dv, q.shape[-1] ** -0.5, causal, deterministic, schedule, sm_margin,
             order_trace=trace)
    return dq, dk, dv


def _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule, sm_margin=0, poison=True, trace=None):
    fill = float("nan") if poison else 0.0
    dq, dk, dv = (torch.full_like(x, fill) for x in (q, k, v))
    return _bwd_into(dout, q, k, v, out, lse, dq, dk, dv, causal, deterministic, schedule, sm_margin, trace)


def _trace_buffer(b, h, sq, sk, d):
    bm, bn = _blocks(d)
    return torch.full((b, h, -(-sq // bm), -(-sk // bn)), -1, dtype=torch.int32, device="cuda")


def _wait(stream=None, timeout=WATCHDOG_S):
    stream = stream or torch.cuda.current_stream()
    t0 = time.monotonic()
    while not stream.query():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"backward did not finish within {timeout} s (deadlock?)")
        time.sleep(1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("b,h,hk", HEAD_CONFIGS)
def test_bwd_matches_reference(b, h, hk, sq, sk, schedule, deterministic, causal, d, dtype):
    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, dtype, causal)
    grads = _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule)
    _wait()
    assert_tolerance_rule(q, k, v, dout, out, grads, causal)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
@pytest.mark.parametrize("sq,sk", BIG_SHAPES)
def test_bwd_big(sq, sk, schedule, deterministic, causal, d):
    q, k, v, dout, out, lse = _inputs(1, sq, sk, 2, 1, d, torch.bfloat16, causal)
    grads = _bwd(dout, q, k, v, out, lse, causal, deterministic, schedule)
    _wait(timeout=60)
    assert_tolerance_rule(q, k, v, dout, out, grads, causal)


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("schedule,causal", [("shift", True), ("symmetric_shift", False), ("diagonal", False)])
def test_bwd_schedule_mask_mismatch_raises(schedule, causal, deterministic, d):
    """shift needs the full mask, symmetric_shift and diagonal the causal one: the Python decider refuses them by
    name, and the launcher refuses the same policy id if it reaches it directly (std::invalid_argument ->
    ValueError), before launching anything; the outputs stay untouched."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    q, k, v, dout, out, lse = _inputs(1, 256, 256, 2, 2, d, torch.bfloat16, causal)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    with pytest.raises(ValueError, match="is defined for (full|causal) masks only"):
        _bwd_into(dout, q, k, v, out, lse, dq, dk, dv, causal, deterministic, schedule)
    with pytest.raises(ValueError, match="needs the (full|causal) mask"):
        torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, None, d ** -0.5, causal,
                                          deterministic, variants.schedule(schedule).id, 1, 1, 0)
    torch.cuda.synchronize()
    for x in (dq, dk, dv):
        assert torch.isnan(x).all(), "a kernel ran although the schedule/mask combination was rejected"


@pytest.mark.parametrize("d", HDIMS)
def test_bwd_launcher_refuses_a_bad_launch(d):
    """The launcher checks the resolved launch it is given: a grid outside [1, SMs - margin] or beyond the work units,
    a claim group outside [1, B*H], symmetric_shift on a shape it does not support, or a non-deterministic launch of
    an order no non-deterministic kernel walks, each a ValueError before any launch."""
    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    q, k, v, dout, out, lse = _inputs(1, 256, 384, 2, 2, d, torch.bfloat16, True)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    desc, sym, asc = (variants.schedule(n).id for n in ("descending", "symmetric_shift", "ascending"))
    bm, bn = _blocks(d)  # tiles without a whole pair step instantiate no symmetric_shift (variants.SCHEDULES)
    sym_refusal = "symmetric_shift needs seqlen_q == seqlen_k" if bn % bm == 0 else "no deterministic kernel runs"
    for (policy, grid, group, margin, det), match in (
            ((desc, sms + 1, 1, 0, True), "grid must be in"), ((desc, 0, 1, 0, True), "grid must be in"),
            ((desc, sms, 1, 1, True), "grid must be in"), ((desc, 1000, 1, 0, True), "grid must be in"),
            ((desc, 4, 3, 0, True), "claim_group must be in"), ((desc, 4, 0, 0, True), "claim_group must be"),
            ((sym, 2, 1, 0, True), sym_refusal),
            ((asc, 2, 1, 0, False), "no non-deterministic kernel runs this schedule")):
        with pytest.raises(ValueError, match=match):
            torch.ops.flash_attn_dash.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, None, d ** -0.5, True, det,
                                              policy, grid, group, margin)
    torch.cuda.synchronize()
    for x in (dq, dk, dv):
        assert torch.isnan(x).all(), "a kernel ran although its launch was refused"


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,b,h,hk,margin", [
    (1024, 1024, 2, 3, 3, 0), (2048, 2048, 1, 4, 2, 18), (1000, 1000, 2, 2, 1, 54), (1920, 1920, 1, 3, 3, 0),
    (700, 1300, 2, 3, 3, 0), (128, 4096, 1, 2, 2, 0),
])
def test_bwd_all_schedules_agree(sq, sk, b, h, hk, margin, causal, d):
    """Every schedule applicable to the mask (deterministic) is within tolerance of the reference, and the schedules
    differ from each other by no more than the reference tolerance (they only reorder fp32 additions)."""
    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, torch.bfloat16, causal)
    ref = ref_grads(q, k, v, dout, causal, upcast=True)
    pt = ref_grads(q, k, v, dout, causal, upcast=False)
    budget = [2 * (p.float() - r).abs().max().item() + 2 * (r + 0.3 - 0.3 - r).abs().max().item() + 1e-5
              for r, p in zip(ref, pt)]
    results = {}
    for name, c in SCHEDULE_MASKS:
        if c != causal:
            continue
        grads = _bwd(dout, q, k, v, out, lse, causal, True, name, sm_margin=margin)
        _wait()
        assert_tolerance_rule(q, k, v, dout, out, grads, causal)
        results[name] = grads
    assert tuple(results) == variants.schedules_for("causal" if causal else "full")
    base = results["ascending"]
    for name, grads in results.items():
        for label, x, y, tol in zip(("dq", "dk", "dv"), grads, base, budget):
            diff = (x.float() - y.float()).abs().max().item()
            assert diff <= tol, f"{name} vs ascending: {label} differs by {diff:.3e} > {tol:.3e}"


def _bits(grads):
    return [g_.view(torch.int16).clone() for g_ in grads]


SWAPPED_HDIMS = [d for d in HDIMS if variants.head_dim(int(d), head_dim_v(d)).bwd.swap_dkv]


@pytest.mark.parametrize("d", SWAPPED_HDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [6, 2], ids=["MHA", "GQA"])
def test_bwd_swapped_dkv_ragged_keys(hk, causal, d):
    """The swapped dK/dV layout (head dims above 128: dK^T and dV^T in the accumulators, P and dS through shared
    memory) writes dK/dV element by element, or adds them into the GQA fp32 accumulators: key counts that end inside
    a K/V tile (block_n 48 or 96), a single key and query counts that end inside a Q tile, in both modes; the
    deterministic gradients repeat bit for bit."""
    bm, bn = _blocks(d)
    for sq, sk in ((517, 3 * bn + 5), (bm + 1, 1), (1000, 1000 + bn // 2)):
        q, k, v, dout, out, lse = _inputs(2, sq, sk, 6, hk, d, torch.bfloat16, causal, seed=sk)
        det = _bwd(dout, q, k, v, out, lse, causal, True, "auto")
        _wait()
        assert_tolerance_rule(q, k, v, dout, out, det, causal)
        again = _bwd(dout, q, k, v, out, lse, causal, True, "auto")
        _wait()
        for label, a, g_ in zip(("dq", "dk", "dv"), _bits(det), again):
            assert torch.equal(a, g_.view(torch.int16)), f"sq={sq} sk={sk}: {label} bits differ between calls"
        nondet = _bwd(dout, q, k, v, out, lse, causal, False, "auto")
        _wait()
        assert_tolerance_rule(q, k, v, dout, out, nondet, causal)


@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
def test_bwd_bitwise_deterministic(schedule, causal):
    q, k, v, dout, out, lse = _inputs(2, 1024, 1024, 4, 2, 128, torch.bfloat16, causal)
    s = schedule
    first = _bits(_bwd(dout, q, k, v, out, lse, causal, True, s))
    for i in range(1000):
        got = _bwd(dout, q, k, v, out, lse, causal, True, s)
        if i % 100 == 99:
            _wait(timeout=120)
        for a, g_ in zip(first, got):
            assert torch.equal(a, g_.view(torch.int16)), f"call {i}: bits differ"


@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
def test_bwd_deterministic_with_concurrent_work(schedule, causal):
    q, k, v, dout, out, lse = _inputs(2, 2048, 2048, 4, 4, 64, torch.bfloat16, causal)
    s = schedule
    first = _bits(_bwd(dout, q, k, v, out, lse, causal, True, s))
    side = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(side):
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
    for i in range(100):
        got = _bwd(dout, q, k, v, out, lse, causal, True, s)
        for x, g_ in zip(first, got):
            assert torch.equal(x, g_.view(torch.int16)), f"call {i}: bits differ under concurrent work"
    _wait(side, timeout=120)
    _wait(timeout=120)


@pytest.mark.parametrize("sq,sk", [(1000, 1500), (1024, 1024)])  # symmetric_shift: descending fallback / pair grid
@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
def test_bwd_deterministic_cuda_graph(schedule, causal, sq, sk):
    import flash_attn_dash  # noqa: F401

    q, k, v, dout, out, lse = _inputs(1, sq, sk, 6, 2, 128, torch.bfloat16, causal)
    s = schedule
    first = _bits(_bwd(dout, q, k, v, out, lse, causal, True, s, poison=False))
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        _bwd_into(dout, q, k, v, out, lse, dq, dk, dv, causal, True, s)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _bwd_into(dout, q, k, v, out, lse, dq, dk, dv, causal, True, s)
    for i in range(50):
        for x in (dq, dk, dv):
            x.fill_(float("nan"))
        graph.replay()
        _wait(timeout=30)
        for a, g_ in zip(first, (dq, dk, dv)):
            assert torch.equal(a, g_.view(torch.int16)), f"replay {i}: bits differ"


@pytest.mark.parametrize("seed", range(4))
def test_bwd_deadlock_sweep(seed):
    rng = random.Random(seed)
    for _ in range(12):
        sq, sk = rng.randint(1, 5000), rng.randint(1, 5000)
        if rng.random() < 0.35:
            sq = sk  # symmetric_shift runs on the pair grid only for sq == sk and an even N
        causal = rng.random() < 0.5
        sched = rng.choice([name for name, c in SCHEDULE_MASKS if c == causal])
        d = rng.choice(HDIMS)
        hk = rng.choice([1, 2])
        margin = rng.randint(0, 100)
        det = rng.random() < 0.75
        q, k, v, dout, out, lse = _inputs(1, sq, sk, 2, hk, d, torch.bfloat16, causal, seed=rng.randint(0, 1 << 30))
        grads = _bwd(dout, q, k, v, out, lse, causal, det, sched, sm_margin=margin)
        _wait()
        for g_ in grads:
            assert not torch.isnan(g_).any(), (f"NaN/unwritten for sq={sq} sk={sk} causal={causal} margin={margin} "
                                               f"schedule={sched} deterministic={det} d={d} hk={hk}")


@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("schedule,causal", SCHEDULE_MASKS, ids=SCHEDULE_MASK_IDS)
@pytest.mark.parametrize("sq,sk,b,h,hk,margin", [
    (1024, 1024, 2, 3, 3, 0), (113, 2000, 1, 4, 2, 17), (2000, 113, 2, 2, 1, 0), (4224, 4224, 1, 2, 2, 100),
    (799, 3, 3, 2, 2, 5),
    # shift with R > M: a head's 128 K/V tiles in flight over M = 2 (hdim 128) / 1 (hdim 64) Q tiles, G = 132
    (128, 16384, 1, 2, 2, 0),
    # the pair grid proper (sq == sk, N even), also as if on 114-SM (margin 18) and 78-SM (margin 54) GPUs, and G = 1
    (2048, 2048, 2, 8, 2, 0), (2048, 2048, 2, 8, 8, 18), (2048, 2048, 2, 8, 4, 54), (8192, 8192, 1, 4, 4, 0),
    (4096, 4096, 2, 16, 16, 18), (1024, 1024, 1, 2, 1, 131),
    # M < N*s (partial last K/V tile; hdim 128: M = 127, N = 64) and odd N (= 15, fallback to descending)
    (8100, 8100, 1, 2, 2, 0), (1920, 1920, 1, 3, 3, 54),
])
def test_bwd_trace_matches_model(sq, sk, b, h, hk, margin, schedule, causal, d):
    import numpy as np
    import flash_attn_dash  # noqa: F401
    from flash_attn_dash.schedule import build_plan

    q, k, v, dout, out, lse = _inputs(b, sq, sk, h, hk, d, torch.bfloat16, causal)
    trace = _trace_buffer(b, h, sq, sk, d)
    _bwd(dout, q, k, v, out, lse, causal, True, schedule, sm_margin=margin, trace=trace)
    _wait()
    from flash_attn_dash.launch import bwd_launch

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count - margin
    bm, bn = _blocks(d)
    fold = bwd_launch(causal, int(d), sq, sk, b, h, num_sms, True, schedule, (-1, -1), hk,
                      head_dim_v=head_dim_v(d)).gqa_fold  # what ran
    plan = build_plan("causal" if causal else "full", sq, sk, bm, bn, b, h, num_sms, schedule, heads_kv=hk,
                      fold=fold)
    plan.check()
    expect = plan.trace_array()
    got = trace.cpu().numpy().astype(np.int32)
    assert got.shape == expect.shape
    bad = np.argwhere(got != expect)
    assert bad.size == 0, f"{plan!r} ({plan.description}): {len(bad)} trace entries differ, first (b,h,m,pos) " \
                          f"{bad[0].tolist()}: kernel {got[tuple(bad[0])]} model {expect[tuple(bad[0])]}"


@pytest.mark.parametrize("sq,sk,d", [(1024, 1500, 128), (2048, 2048, 128), (2048, 2048, 64)])
def test_bwd_nondeterministic_trace_is_a_permutation(sq, sk, d):
    """Every visible K/V tile adds into every dQ tile exactly once, on the static grid (sq != sk) and on
    the causal pair grid (sq == sk: the non-deterministic backward walks symmetric_shift)."""
    import numpy as np
    import flash_attn_dash  # noqa: F401

    q, k, v, dout, out, lse = _inputs(2, sq, sk, 3, 3, d, torch.bfloat16, True)
    trace = _trace_buffer(2, 3, sq, sk, d)
    _bwd(dout, q, k, v, out, lse, True, False, "auto", trace=trace)
    _wait()
    t = trace.cpu().numpy()
    bm, bn = _blocks(d)
    off = sk - sq
    for m in range(t.shape[2]):
        expect = sorted(n for n in range(t.shape[3]) if max(0, math.floor((n * bn - off) / bm)) <= m)
        for bb in range(t.shape[0]):
            for hh in range(t.shape[1]):
                row = t[bb, hh, m]
                assert sorted(x for x in row if x >= 0) == expect
