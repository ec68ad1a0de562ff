"""Closed forms of the DASH paper and of our exact model, Lemma 1 on random DAGs, and DAG critical path = simulation."""

from __future__ import annotations

import copy
import random
from fractions import Fraction

import numpy as np
import pytest

from flash_attn_dash.schedule import Dag, build_plan, chains_dag, critical_path, plan_dag, simulate
from flash_attn_dash.schedule.closed_forms import model_makespan, paper_makespan
from flash_attn_dash.schedule.orders import Orders
from flash_attn_dash.schedule.plan import Plan
from flash_attn_dash.schedule.tiles import TileGrid

COSTS = [(3, 1), (5, 2), (1, 0), (0, 1), (Fraction(7, 3), Fraction(1, 2)), (Fraction(13, 10), Fraction(3, 10))]
CASES = [("full", "ascending"), ("full", "descending"), ("full", "shift"), ("causal", "ascending"),
         ("causal", "descending"), ("causal", "symmetric_shift")]


def dash_setting(mask: str, schedule: str, n: int, m: int, c=3, r=1) -> Plan:
    """n K/V tiles per head on n CTAs, m heads, square 64x64 tiles (M = N = n); the dynamic grid claims head-major
    (claim group 1, as closed_forms.py derives) as under costs (c, r)."""
    return build_plan(mask, 64 * n, 64 * n, 64, 64, 1, m, n, schedule, costs=(float(c), float(r)), claim_heads=1)


@pytest.mark.parametrize("mask, schedule", CASES)
def test_model_closed_forms(mask, schedule):
    for n in (1, 2, 3, 4, 6, 9, 16):
        if schedule == "symmetric_shift" and n % 2:
            continue
        for m in (1, 2, 3, 5, 6):
            for c, r in COSTS:
                if (mask, schedule) == ("causal", "descending") and r > c:
                    with pytest.raises(ValueError, match="r > c"):
                        model_makespan(mask, schedule, n, m, c, r)
                    continue
                plan = dash_setting(mask, schedule, n, m, c, r)
                assert plan.schedule_used == schedule
                want = model_makespan(mask, schedule, n, m, c, r)
                assert simulate(plan, c, r).makespan == want, (n, m, c, r)
                assert critical_path(plan, c, r) == want


@pytest.mark.parametrize("mask, schedule", [("full", "ascending"), ("full", "shift"), ("causal", "symmetric_shift")])
def test_paper_forms_reproduced_by_kernel_orders(mask, schedule):
    for n in (2, 4, 8, 12):
        for m in (2, 4, 6):  # even m: symmetric shift fills every round
            for c, r in COSTS:
                makespan = simulate(dash_setting(mask, schedule, n, m, c, r), c, r).makespan
                assert makespan == paper_makespan(mask, schedule, n, m, c, r)


