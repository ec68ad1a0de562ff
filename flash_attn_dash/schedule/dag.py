"""Event DAGs with weighted edges: the DASH step DAG of a plan, longest paths, and the chains of Lemma 1.

Nodes are events (points in time), edges carry durations.  A plan's DAG has three events per step ``s``: ``start(s)``
(compute begins), ``ready(s)`` (reduce begins) and ``done(s)`` (reduce ends), with chain edges ``start -c-> ready -r->
done -0-> start(next step of the CTA)`` and a zero-weight accumulation edge ``done(rank predecessor) -> ready(s)``.  The
longest path to an event is its earliest time, so the critical path equals the makespan of :func:`.simulate.simulate`;
this module is the explicit (slow, small-plan) form used to cross-check it.

Lemma 1 (DASH), in this event form: let every node of a DAG lie on a critical path (e.g. parallel chains of equal
length). Adding a zero-weight edge ``u -> v`` keeps the critical path iff ``depth(u) <= depth(v)``, where depth is the
longest distance from a source.  Reason: the only new paths run through the edge, and the longest is ``depth(u) + (CP -
depth(v))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Plan


class Dag:
    """A directed acyclic graph of ``num_nodes`` events with weighted edges."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        self.out: list[list[tuple[int, Real]]] = [[] for _ in range(num_nodes)]

    def add_edge(self, u: int, v: int, weight: Real = 0) -> None:
        if not (0 <= u < self.num_nodes and 0 <= v < self.num_nodes) or u == v:
            raise ValueError(f"edge ({u}, {v}) must join two distinct nodes in [0, {self.num_nodes})")
        self.out[u].append((v, weight))

    def topological_order(self) -> list[int]:
        """Kahn's order; ValueError if the graph has a cycle."""
        indegree = [0] * self.num_nodes
        for edges in self.out:
            for v, _ in edges:
                indegree[v] += 1
        order = [u for u in range(self.num_nodes) if indegree[u] == 0]
        for u in order:  # the list grows while we walk it
            for v, _ in self.out[u]:
                indegree[v] -= 1
                if indegree[v] == 0:
                    order.append(v)
        if len(order) != self.num_nodes:
            raise ValueError(f"the graph has a cycle through {self.num_nodes - len(order)} nodes")
        return order

    def depths(self) -> list[Real]:
        """Longest distance from any source to each node."""
        depth: list[Real] = [0] * self.num_nodes
        for u in self.topological_order():
            for v, w in self.out[u]:
                if depth[u] + w > depth[v]:
                    depth[v] = depth[u] + w
        return depth

    def critical_path(self) -> Real:
        return max(self.depths(), default=0)


def plan_dag(plan: Plan, c: Real, r: Real) -> Dag:
    """The step DAG of ``plan`` (events ``3s``, ``3s+1``, ``3s+2`` = start, ready, done of step ``s``)."""
    dag = Dag(3 * plan.num_steps)
    ptr = plan.cta_ptr.tolist()
    for g in range(plan.num_ctas):
        for s in range(ptr[g], ptr[g + 1]):
            dag.add_edge(3 * s, 3 * s + 1, c)
            dag.add_edge(3 * s + 1, 3 * s + 2, r)
            if s + 1 < ptr[g + 1]:
                dag.add_edge(3 * s + 2, 3 * s + 3, 0)
    for s, p in enumerate(plan.rank_predecessor().tolist()):
        if p >= 0:
            dag.add_edge(3 * p + 2, 3 * s + 1, 0)
    return dag


def chains_dag(chains: Sequence[Sequence[Real]]) -> tuple[Dag, list[list[int]]]:
    """Parallel chains: chain i has ``len(chains[i]) + 1`` events joined by edges of the given weights.

    Returns the DAG and, per chain, its event ids in order.
    """
    ids, next_id = [], 0
    for weights in chains:
        ids.append(list(range(next_id, next_id + len(weights) + 1)))
        next_id += len(weights) + 1
    dag = Dag(next_id)
    for weights, nodes in zip(chains, ids):
        for w, u, v in zip(weights, nodes, nodes[1:]):
            dag.add_edge(u, v, w)
    return dag, ids
