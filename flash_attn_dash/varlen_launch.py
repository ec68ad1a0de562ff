"""Which order each sequence of a varlen backward runs, in :mod:`flash_attn_dash.launch`'s terms.

(To move into ``launch.py`` beside :func:`~flash_attn_dash.launch.bwd_launch` once varlen kernels exist.)

The sequences of a pack share one persistent grid, so a deterministic varlen backward is only reproducible in a
useful sense if each sequence gets the same bits whatever it is packed with: its position, the other sequences, their
number, ``sm_margin`` and the SM count. ``ascending`` and ``descending`` have that property (rank = n, and each K/V
tile walks its Q tiles in an order that does not depend on the grid); ``shift`` and ``symmetric_shift`` derive ranks
from the grid's rounds, so they are run when asked for, but their bits follow the pack.
"""
from __future__ import annotations

from .launch import BwdLaunch, bwd_launch

PORTABLE_SCHEDULES: tuple[str, ...] = ("ascending", "descending")
# What deterministic "auto" means for varlen: the faster portable order. On causal masks tile n starts on its last Q
# tile instead of queueing behind tile n-1 on row n (the model: 1.36x ascending at hdim 128, 8k, README's plan); on
# full masks the model puts the two within 1% (schedule/auto.py).
VARLEN_AUTO = "descending"


def varlen_request(deterministic: bool, schedule: str) -> str:
    """The schedule a varlen backward asks :func:`bwd_launch` for on every sequence: deterministic ``"auto"`` is
    :data:`VARLEN_AUTO`; anything else as given (non-deterministic backwards walk their own order anyway)."""
    return VARLEN_AUTO if deterministic and schedule == "auto" else schedule


def sequence_launch(causal: bool, head_dim: int, seqlen_q: int, seqlen_k: int, heads: int, num_sms: int,
                    deterministic: bool, schedule: str) -> BwdLaunch:
    """The launch of one sequence's backward (used lengths ``seqlen_q``/``seqlen_k``) as a batch-1 dense call:
    what the interim CUDA path runs, and the order the varlen kernels must give it."""
    return bwd_launch(causal, head_dim, seqlen_q, seqlen_k, 1, heads, num_sms, deterministic,
                      varlen_request(deterministic, schedule))