def head_pairs_descending(n: int, m: int) -> Plan:
    """The paper's balanced causal assignment: CTA k runs tile k of head 2i, then tile n-1-k of head 2i+1,
    descending."""
    rows = sorted((k, 2 * i + half, 2 * i + half, k if half == 0 else n - 1 - k)
                  for k in range(n) for i in range(m // 2) for half in (0, 1))
    cta, pos, head, tile_n = (np.array(col, dtype=np.int64) for col in zip(*rows))
    lengths = n - tile_n
    within = np.concatenate([np.arange(length) for length in lengths])
    step_n = np.repeat(tile_n, lengths)
    orders = Orders(n, cta, pos // 2, np.zeros_like(head), head, tile_n, lengths, n - 1 - within, step_n,
                    "descending", "head pairs (paper model)")
    plan = Plan(TileGrid("causal", 64 * n, 64 * n, 64, 64), 1, m, m, n, "descending", orders)
    plan.check()
    return plan


def test_paper_causal_descending_with_balanced_assignment():
    """Holds for r <= c (the paper's regime); with r > c the reduce chains outlast the computes between heads."""
    for n in (2, 3, 4, 5, 8):
        for m in (2, 4, 6):
            plan = head_pairs_descending(n, m)
            for c, r in COSTS:
                if r > c:
                    continue
                assert simulate(plan, c, r).makespan == paper_makespan("causal", "descending", n, m, c, r)


def test_dynamic_grid_realises_the_paper_causal_descending_form():
    """The claims of the dynamic grid pair the heads as the paper's balanced assignment does (r <= c, even m)."""
    for n in (2, 3, 4, 5, 8):
        for m in (2, 4, 6):
            for c, r in COSTS:
                if r > c:
                    continue
                plan = dash_setting("causal", "descending", n, m, c, r)
                assert simulate(plan, c, r).makespan == paper_makespan("causal", "descending", n, m, c, r)
                if n > 1 and r < c:  # CTA k runs tile k of head 0, then tile n-1-k of head 1
                    assert [tiles[:2] for tiles in plan.cta_tiles] == [[(0, 0, k), (0, 1, n - 1 - k)]
                                                                       for k in range(n)]


def test_model_differs_from_paper_where_documented():
    """Causal ascending keeps CTA k on tile k of every head (no (n+1)/2 balance), as closed_forms.py derives."""
    n, m, c, r = 8, 4, 3, 1
    assert model_makespan("causal", "ascending", n, m, c, r) == m * n * (c + r) + (n - 1) * r
    assert paper_makespan("causal", "descending", n, m, c, r) == Fraction(m * (n + 1) * (c + r), 2) + (n - 1) * r
    assert model_makespan("causal", "symmetric_shift", n, 3, c, r) == 2 * (n + 1) * (c + r)  # odd m: half-full round
    with pytest.raises(ValueError, match="mask, schedule"):
        paper_makespan("causal", "shift", n, m, c, r)


def random_equal_chains(rng: random.Random) -> tuple[Dag, list[list[int]], int]:
    """2-6 parallel chains of positive integer weights, all of total length L (so every event is critical)."""
    chains = [[rng.randint(1, 9) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(2, 6))]
    length = max(sum(w) for w in chains) + rng.randint(0, 5)
    for weights in chains:
        weights.append(length - sum(weights) or 1)
    length = max(sum(w) for w in chains)
    for weights in chains:
        weights[-1] += length - sum(weights)
    dag, ids = chains_dag(chains)
    return dag, ids, length


def test_lemma_1_on_random_dags():
    """Adding a zero-weight edge u -> v between chains keeps the critical path iff depth(u) <= depth(v).

    Valid edges are kept, so later trials run on DAGs that are chains plus accumulated accumulation edges.
    """
    rng = random.Random(2024)
    seen = {True: 0, False: 0}
    for _ in range(300):
        dag, ids, length = random_equal_chains(rng)
        assert dag.critical_path() == length
        for _ in range(12):
            a, b = rng.sample(range(len(ids)), 2)
            u, v = rng.choice(ids[a]), rng.choice(ids[b])
            depth = dag.depths()
            trial = copy.deepcopy(dag)
            trial.add_edge(u, v, 0)
            try:
                kept = trial.critical_path() == length
            except ValueError:  # a zero-weight cycle through earlier edges: not a DAG
                continue
            assert kept == (depth[u] <= depth[v]), (u, v, depth[u], depth[v])
            seen[kept] += 1
            if kept:
                dag = trial
    assert seen[True] > 300 and seen[False] > 300


def test_dag_basics():
    dag = Dag(3)
    dag.add_edge(0, 1, 2)
    dag.add_edge(1, 2, Fraction(1, 3))
    assert dag.critical_path() == Fraction(7, 3)
    dag.add_edge(2, 0)
    with pytest.raises(ValueError, match="cycle"):
        dag.critical_path()
    with pytest.raises(ValueError, match="distinct"):
        dag.add_edge(1, 1)


@pytest.mark.parametrize("mask, schedule", CASES)
def test_plan_dag_matches_simulation(mask, schedule):
    rng = random.Random(11)
    for _ in range(4):
        sq, sk = rng.randint(1, 700), rng.randint(1, 700)
        if schedule == "symmetric_shift":
            sk = sq = 128 * rng.randint(1, 5)
        plan = build_plan(mask, sq, sk, 64, 128, rng.randint(1, 2), rng.randint(1, 3), rng.choice((1, 3, 7)), schedule)
        for c, r in COSTS[:3] + [(Fraction(5, 4), Fraction(2, 7))]:
            timeline = simulate(plan, c, r)
            assert plan_dag(plan, c, r).critical_path() == timeline.makespan == critical_path(plan, c, r)


def test_timeline_intervals_and_bubbles():
    plan = dash_setting("full", "ascending", 4, 1)
    timeline = simulate(plan, 3, 1)
    assert timeline.makespan == 4 * 4 + 3
    # CTA k: first compute [0, 3], first reduce waits k*r for the ranks below it.
    for k in range(4):
        first = timeline.cta_intervals(k)[0]
        assert first == (0.0, 3.0, 3.0 + k, 4.0 + k)
    busy = 16 * 4
    assert timeline.bubble_fraction == pytest.approx(1 - busy / (4 * 19))
    assert timeline.wait.min() >= 0
    assert simulate(dash_setting("full", "shift", 4, 2), 3, 1).wait_fraction == 0
    with pytest.raises(ValueError, match="c and r"):
        simulate(plan, -1, 1)


def test_progress_reports_for_long_walks(monkeypatch):
    import importlib

    simulate_module = importlib.import_module("flash_attn_dash.schedule.simulate")  # the package re-exports simulate()
    ticks = iter(range(10**6))

    class FakeClock:
        @staticmethod
        def monotonic() -> float:
            return float(next(ticks))  # one second per call: every CTA switch reports

    monkeypatch.setattr(simulate_module, "time", FakeClock)
    seen: list[float] = []
    plan = dash_setting("full", "ascending", 8, 2)
    simulate(plan, 3, 1, progress=seen.append)
    assert seen and all(0 < f <= 1 for f in seen) and seen == sorted(seen)
