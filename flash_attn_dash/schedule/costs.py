"""Default per-step costs of the schedule model, from the tile shape.

One backward step (one (m, n) tile) runs five GEMMs of ``block_m x block_n x head_dim`` (S, dP, dV, dQ, dK): ``10 *
block_m * block_n * head_dim`` flops.  Its reduce adds one fp32 dQ tile, ``4 * block_m * head_dim`` bytes, into L2 and
passes the semaphore.  Rates are per SM and rough H100/H200 figures: ~4 TFLOP/s of achieved bf16 WGMMA throughput in the
backward (peak ~7.5) and ~64 GB/s of serialized reduce-add plus semaphore hand-off.  That gives ``r / c = 0.4 * 4000 /
(64 * block_n)``, about 0.2 for block_n = 128.  Only ratios matter for the schedule comparison; units are nanoseconds.
"""

from __future__ import annotations

FLOP_PER_NS_PER_SM = 4000.0
REDUCE_BYTES_PER_NS = 64.0


def default_costs(head_dim: int, block_m: int, block_n: int) -> tuple[float, float]:
    """``(c, r)`` in nanoseconds for one step of a ``block_m x block_n`` tile at ``head_dim``."""
    for name, value in (("head_dim", head_dim), ("block_m", block_m), ("block_n", block_n)):
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    compute = 10.0 * block_m * block_n * head_dim / FLOP_PER_NS_PER_SM
    reduce = 4.0 * block_m * head_dim / REDUCE_BYTES_PER_NS
    return compute, reduce
