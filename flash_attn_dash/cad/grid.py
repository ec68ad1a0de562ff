"""The canonical chunk grid: where documents are cut, and what each piece costs.

The grid depends only on a document's length and the chunk size, never on the world size or the plan, so
every plan computes exactly the same per-chunk kernel calls; only their placement differs.
"""
from __future__ import annotations

TILE = 128  # the kernels' query tile multiple: chunk boundaries on it keep q tiles aligned with a whole-doc call


def num_chunks(length: int, chunk_size: int) -> int:
    """Chunks of a length-``length`` document: ceil(length / chunk_size)."""
    return -(-length // chunk_size)


def chunk_bounds(length: int, chunk_size: int, index: int) -> tuple[int, int]:
    """Query rows [start, end) of chunk ``index``; its keys/values are the prefix [0, end) (causal)."""
    start = index * chunk_size
    return start, min(start + chunk_size, length)


def kv_rows(length: int, end: int, causal: bool) -> int:
    """Key/value rows a chunk ending at ``end`` reads: its causal prefix, or the whole document."""
    return end if causal else length


def chunk_cost(start: int, end: int, length: int, causal: bool) -> int:
    """Query-key pairs a chunk computes (the planner's load unit, an exact int).

    Causal: q*e - q(q-1)/2 with q = end - start, e = end (row i sees keys [0, i]); full: q * length.
    """
    q = end - start
    return q * end - q * (q - 1) // 2 if causal else q * length
