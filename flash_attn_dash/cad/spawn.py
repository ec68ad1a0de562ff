"""Run a function on several local processes joined by a gloo group, under a hang watchdog.

For CAD's multi-process tests (CPU, or several processes sharing one GPU) and small experiments: no
launcher, no fixed port, and a hang ends in TimeoutError instead of blocking the caller.
"""
from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankError", "run_gloo"]


@dataclass(frozen=True)
class RankError:
    """What a rank raised, as its result (so a test can check every rank's error)."""

    kind: str
    message: str
    traceback: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], world_size: int, port: int, outdir: str, threads: int,
               timeout_s: float, args: tuple) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
    except Exception as exc:  # the result of this rank, reported to the caller
        result = RankError(type(exc).__name__, str(exc), traceback.format_exc())
    finally:
        # A rank that tears its connections down while a peer's gloo threads still finish an asynchronous
        # all_to_all can abort that peer at exit; leave together.
        dist.barrier()
        dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # Skip the interpreter's teardown: a joinable thread of torch's distributed runtime destroyed there aborts the
    # process ("terminate called without an active exception", seen once in a loaded CI run) after its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0,
             threads: int = 1) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes in one gloo group on 127.0.0.1.

    ``fn`` must be importable by name (a module-level function) and return something picklable. Returns the
    ranks' results in rank order; an exception raised by ``fn`` comes back as that rank's :class:`RankError`.
    Each process uses ``threads`` intra-op threads. Raises TimeoutError (after killing the processes) if they
    have not all finished within ``timeout_s``; collectives time out inside the ranks after the same time.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    with tempfile.TemporaryDirectory(prefix="cad-ranks-") as outdir:
        ctx = mp.start_processes(_rank_main, args=(fn, world_size, _free_port(), outdir, threads, timeout_s, args),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                        p.join()
                raise TimeoutError(f"{world_size} ranks of {getattr(fn, '__name__', fn)} did not finish in "
                                   f"{timeout_s:.0f} s (hang?); killed them")
        results = []
        for rank in range(world_size):
            with open(os.path.join(outdir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
