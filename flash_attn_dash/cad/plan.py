"""The CAD planner: which attention server computes each chunk of each document.

Pure Python on exact integers with fixed tie-breaks and no hashing of sets, so every process that sees the
same arguments builds the same plan (whatever PYTHONHASHSEED or the host); a sha256 fingerprint of the plan
lets :func:`flash_attn_dash.cad.cad_attn_func` check that at run time.

Algorithm (greedy, after DistCA's bytes-per-FLOP scheduler, on a fixed chunk grid):
  1. every chunk starts on the rank that owns its document;
  2. memory repair: while a server is over its budget, move the chunk that frees the most memory from the
     lowest such server to the least-loaded server it fits on;
  3. balance: take the most loaded server (lowest rank on ties) until max/mean <= 1 + tolerance; among its
     chunks x and servers r with load[r] + cost(x) < load[donor] that fit r's budget, move the one with the
     fewest bytes on the wire (forward and backward) per pair moved (ties: doc, chunk, server). Each move
     lowers the sum of squared loads, so the loop ends; it stops early when no such move exists.
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .grid import TILE, chunk_bounds, chunk_cost, kv_rows, num_chunks

__all__ = ["CADPlan", "CADPlanError", "Move", "PHASES", "Task", "plan_cad"]

_LSE_BYTES = 4  # the kernels' log-sum-exp is fp32

# Phase -> (split matrix, direction). Matrices are indexed [owner][server]; "to_server" phases send from the
# owner's rows (rank = owner), the others send from the server's rows back to the owner.
PHASES = {
    "q": ("q_rows", "to_server"),        # forward: queries to their chunk's server
    "kv": ("kv_rows", "to_server"),      # forward: each document's K/V prefix, once per server (K and V)
    "out": ("q_rows", "to_owner"),       # forward: attention output back
    "dout": ("q_rows", "to_server"),     # backward: output gradient to the server
    "dq": ("q_rows", "to_owner"),        # backward: query gradient back
    "dkv": ("partial_rows", "to_owner"),  # backward: per-chunk dK/dV partials back (K and V)
}


class CADPlanError(ValueError):
    """plan_cad cannot build a plan for these arguments (bad argument, or a memory budget that cannot hold it)."""


@dataclass(frozen=True)
class Task:
    """One chunk on its server: the kernel calls that compute it and where its rows live in the server's buffers.

    Offsets are rows of the server's receive buffers: queries (and O, dO, dQ) at ``q_offset``; the document's
    K/V prefix at ``kv_offset`` (shared by the document's chunks on this server); its dK/dV partial, rows
    [0, kv_rows) of the document, at ``partial_offset``.
    """

    doc: int
    owner: int
    local_doc: int
    chunk: int
    start: int
    end: int
    kv_rows: int
    cost: int
    q_offset: int
    kv_offset: int
    partial_offset: int


@dataclass(frozen=True)
class Move:
    """One step of the planner: chunk ``chunk`` of document ``doc`` went from ``source`` to ``dest``."""

    doc: int
    chunk: int
    source: int
    dest: int
    reason: str  # "memory" (budget repair) or "balance"


@dataclass(frozen=True)
class CADPlan:
    """Where each chunk is computed, the all_to_all split sizes that follow, and what it costs.

    Documents have global ids in rank-major order (rank 0's documents first); ``tasks[s]`` lists server s's
    chunks in canonical (doc, chunk) order, which is also owner-major. Split matrices count rows (tokens) and
    are indexed [owner][server]; use :meth:`splits` for one rank's all_to_all arguments.

    Attributes beyond the planner's arguments: ``memory_budget_bytes`` per server (None: unlimited);
    ``server_of[doc][chunk]``; ``moves`` in the order the planner made them; ``q_rows`` (queries, and O, dO,
    dQ), ``kv_rows`` (each document's K/V prefix once per server) and ``partial_rows`` (dK/dV partials);
    ``load_before``/``load_after`` in causal pairs per server (every chunk on its owner / this plan);
    ``memory_bytes`` per server under the plan_cad memory model; ``fingerprint``, sha256 of the arguments and
    the placement.
    """

    world_size: int
    chunk_size: int
    tolerance: float
    causal: bool
    heads: int
    heads_kv: int
    head_dim: int
    dtype_bytes: int
    memory_budget_bytes: tuple[int, ...] | None
    doc_lens: tuple[tuple[int, ...], ...]
    server_of: tuple[tuple[int, ...], ...]
    tasks: tuple[tuple[Task, ...], ...]
    moves: tuple[Move, ...]
    q_rows: tuple[tuple[int, ...], ...]
    kv_rows: tuple[tuple[int, ...], ...]
    partial_rows: tuple[tuple[int, ...], ...]
    load_before: tuple[int, ...]
    load_after: tuple[int, ...]
    memory_bytes: tuple[int, ...]
    fingerprint: str

    def doc_id(self, rank: int, local_doc: int) -> int:
        """Global id of document ``local_doc`` of ``rank``."""
        return sum(len(lens) for lens in self.doc_lens[:rank]) + local_doc

    def splits(self, phase: str, rank: int) -> tuple[list[int], list[int]]:
        """(send rows per peer, receive rows per peer) of ``rank`` in all_to_all phase ``phase`` (see PHASES)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}; got {phase!r}")
        name, direction = PHASES[phase]
        rows = getattr(self, name)
        by_owner = list(rows[rank])                      # rank as owner: rows per server
        by_server = [rows[o][rank] for o in range(self.world_size)]  # rank as server: rows per owner
        return (by_owner, by_server) if direction == "to_server" else (by_server, by_owner)

    @property
    def imbalance_before(self) -> float:
        """max/mean load with every chunk on its owner (1.0 for an empty batch)."""
        return _imbalance(self.load_before)

    @property
    def imbalance_after(self) -> float:
        """max/mean load of this plan."""
        return _imbalance(self.load_after)

    @property
    def moved_chunks(self) -> int:
        """Chunks computed away from their owner."""
        return sum(t.owner != s for s, tasks in enumerate(self.tasks) for t in tasks)

    @property
    def bytes_per_phase(self) -> dict[str, int]:
        """Bytes each all_to_all phase moves between different ranks (self copies excluded)."""
        return {phase: sum(self._phase_bytes(phase, r) for r in range(self.world_size)) for phase in PHASES}

    @property
    def max_send_bytes(self) -> int:
        """The most bytes one rank sends to other ranks over all phases of one forward + backward."""
        return max(sum(self._phase_bytes(p, r) for p in PHASES) for r in range(self.world_size))

    def _phase_bytes(self, phase: str, rank: int) -> int:
        send, _ = self.splits(phase, rank)
        rows = sum(n for peer, n in enumerate(send) if peer != rank)
        return rows * (self.heads if PHASES[phase][0] == "q_rows" else 2 * self.heads_kv) * self.head_dim \
            * self.dtype_bytes

    def summary(self) -> dict:
        """The plan's metrics as plain JSON-able values."""
        return {
            "world_size": self.world_size, "chunk_size": self.chunk_size, "tolerance": self.tolerance,
            "causal": self.causal, "documents": sum(len(lens) for lens in self.doc_lens),
            "chunks": sum(len(tasks) for tasks in self.tasks), "load_before": list(self.load_before),
            "load_after": list(self.load_after), "imbalance_before": self.imbalance_before,
            "imbalance_after": self.imbalance_after, "moves": len(self.moves), "moved_chunks": self.moved_chunks,
            "bytes_per_phase": self.bytes_per_phase, "max_send_bytes": self.max_send_bytes,
            "memory_bytes": list(self.memory_bytes), "fingerprint": self.fingerprint,
        }


def _imbalance(loads: Sequence[int]) -> float:
    total = sum(loads)
    return max(loads) * len(loads) / total if total else 1.0


# ----------------------------------------------------------------------------------------------- validation
def check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise CADPlanError(f"{name} must be an int >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise CADPlanError(f"{name} must be an int >= {minimum}, got {type(value).__name__}") from None
    if number < minimum:
        raise CADPlanError(f"{name} must be an int >= {minimum}, got {number}")
    return number


def check_doc_lens(doc_lens: object) -> tuple[tuple[int, ...], ...]:
    if isinstance(doc_lens, (str, bytes)) or not isinstance(doc_lens, Sequence) or not doc_lens:
        raise CADPlanError("doc_lens must be a non-empty list with one list of document lengths per rank")
    table = []
    for r, lens in enumerate(doc_lens):
        if isinstance(lens, (str, bytes)) or not isinstance(lens, Sequence):
            raise CADPlanError(f"doc_lens[{r}] must be a list of document lengths, got {type(lens).__name__}")
        if not lens:
            raise CADPlanError(f"doc_lens[{r}] is empty: every rank must hold at least one document")
        table.append(tuple(check_int(f"doc_lens[{r}][{i}]", n, 1) for i, n in enumerate(lens)))
    return tuple(table)


def check_options(chunk_size: object, tolerance: object, heads: object, heads_kv: object, head_dim: object,
                   dtype_bytes: object, causal: object) -> tuple[int, float, int, int, int, int]:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0 or chunk_size % TILE:
        raise CADPlanError(f"chunk_size must be a positive multiple of {TILE} (the kernels' query tile), "
                           f"got {chunk_size!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise CADPlanError(f"tolerance must be a number >= 0 (math.inf: no balancing), got {tolerance!r}")
    dims = [check_int(name, value, 1) for name, value in
            (("heads", heads), ("heads_kv", heads_kv), ("head_dim", head_dim), ("dtype_bytes", dtype_bytes))]
    if dims[0] % dims[1]:
        raise CADPlanError(f"heads ({dims[0]}) must be a multiple of heads_kv ({dims[1]}) for GQA/MQA")
    if not isinstance(causal, bool):
        raise CADPlanError(f"causal must be a bool, got {type(causal).__name__}")
    return (chunk_size, float(tolerance), *dims)


# ----------------------------------------------------------------------------------------------- planner
@dataclass(frozen=True)
class _Chunk:
    doc: int
    owner: int
    local_doc: int
    chunk: int
    start: int
    end: int
    kv_rows: int
    cost: int


class _State:
    """Mutable placement: server, load and memory per server, K/V prefix per (doc, server)."""

    def __init__(self, chunks: list[_Chunk], world: int, row_bytes: tuple[int, int, int]):
        self.chunks = chunks
        self.world = world
        self.q_row_bytes, self.kv_row_bytes, self.task_row_bytes = row_bytes
        self.server = [c.owner for c in chunks]
        self.by_doc: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            self.by_doc.setdefault(c.doc, []).append(i)
        self.load = [0] * world
        self.memory = [0] * world
        for i, c in enumerate(chunks):
            self.load[c.owner] += c.cost
            self.memory[c.owner] += self.task_bytes(i)
        for doc in self.by_doc:
            for s in range(world):
                self.memory[s] += self.kv_row_bytes * self.prefix(doc, s)

    def task_bytes(self, i: int) -> int:
        """Server memory of one chunk besides its document's K/V prefix: Q, O, dO, dQ, LSE, dK/dV partial."""
        c = self.chunks[i]
        return (c.end - c.start) * self.task_row_bytes + c.kv_rows * self.kv_row_bytes

    def prefix(self, doc: int, server: int, skip: int = -1) -> int:
        """K/V rows document ``doc`` needs on ``server`` (ignoring chunk ``skip``)."""
        return max((self.chunks[i].kv_rows for i in self.by_doc[doc] if i != skip and self.server[i] == server),
                   default=0)

    def added_bytes(self, i: int, dest: int) -> int:
        c = self.chunks[i]
        grow = max(0, c.kv_rows - self.prefix(c.doc, dest))
        return self.task_bytes(i) + grow * self.kv_row_bytes

    def freed_bytes(self, i: int) -> int:
        c, src = self.chunks[i], self.server[i]
        shrink = self.prefix(c.doc, src) - self.prefix(c.doc, src, skip=i)
        return self.task_bytes(i) + shrink * self.kv_row_bytes

    def sent_bytes(self, i: int, dest: int) -> int:
        """Bytes chunk i costs on the wire if ``dest`` computes it: none on its owner, else Q, O, dO and dQ rows,
        the K/V rows ``dest`` does not hold yet, and its dK/dV partial."""
        c = self.chunks[i]
        if dest == c.owner:
            return 0
        grow = max(0, c.kv_rows - self.prefix(c.doc, dest))
        return 4 * (c.end - c.start) * self.q_row_bytes + (grow + c.kv_rows) * self.kv_row_bytes

    def move(self, i: int, dest: int) -> None:
        c, src = self.chunks[i], self.server[i]
        freed, added = self.freed_bytes(i), self.added_bytes(i, dest)
        self.server[i] = dest
        self.load[src] -= c.cost
        self.load[dest] += c.cost
        self.memory[src] -= freed
        self.memory[dest] += added

    def on(self, server: int) -> list[int]:
        return [i for i, s in enumerate(self.server) if s == server]


def _repair_memory(state: _State, budgets: tuple[int, ...], moves: list[Move]) -> None:
    while True:
        over = [s for s in range(state.world) if state.memory[s] > budgets[s]]
        if not over:
            return
        donor = over[0]
        best = None
        for i in state.on(donor):
            c = state.chunks[i]
            for r in range(state.world):
                if r != donor and state.memory[r] + state.added_bytes(i, r) <= budgets[r]:
                    key = (-state.freed_bytes(i), state.load[r] + c.cost, c.doc, c.chunk, r)
                    best = min(best, (key, i, r)) if best else (key, i, r)
        if best is None:
            raise CADPlanError(
                f"memory_budget_bytes too small: server {donor} needs {state.memory[donor]} bytes "
                f"(budget {budgets[donor]}) and no other server has room for any of its chunks")
        _, i, r = best
        c = state.chunks[i]
        moves.append(Move(c.doc, c.chunk, donor, r, "memory"))
        state.move(i, r)


def _balance(state: _State, budgets: tuple[int, ...], tolerance: float, moves: list[Move]) -> None:
    if math.isinf(tolerance):
        return
    bound = 1 + Fraction(tolerance)  # exact: the float's own binary value
    total = sum(state.load)
    while True:
        donor = max(range(state.world), key=lambda s: (state.load[s], -s))
        if state.load[donor] * state.world <= bound * total:
            return
        best = None
        for i in state.on(donor):
            c = state.chunks[i]
            for r in range(state.world):
                if r == donor or state.load[r] + c.cost >= state.load[donor]:
                    continue
                if state.memory[r] + state.added_bytes(i, r) > budgets[r]:
                    continue
                key = (Fraction(state.sent_bytes(i, r), c.cost), c.doc, c.chunk, r)
                best = min(best, (key, i, r)) if best else (key, i, r)
        if best is None:
            return
        _, i, r = best
        c = state.chunks[i]
        moves.append(Move(c.doc, c.chunk, donor, r, "balance"))
        state.move(i, r)


def _chunks(doc_lens: tuple[tuple[int, ...], ...], chunk_size: int, causal: bool) -> list[_Chunk]:
    chunks, doc = [], 0
    for owner, lens in enumerate(doc_lens):
        for local, length in enumerate(lens):
            for c in range(num_chunks(length, chunk_size)):
                start, end = chunk_bounds(length, chunk_size, c)
                chunks.append(_Chunk(doc, owner, local, c, start, end, kv_rows(length, end, causal),
                                     chunk_cost(start, end, length, causal)))
            doc += 1
    return chunks


def _fingerprint(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build_plan(doc_lens: tuple[tuple[int, ...], ...], chunk_size: int, tolerance: float, causal: bool,
               heads: int, heads_kv: int, head_dim: int, dtype_bytes: int,
               budgets: tuple[int, ...] | None) -> CADPlan:
    """plan_cad on validated arguments; ranks may hold no document (the halves of a ping-pong plan)."""
    world = len(doc_lens)
    q_row = heads * head_dim * dtype_bytes
    kv_row = 2 * heads_kv * head_dim * dtype_bytes  # K and V
    chunks = _chunks(doc_lens, chunk_size, causal)
    state = _State(chunks, world, (q_row, kv_row, 4 * q_row + heads * _LSE_BYTES))  # Q, O, dO, dQ rows + LSE
    load_before = tuple(state.load)
    limits = budgets if budgets is not None else (math.inf,) * world
    for i, c in enumerate(chunks):
        alone = state.task_bytes(i) + c.kv_rows * kv_row
        if alone > max(limits):
            raise CADPlanError(
                f"chunk {c.chunk} of document {c.local_doc} on rank {c.owner} (length "
                f"{doc_lens[c.owner][c.local_doc]}) needs {alone} bytes, over memory_budget_bytes "
                f"({max(limits)}) of every server; raise the budget or lower chunk_size")
    moves: list[Move] = []
    _repair_memory(state, limits, moves)
    _balance(state, limits, tolerance, moves)

    server_of = []
    for doc in range(len(state.by_doc)):
        server_of.append(tuple(state.server[i] for i in state.by_doc[doc]))
    tasks, q_rows, kv_rows_m, partial_rows = [], [[0] * world for _ in range(world)], \
        [[0] * world for _ in range(world)], [[0] * world for _ in range(world)]
    for s in range(world):
        server_tasks, q_off, kv_off, part_off, prefix_start = [], 0, 0, 0, {}
        for i in state.on(s):  # chunk list order is canonical (doc, chunk)
            c = chunks[i]
            if c.doc not in prefix_start:
                prefix_start[c.doc] = kv_off
                rows = state.prefix(c.doc, s)
                kv_off += rows
                kv_rows_m[c.owner][s] += rows
            server_tasks.append(Task(c.doc, c.owner, c.local_doc, c.chunk, c.start, c.end, c.kv_rows, c.cost,
                                     q_off, prefix_start[c.doc], part_off))
            q_rows[c.owner][s] += c.end - c.start
            partial_rows[c.owner][s] += c.kv_rows
            q_off += c.end - c.start
            part_off += c.kv_rows
        tasks.append(tuple(server_tasks))
    budget_field = None if budgets is None else tuple(budgets)
    fingerprint = _fingerprint({
        "version": 1, "doc_lens": doc_lens, "chunk_size": chunk_size, "tolerance": repr(tolerance),
        "causal": causal, "dims": [heads, heads_kv, head_dim, dtype_bytes], "budgets": budget_field,
        "server_of": server_of,
    })
    return CADPlan(
        world, chunk_size, tolerance, causal, heads, heads_kv, head_dim, dtype_bytes, budget_field, doc_lens,
        tuple(server_of), tuple(tasks), tuple(moves), tuple(map(tuple, q_rows)), tuple(map(tuple, kv_rows_m)),
        tuple(map(tuple, partial_rows)), load_before, tuple(state.load), tuple(state.memory), fingerprint,
    )


def plan_cad(
    doc_lens: Sequence[Sequence[int]],
    chunk_size: int = 2048,
    tolerance: float = 0.05,
    *,
    heads: int,
    heads_kv: int,
    head_dim: int,
    dtype_bytes: int = 2,
    memory_budget_bytes: int | None = None,
    causal: bool = True,
) -> CADPlan:
    """Plan core attention disaggregation for one batch.

    Args:
        doc_lens: ``doc_lens[r]`` lists the lengths of the documents packed on rank r, in order; every rank
            needs at least one document. The world size is ``len(doc_lens)``.
        chunk_size: rows per chunk of the canonical grid (a positive multiple of 128); results are bitwise
            the same for any plan at the same chunk_size.
        tolerance: stop balancing once max/mean load <= 1 + tolerance (0: as far as the greedy goes;
            math.inf: every chunk stays on its owner).
        heads, heads_kv, head_dim, dtype_bytes: attention dims and element size, for bytes and memory.
        memory_budget_bytes: per-server limit on CAD buffers (Q, O, dO, dQ rows, LSE, one K/V prefix per
            document and server, dK/dV partials); None: unlimited.
        causal: plan for a causal (bottom-right) mask; False: every chunk reads its whole document.

    Returns:
        A frozen :class:`CADPlan`.

    Raises:
        CADPlanError: a bad argument (named), a chunk that fits no server's budget, or a budget too small
            for the batch.
    """
    table = check_doc_lens(doc_lens)
    chunk_size, tolerance, heads, heads_kv, head_dim, dtype_bytes = check_options(
        chunk_size, tolerance, heads, heads_kv, head_dim, dtype_bytes, causal)
    budgets = None
    if memory_budget_bytes is not None:
        budgets = (check_int("memory_budget_bytes", memory_budget_bytes, 1),) * len(table)
    return build_plan(table, chunk_size, tolerance, causal, heads, heads_kv, head_dim, dtype_bytes, budgets)
