"""CAD planner: purity, the properties of its placement, memory budgets, split sizes, errors."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pytest

from flash_attn_dash.cad import CADPlanError, plan_cad, plan_cad_pingpong
from flash_attn_dash.cad.plan import PHASES
from flash_attn_dash.cad.workload import deal_round_robin, pareto_doc_lens

DIMS = dict(heads=4, heads_kv=2, head_dim=16, dtype_bytes=2)
LLAMA = dict(heads=32, heads_kv=8, head_dim=128, dtype_bytes=2)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_batches(count: int = 40):
    """(doc_lens, chunk_size, tolerance) cases: 1..8 ranks, 1..6 documents each, lengths 1..5000."""
    rng = random.Random(2024)
    for _ in range(count):
        world = rng.randint(1, 8)
        doc_lens = [[rng.randint(1, 5000) for _ in range(rng.randint(1, 6))] for _ in range(world)]
        yield doc_lens, rng.choice([128, 256, 512]), rng.choice([0.0, 0.05, 0.2, math.inf])


def pairs(start: int, end: int) -> int:
    """Causal query-key pairs of rows [start, end), counted row by row."""
    return sum(i + 1 for i in range(start, end))


def recount_memory(plan) -> list[int]:
    """Each server's buffers from scratch: Q/O/dO/dQ rows, fp32 LSE, partials, one K/V prefix per document."""
    q_row = plan.heads * plan.head_dim * plan.dtype_bytes
    kv_row = 2 * plan.heads_kv * plan.head_dim * plan.dtype_bytes
    out = []
    for tasks in plan.tasks:
        prefix: dict[int, int] = {}
        total = 0
        for t in tasks:
            total += (t.end - t.start) * (4 * q_row + 4 * plan.heads) + t.kv_rows * kv_row
            prefix[t.doc] = max(prefix.get(t.doc, 0), t.kv_rows)
        out.append(total + sum(prefix.values()) * kv_row)
    return out


def replay_max_loads(plan) -> list[int]:
    """Max load after each move, replaying the plan's moves from the owner placement."""
    load = list(plan.load_before)
    cost = {(t.doc, t.chunk): t.cost for tasks in plan.tasks for t in tasks}
    where = {(t.doc, t.chunk): t.owner for tasks in plan.tasks for t in tasks}
    maxima = [max(load)]
    for m in plan.moves:
        assert where[(m.doc, m.chunk)] == m.source
        where[(m.doc, m.chunk)] = m.dest
        load[m.source] -= cost[(m.doc, m.chunk)]
        load[m.dest] += cost[(m.doc, m.chunk)]
        maxima.append(max(load))
    assert tuple(load) == plan.load_after
    assert all(where[(t.doc, t.chunk)] == s for s, tasks in enumerate(plan.tasks) for t in tasks)
    return maxima


