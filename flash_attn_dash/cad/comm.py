"""CAD's communication on torch.distributed: asynchronous all_to_all_single, and the agreement handshake that
runs before any data moves.

Transport: on a device backend (NCCL) the all_to_all runs on the backend's own communication stream and
``wait()`` orders the caller's current stream after it, so compute enqueued meanwhile overlaps the transfer.
On gloo, CPU tensors go as they are (the transfer runs on gloo's worker threads); CUDA tensors are staged
through host memory, which lets several processes share one GPU (NCCL refuses two ranks on one device).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

_WORD_BYTES = 7  # 56-bit words: negating one cannot overflow int64 (the handshake all_reduces [x, -x] by MAX)


def host_transport(group: dist.ProcessGroup | None) -> bool:
    """Whether the group's backend moves host memory (gloo), so CUDA tensors are staged through the host."""
    return dist.get_backend(group) == dist.Backend.GLOO


class Pending:
    """An all_to_all in flight; :meth:`wait` returns what arrived, on the sender's device."""

    def __init__(self, work: dist.Work, recv: torch.Tensor, send: torch.Tensor, device: torch.device):
        self._work, self._recv, self._send, self._device = work, recv, send, device

    def wait(self) -> torch.Tensor:
        self._work.wait()
        self._send = None  # the backend no longer reads it
        return self._recv.to(self._device)


def start_all_to_all(send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                     group: dist.ProcessGroup | None) -> Pending:
    """Start ``all_to_all_single`` of ``send`` (rows split along dim 0 per peer) and return it in flight."""
    wire = (send.cpu() if host_transport(group) else send).contiguous()
    recv = wire.new_empty((sum(recv_splits), *send.shape[1:]))
    work = dist.all_to_all_single(recv, wire, list(recv_splits), list(send_splits), group=group, async_op=True)
    return Pending(work, recv, wire, send.device)


def gather_doc_lens(cu_seqlens: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[list[int]]:
    """Every rank's document lengths from each rank's cu_seqlens: the ``doc_lens`` that plan_cad needs on all
    ranks (one all_gather_object; call it on every rank of ``group``)."""
    cu = cu_seqlens.tolist()
    table: list[list[int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(table, [b - a for a, b in zip(cu, cu[1:])], group=group)
    return table


def fingerprint_words(fingerprint: str) -> list[int]:
    """The first 224 bits of a hex sha256 as four non-negative 56-bit ints."""
    raw = bytes.fromhex(fingerprint)
    return [int.from_bytes(raw[i:i + _WORD_BYTES], "big") for i in range(0, 4 * _WORD_BYTES, _WORD_BYTES)]


def handshake(group: dist.ProcessGroup | None, local_error: Exception | None,
              agreement: dict[str, Sequence[int]]) -> None:
    """One fixed-size all_reduce through which every rank learns that all ranks accepted their inputs and agree.

    Its size depends only on the group and the agreement's keys, so ranks whose inputs are wrong still take
    part: a rank with ``local_error`` raises it, the others raise RuntimeError naming the rejecting ranks,
    and nobody waits on a peer that gave up. ``agreement`` maps a name to non-negative ints (< 2**56) that
    must be equal on every rank.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    words = [w for values in agreement.values() for w in values]
    flags = [0] * world
    flags[rank] = int(local_error is not None)
    device = torch.device("cpu") if host_transport(group) else torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor(flags + words + [-w for w in words], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    values = t.tolist()
    if local_error is not None:
        raise local_error
    rejected = [r for r in range(world) if values[r]]
    if rejected:
        raise RuntimeError(f"cad_attn_func: rank(s) {rejected} of the group rejected their inputs (see the error "
                           "raised there); no data was exchanged")
    maxima, minima = values[world:world + len(words)], [-x for x in values[world + len(words):]]
    at = 0
    for name, ws in agreement.items():
        if maxima[at:at + len(ws)] != minima[at:at + len(ws)]:
            raise RuntimeError(f"cad_attn_func: {name} differs across the ranks of the group; every rank must "
                               "pass the same (see flash_attn_dash.cad.cad_attn_func)")
        at += len(ws)
