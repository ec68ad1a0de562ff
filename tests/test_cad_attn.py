"""cad_attn_func on gloo (CPU): bitwise the same out/dq/dk/dv per document for every world size and plan,
ping-pong included; close to whole-document attention; a server-order fold breaks the bits (negative control)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from flash_attn_dash import attention_ref
from flash_attn_dash.cad import cad_attn_func, fold_partials, plan_cad, plan_cad_pingpong
from flash_attn_dash.cad.spawn import RankError, run_gloo

LENGTHS = (300, 129, 640, 50, 1000, 257, 128, 77, 400, 900, 33, 1500)  # 12 documents, two not multiples of 128
CHUNK = 128
WORLD_SIZES = (1, 2, 3, 4, 8)
# name -> (dtype, heads, heads_kv, head_dim, causal, plan kind, tolerance)
CONFIGS = {
    "fp32-tol0": (torch.float32, 4, 2, 16, True, "single", 0.0),
    "fp32-tol0.05": (torch.float32, 4, 2, 16, True, "single", 0.05),
    "fp32-owner": (torch.float32, 4, 2, 16, True, "single", math.inf),
    "fp32-budget": (torch.float32, 4, 2, 16, True, "budget", math.inf),
    "fp32-pingpong": (torch.float32, 4, 2, 16, True, "pingpong", 0.05),
    "fp64-causal": (torch.float64, 2, 2, 8, True, "single", 0.05),
    "fp64-full": (torch.float64, 2, 1, 8, False, "pingpong", 0.0),
}
GROUPS = {"fp32": [n for n in CONFIGS if n.startswith("fp32")], "fp64-causal": ["fp64-causal"],
          "fp64-full": ["fp64-full"]}


def layout(world: int) -> list[list[int]]:
    """Global document ids per rank: a shuffle that depends on the world size, dealt round-robin."""
    ids = list(range(len(LENGTHS)))
    random.Random(world).shuffle(ids)
    return [ids[r::world] for r in range(world)]


def doc_tensors(doc: int, dtype, heads: int, heads_kv: int, head_dim: int) -> list[torch.Tensor]:
    """q, k, v, dout of one document; the same whatever rank or position it gets."""
    g = torch.Generator().manual_seed(1000 + doc)
    return [torch.randn(LENGTHS[doc], h, head_dim, generator=g, dtype=dtype)
            for h in (heads, heads_kv, heads_kv, heads)]


def make_plan(kind: str, doc_lens, tolerance: float, dims: dict, causal: bool):
    if kind == "pingpong":
        return plan_cad_pingpong(doc_lens, CHUNK, tolerance, **dims, causal=causal)
    budget = None
    if kind == "budget":  # as much as the most loaded server of a balanced plan: owners must shed chunks
        budget = max(plan_cad(doc_lens, CHUNK, 0.0, **dims, causal=causal).memory_bytes)
    return plan_cad(doc_lens, CHUNK, tolerance, **dims, causal=causal, memory_budget_bytes=budget)


def run_config(rank: int, world: int, name: str) -> tuple[dict[int, tuple[torch.Tensor, ...]], int]:
    dtype, heads, heads_kv, head_dim, causal, kind, tolerance = CONFIGS[name]
    ids = layout(world)
    dims = dict(heads=heads, heads_kv=heads_kv, head_dim=head_dim, dtype_bytes=dtype.itemsize)
    plan = make_plan(kind, [[LENGTHS[i] for i in r] for r in ids], tolerance, dims, causal)
    mine = [doc_tensors(i, dtype, heads, heads_kv, head_dim) for i in ids[rank]]
    q, k, v, dout = (torch.cat([d[j] for d in mine]) for j in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = [0]
    for i in ids[rank]:
        cu.append(cu[-1] + LENGTHS[i])
    out = cad_attn_func(q, k, v, torch.tensor(cu, dtype=torch.int32), plan=plan, causal=causal)
    out.backward(dout)
    per_doc = {i: tuple(t[a:b].detach().clone() for t in (out, q.grad, k.grad, v.grad))
               for i, a, b in zip(ids[rank], cu, cu[1:])}
    halves = plan.halves if kind == "pingpong" else (plan,)
    return per_doc, sum(h.moved_chunks for h in halves)


def cad_worker(rank: int, world: int) -> dict[str, tuple[dict, int]]:
    return {name: run_config(rank, world, name) for name in CONFIGS}


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, tuple[dict, int]]]:
    """world size -> config -> (document -> (out, dq, dk, dv), chunks moved off their owner)."""
    merged = {}
    for world in WORLD_SIZES:
        ranks = run_gloo(cad_worker, world, timeout_s=180)
        for r in ranks:
            assert not isinstance(r, RankError), r.traceback
        merged[world] = {name: ({doc: t for r in ranks for doc, t in r[name][0].items()}, ranks[0][name][1])
                         for name in CONFIGS}
    return merged


def test_every_document_comes_back(results):
    for world, configs in results.items():
        for name, (docs, _) in configs.items():
            assert sorted(docs) == list(range(len(LENGTHS))), (world, name)


def test_plans_really_differ(results):
    # The invariance below is not vacuous: plans at W >= 2 compute chunks away from their owners.
    for world in WORLD_SIZES[1:]:
        moved = {name: results[world][name][1] for name in CONFIGS}
        assert moved["fp32-owner"] == 0
        assert moved["fp32-tol0"] > 0 and moved["fp32-budget"] > 0 and moved["fp64-full"] > 0, (world, moved)


@pytest.mark.parametrize("group", list(GROUPS))
def test_bitwise_identical_across_world_sizes_plans_and_pingpong(results, group):
    first = GROUPS[group][0]
    expect = results[1][first][0]
    for world in WORLD_SIZES:
        for name in GROUPS[group]:
            docs = results[world][name][0]
            for doc, tensors in expect.items():
                for label, a, b in zip(("out", "dq", "dk", "dv"), tensors, docs[doc]):
                    assert torch.equal(a, b), f"{label} of document {doc} differs: W={world} {name} vs W=1 {first}"


@pytest.mark.parametrize("name, atol", [("fp64-causal", 1e-10), ("fp64-full", 1e-10), ("fp32-tol0", 2e-5)])
def test_matches_whole_document_attention(results, name, atol):
    dtype, heads, heads_kv, head_dim, causal, _, _ = CONFIGS[name]
    docs = results[4][name][0]
    for doc in range(len(LENGTHS)):
        q, k, v, dout = (t.double().unsqueeze(0).requires_grad_() for t in doc_tensors(doc, dtype, heads, heads_kv,
                                                                                        head_dim))
        out, _ = attention_ref(q, k, v, head_dim ** -0.5, causal)
        grads = torch.autograd.grad(out, (q, k, v), dout.detach())
        for label, got, ref in zip(("out", "dq", "dk", "dv"), docs[doc], (out, *grads)):
            torch.testing.assert_close(got.double(), ref[0].detach(), atol=atol, rtol=atol,
                                       msg=lambda m: f"{label} of document {doc}: {m}")


def test_negative_control_server_order_fold_changes_bits():
    """The same per-chunk partials, folded in the order servers hold them instead of chunk order, give bits
    that depend on the plan: the canonical fold is what makes dK/dV plan-invariant."""
    doc, dims = LENGTHS.index(1500), dict(heads=4, heads_kv=2, head_dim=16)  # 12 chunks
    q, k, v, dout = (t.unsqueeze(0) for t in doc_tensors(doc, torch.float32, **dims))
    length, scale = LENGTHS[doc], dims["head_dim"] ** -0.5
    partials = []
    for c in range(-(-length // CHUNK)):
        a, e = c * CHUNK, min((c + 1) * CHUNK, length)
        out, lse = torch.ops.flash_attn_dash.fwd(q[:, a:e], k[:, :e], v[:, :e], scale, True, 0)
        _, dk, dv, _ = torch.ops.flash_attn_dash.bwd(dout[:, a:e], q[:, a:e], k[:, :e], v[:, :e], out, lse, scale,
                                                     True, True, "descending", 0)
        partials.append(torch.stack([dk[0], dv[0]], 1))
    canonical = fold_partials(partials, length, torch.float32)
    by_server = {}
    for world in (2, 3, 4, 8):
        ids = layout(world)
        plan = plan_cad([[LENGTHS[i] for i in r] for r in ids], CHUNK, 0.0, **dims, dtype_bytes=4)
        owner = next(r for r in range(world) if doc in ids[r])
        servers = plan.server_of[plan.doc_id(owner, ids[owner].index(doc))]
        order = sorted(range(len(partials)), key=lambda c: (servers[c], c))  # server by server
        by_server[world] = (order, fold_partials([partials[c] for c in order], length, torch.float32))
    orders = {tuple(o) for o, _ in by_server.values()}
    assert len(orders) > 1 and any(list(o) != sorted(o) for o in orders)  # the plans scatter this document
    assert any(not torch.equal(folded, canonical) for _, folded in by_server.values())
    folds = [folded for _, folded in by_server.values()]
    assert any(not torch.equal(folds[0], f) for f in folds[1:])  # plan-dependent bits
    torch.testing.assert_close(folds[0], canonical)  # the same sum up to rounding


def gradcheck_worker(rank: int, world: int) -> bool:
    """fp64 gradcheck of cad_attn_func at W=2 (equal token counts per rank, so both ranks make the same calls)."""
    doc_lens = [[130, 70], [200]]
    plan = plan_cad(doc_lens, 128, 0.0, heads=2, heads_kv=1, head_dim=4, dtype_bytes=8)
    assert plan.moved_chunks > 0
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(200, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(200, 1, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in "kv")
    cu = torch.tensor([0] + [sum(doc_lens[rank][:i + 1]) for i in range(len(doc_lens[rank]))], dtype=torch.int32)
    return torch.autograd.gradcheck(lambda q, k, v: cad_attn_func(q, k, v, cu, plan=plan, softmax_scale=0.7),
                                    (q, k, v), fast_mode=True)


def test_fp64_gradcheck_at_two_ranks():
    assert run_gloo(gradcheck_worker, 2, timeout_s=120) == [True, True]


def overlap_order_worker(rank: int, world: int) -> list[str]:
    """The order in which a ping-pong forward and backward start transfers and compute (instrumented)."""
    from flash_attn_dash.cad import attention, comm

    events = []
    start, fwd, bwd = comm.start_all_to_all, attention.forward_tasks, attention.backward_tasks
    comm.start_all_to_all = lambda *a: events.append("send") or start(*a)
    attention.forward_tasks = lambda tasks, *a: events.append(f"fwd {len(tasks)}") or fwd(tasks, *a)
    attention.backward_tasks = lambda tasks, *a: events.append(f"bwd {len(tasks)}") or bwd(tasks, *a)
    lens = [[300, 200, 500], [1000, 100]]
    plan = plan_cad_pingpong(lens, 128, 0.0, heads=2, heads_kv=1, head_dim=8, dtype_bytes=4)
    q = torch.randn(sum(lens[rank]), 2, 8, requires_grad=True)
    k, v = torch.randn(sum(lens[rank]), 1, 8), torch.randn(sum(lens[rank]), 1, 8)
    cu = torch.tensor([0] + [sum(lens[rank][:i + 1]) for i in range(len(lens[rank]))], dtype=torch.int32)
    cad_attn_func(q, k, v, cu, plan=plan).sum().backward()
    ping, pong = (len(h.tasks[rank]) for h in plan.halves)
    return events, ping, pong


def test_pingpong_dispatches_one_half_while_the_other_computes():
    for events, ping, pong in run_gloo(overlap_order_worker, 2, timeout_s=60):
        assert events == [
            *["send"] * 6,                                # Q, K, V of both halves in flight before any compute
            f"fwd {ping}", "send", f"fwd {pong}", "send",  # ping's output travels while pong computes
            "send", "send",                                # dO of both halves
            f"bwd {ping}", "send", "send", f"bwd {pong}", "send", "send",  # ping's dQ, dK/dV during pong
        ]