@pytest.mark.parametrize("case", list(random_batches()), ids=lambda c: f"W{len(c[0])}-C{c[1]}-tol{c[2]}")
def test_plan_properties(case):
    doc_lens, chunk_size, tolerance = case
    plan = plan_cad(doc_lens, chunk_size, tolerance, **DIMS)
    world = len(doc_lens)
    lengths = [n for lens in doc_lens for n in lens]
    # Every chunk of the grid exactly once, in canonical order per server, with the grid's bounds and cost.
    seen = sorted((t.doc, t.chunk) for tasks in plan.tasks for t in tasks)
    assert seen == [(g, c) for g, n in enumerate(lengths) for c in range(-(-n // chunk_size))]
    for s, tasks in enumerate(plan.tasks):
        assert [(t.doc, t.chunk) for t in tasks] == sorted((t.doc, t.chunk) for t in tasks)
        for t in tasks:
            assert plan.server_of[t.doc][t.chunk] == s
            assert (t.start, t.end) == (t.chunk * chunk_size, min((t.chunk + 1) * chunk_size, lengths[t.doc]))
            assert t.kv_rows == t.end and t.cost == pairs(t.start, t.end)
        assert plan.load_after[s] == sum(t.cost for t in tasks)
    # Costs conserved; no move raises the max load; the replay ends in the plan.
    assert sum(plan.load_before) == sum(plan.load_after) == sum(n * (n + 1) // 2 for n in lengths)
    maxima = replay_max_loads(plan)
    assert all(b <= a for a, b in zip(maxima, maxima[1:]))
    if math.isinf(tolerance):
        assert plan.moves == () and plan.load_after == plan.load_before
    # Stops balanced, or when the most loaded server has no chunk that some server could take without
    # reaching its load.
    load = plan.load_after
    donor = max(range(world), key=lambda s: (load[s], -s))
    if not math.isinf(tolerance) and plan.imbalance_after > 1 + tolerance:
        assert all(load[r] + t.cost >= load[donor] for t in plan.tasks[donor] for r in range(world) if r != donor)
    assert list(plan.memory_bytes) == recount_memory(plan)


@pytest.mark.parametrize("case", list(random_batches(12)), ids=lambda c: f"W{len(c[0])}")
def test_splits_match_tasks_and_pair_up(case):
    doc_lens, chunk_size, tolerance = case
    plan = plan_cad(doc_lens, chunk_size, tolerance, **DIMS)
    world = len(doc_lens)
    for o in range(world):
        assert sum(plan.q_rows[o]) == sum(doc_lens[o])
        for s in range(world):
            mine = [t for t in plan.tasks[s] if t.owner == o]
            assert plan.q_rows[o][s] == sum(t.end - t.start for t in mine)
            assert plan.partial_rows[o][s] == sum(t.kv_rows for t in mine)
            prefixes = {}
            for t in mine:
                prefixes[t.doc] = max(prefixes.get(t.doc, 0), t.kv_rows)
            assert plan.kv_rows[o][s] == sum(prefixes.values())  # each document's prefix once per server
    for phase in PHASES:
        for r in range(world):
            send, recv = plan.splits(phase, r)
            for peer in range(world):
                assert send[peer] == plan.splits(phase, peer)[1][r]  # what r sends to peer, peer expects
    moved = [t for s, tasks in enumerate(plan.tasks) for t in tasks if t.owner != s]
    q_row = DIMS["heads"] * DIMS["head_dim"] * DIMS["dtype_bytes"]
    assert plan.moved_chunks == len(moved)
    assert plan.bytes_per_phase["q"] == plan.bytes_per_phase["dq"] == sum(t.end - t.start for t in moved) * q_row


def test_pareto_batch_meets_the_issue_target_at_8_ranks():
    for seed in range(5):
        plan = plan_cad(pareto_doc_lens(8, 65536, seed), 2048, 0.05, **LLAMA)
        assert plan.imbalance_before > 1.5 and plan.imbalance_after <= 1.05, seed
        assert 0 < plan.moved_chunks < sum(map(len, plan.tasks))


def test_balances_when_chunks_are_fine_enough():
    # 8 ranks, rank r holds r + 1 documents of 1024 tokens: small chunks make 1 + tolerance reachable.
    doc_lens = [[1024] * (r + 1) for r in range(8)]
    for tolerance in (0.0, 0.01, 0.05):
        plan = plan_cad(doc_lens, 128, tolerance, **DIMS)
        assert plan.imbalance_before > 1.7
        assert plan.imbalance_after <= 1 + max(tolerance, 0.01)


def test_same_inputs_same_plan_and_fingerprint_tracks_every_input():
    doc_lens = pareto_doc_lens(4, 16384, 3)
    a, b = plan_cad(doc_lens, 1024, 0.05, **DIMS), plan_cad([list(x) for x in doc_lens], 1024, 0.05, **DIMS)
    assert a == b and len(a.fingerprint) == 64
    changed = [
        plan_cad([doc_lens[0][:-1] + [doc_lens[0][-1] + 1]] + doc_lens[1:], 1024, 0.05, **DIMS),
        plan_cad(doc_lens, 2048, 0.05, **DIMS),
        plan_cad(doc_lens, 1024, 0.0, **DIMS),
        plan_cad(doc_lens, 1024, 0.05, **{**DIMS, "heads_kv": 1}),
        plan_cad(doc_lens, 1024, 0.05, **DIMS, memory_budget_bytes=10**12),
        plan_cad(doc_lens, 1024, 0.05, **DIMS, causal=False),
    ]
    assert len({p.fingerprint for p in changed} | {a.fingerprint}) == len(changed) + 1


_PURITY = """
import json, sys
from flash_attn_dash.cad import plan_cad, plan_cad_pingpong
from flash_attn_dash.cad.workload import pareto_doc_lens
lens = pareto_doc_lens(8, 65536, 11)
dims = dict(heads=32, heads_kv=8, head_dim=128)
print(json.dumps([plan_cad(lens, 2048, 0.05, **dims, memory_budget_bytes=19 * 2**28).fingerprint,
                  plan_cad_pingpong(lens, 2048, 0.0, **dims, memory_budget_bytes=6 * 2**30).fingerprint]))
"""


def test_fingerprint_is_the_same_in_other_processes_and_hash_seeds():
    seen = []
    for seed in ("0", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": REPO}
        run = subprocess.run([sys.executable, "-c", _PURITY], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        seen.append(json.loads(run.stdout))
    lens = pareto_doc_lens(8, 65536, 11)
    single = plan_cad(lens, 2048, 0.05, **LLAMA, memory_budget_bytes=19 * 2**28)  # 4.75 GiB: binds
    assert any(m.reason == "memory" for m in single.moves)
    here = [single.fingerprint, plan_cad_pingpong(lens, 2048, 0.0, **LLAMA, memory_budget_bytes=6 * 2**30).fingerprint]
    assert seen == [here] * 3


def test_memory_budget_moves_chunks_off_a_full_owner_and_is_respected():
    doc_lens = [[8192], [512, 512], [256]]
    free = plan_cad(doc_lens, 1024, math.inf, **DIMS)
    budget = max(free.memory_bytes) * 2 // 3  # rank 0 cannot keep its own document
    plan = plan_cad(doc_lens, 1024, math.inf, **DIMS, memory_budget_bytes=budget)
    assert free.memory_bytes[0] > budget
    assert any(m.reason == "memory" and m.source == 0 for m in plan.moves)
    assert max(plan.memory_bytes) <= budget and list(plan.memory_bytes) == recount_memory(plan)
    balanced = plan_cad(doc_lens, 1024, 0.0, **DIMS, memory_budget_bytes=budget)
    assert max(balanced.memory_bytes) <= budget and balanced.imbalance_after < free.imbalance_before


def test_chunk_over_every_budget_raises_named_error():
    with pytest.raises(CADPlanError, match=r"chunk 1 of document 0 on rank 1 \(length 4096\).*memory_budget_bytes"):
        plan_cad([[128], [4096]], 2048, **DIMS, memory_budget_bytes=2_000_000)  # chunk 0 fits


def test_budget_too_small_for_the_batch_raises_named_error():
    one = plan_cad([[2048]], 2048, **DIMS).memory_bytes[0]
    with pytest.raises(CADPlanError, match="memory_budget_bytes too small: server 0"):
        plan_cad([[2048] * 3, [2048]], 2048, **DIMS, memory_budget_bytes=one)


@pytest.mark.parametrize("kwargs, message", [
    (dict(chunk_size=100), "chunk_size must be a positive multiple of 128"),
    (dict(chunk_size=0), "chunk_size must be a positive multiple of 128"),
    (dict(chunk_size=-128), "chunk_size must be a positive multiple of 128"),
    (dict(chunk_size=256.0), "chunk_size must be a positive multiple of 128"),
    (dict(doc_lens=[[100], []]), r"doc_lens\[1\] is empty"),
    (dict(doc_lens=[]), "doc_lens must be a non-empty list"),
    (dict(doc_lens=[[100, 0]]), r"doc_lens\[0\]\[1\] must be an int >= 1"),
    (dict(doc_lens=[[100, 2.5]]), r"doc_lens\[0\]\[1\] must be an int"),
    (dict(doc_lens=[100]), r"doc_lens\[0\] must be a list"),
    (dict(tolerance=-0.1), "tolerance must be a number >= 0"),
    (dict(tolerance=float("nan")), "tolerance must be a number >= 0"),
    (dict(heads=6, heads_kv=4), r"heads \(6\) must be a multiple of heads_kv \(4\)"),
    (dict(head_dim=0), "head_dim must be an int >= 1"),
    (dict(memory_budget_bytes=0), "memory_budget_bytes must be an int >= 1"),
    (dict(causal=1), "causal must be a bool"),
])
def test_bad_arguments_raise_named_errors(kwargs, message):
    args = {"doc_lens": [[300], [200]], **DIMS, **kwargs}
    for planner in (plan_cad, plan_cad_pingpong):
        with pytest.raises(CADPlanError, match=message):
            planner(**args)


def test_pingpong_halves_partition_each_rank_and_share_the_budget():
    doc_lens = pareto_doc_lens(4, 16384, 5) + [[4096]]  # the last rank has one document: one half gets it
    budget = 2 * max(plan_cad(doc_lens, 512, math.inf, **DIMS).memory_bytes)
    pp = plan_cad_pingpong(doc_lens, 512, 0.05, **DIMS, memory_budget_bytes=budget)
    ping, pong = pp.halves
    assert pp.world_size == 5 and pp.doc_lens == tuple(map(tuple, doc_lens))
    for r, lens in enumerate(doc_lens):
        assert ping.doc_lens[r] == tuple(lens[:pp.split[r]]) and pong.doc_lens[r] == tuple(lens[pp.split[r]:])
    assert sorted([len(ping.doc_lens[4]), len(pong.doc_lens[4])]) == [0, 1]
    assert all(a + b <= budget for a, b in zip(ping.memory_bytes, pong.memory_bytes))
    total = sum(ping.load_before) + sum(pong.load_before)
    assert abs(sum(ping.load_before) - sum(pong.load_before)) < total / 4  # halves of similar work
    assert pp == plan_cad_pingpong(doc_lens, 512, 0.05, **DIMS, memory_budget_bytes=budget)


def test_workload_batches():
    batch = pareto_doc_lens(8, 65536, 0)
    assert batch == pareto_doc_lens(8, 65536, 0) and batch != pareto_doc_lens(8, 65536, 1)
    assert all(sum(lens) == 65536 and min(lens) >= 128 and max(lens) <= 65536 for lens in batch)
    assert deal_round_robin([5, 6, 7, 8, 9], 2) == [[5, 7, 9], [6, 8]]
    with pytest.raises(ValueError, match="3 documents cannot give each of 4 ranks one"):
        deal_round_robin([1, 2, 3], 4)


def test_planner_and_cli_import_neither_torch_nor_numpy():
    code = ("import sys, flash_attn_dash.cad, flash_attn_dash.cad.cli; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": REPO}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stderr
