"""One rank's view of a plan as an owner: which of its token rows each all_to_all sends, and where each chunk's
dK/dV partial lands in what comes back."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .plan import CADPlan


@dataclass(frozen=True)
class OwnerLayout:
    """Rows of this rank's packed (total, heads, d) tensors, in send order.

    ``q_index`` orders the "q"/"dout" sends and the "out"/"dq" receives (server-major, then canonical order;
    a permutation of the rank's rows in the plan); ``kv_index`` the "kv" send (each document's prefix once
    per server). ``partials[i][c]`` is (offset, rows) of chunk c of the i-th document in the "dkv" receive.
    """

    q_index: torch.Tensor
    kv_index: torch.Tensor
    partials: tuple[tuple[tuple[int, int], ...], ...]
    doc_starts: tuple[int, ...]
    doc_lens: tuple[int, ...]


def _index(ranges: Sequence[tuple[int, int]], device: torch.device) -> torch.Tensor:
    if not ranges:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.cat([torch.arange(a, b, dtype=torch.int64) for a, b in ranges]).to(device)


def owner_layout(plan: CADPlan, rank: int, doc_starts: Sequence[int], device: torch.device) -> OwnerLayout:
    """The layout of ``rank`` whose plan documents start at token rows ``doc_starts`` of its packed tensors."""
    q_ranges, kv_ranges = [], []
    lens = plan.doc_lens[rank]
    slots: list[list[tuple[int, int, int]]] = [[] for _ in lens]  # (chunk, offset, rows)
    received = 0
    for tasks in plan.tasks:
        mine = [t for t in tasks if t.owner == rank]
        prefix: dict[int, int] = {}  # local doc -> K/V rows this server needs (insertion = canonical order)
        for t in mine:
            base = doc_starts[t.local_doc]
            q_ranges.append((base + t.start, base + t.end))
            prefix[t.local_doc] = max(prefix.get(t.local_doc, 0), t.kv_rows)
            slots[t.local_doc].append((t.chunk, received, t.kv_rows))
            received += t.kv_rows
        kv_ranges += [(doc_starts[d], doc_starts[d] + rows) for d, rows in prefix.items()]
    # Servers return partials server by server; the fold wants chunk order.
    partials = tuple(tuple((offset, rows) for _, offset, rows in sorted(doc)) for doc in slots)
    return OwnerLayout(_index(q_ranges, device), _index(kv_ranges, device), partials, tuple(doc_starts),
                       tuple(lens))
