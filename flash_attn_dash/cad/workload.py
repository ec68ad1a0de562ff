"""Document-length batches for the CAD planner, its CLI and its benchmark.

Pure Python ``random`` (Mersenne Twister; ``random()`` is stable across Python versions) so a seed names the
same batch everywhere, without numpy or torch.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

PARETO_ALPHA = 1.0
PARETO_SCALE = 2000  # tokens: the Pareto minimum before clipping (design/cad.md's benchmark batch)
MIN_DOC_LEN = 128


def pareto_doc_lens(world_size: int, tokens_per_rank: int, seed: int, *, alpha: float = PARETO_ALPHA,
                    scale: int = PARETO_SCALE, min_len: int = MIN_DOC_LEN) -> list[list[int]]:
    """A long-tailed packed batch: each rank's documents fill exactly ``tokens_per_rank`` tokens.

    Lengths are ``scale * Pareto(alpha)`` clipped to [min_len, tokens_per_rank]; the last document of a
    rank is cut to what is left, and a leftover shorter than ``min_len`` joins it instead.
    """
    if world_size < 1 or tokens_per_rank < min_len:
        raise ValueError(f"need world_size >= 1 and tokens_per_rank >= {min_len}, "
                         f"got {world_size} and {tokens_per_rank}")
    rng = random.Random(seed)
    batch = []
    for _ in range(world_size):
        lens, left = [], tokens_per_rank
        while left:
            length = min(max(int(scale * rng.paretovariate(alpha)), min_len), left)
            if left - length < min_len:
                length = left
            lens.append(length)
            left -= length
        batch.append(lens)
    return batch


def deal_round_robin(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Document i goes to rank i mod world_size, keeping the order (needs at least one document per rank)."""
    if len(lengths) < world_size:
        raise ValueError(f"{len(lengths)} documents cannot give each of {world_size} ranks one")
    return [list(lengths[r::world_size]) for r in range(world_size)]
