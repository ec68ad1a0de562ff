#!/usr/bin/env python
"""Bitwise-reproducible training: a small GPT trained twice per attention implementation, compared bit for bit.

The model is a decoder-only GPT (RMSNorm, rotary positions, grouped-query attention, GELU MLP, untied embeddings)
trained with AdamW on packed documents: a seeded synthetic stream of documents with long-tailed lengths, built from
repeated n-grams (so there is something to learn), cut into rows of ``--seq-len`` tokens. Documents never see each
other: ``flash_attn_varlen_func(..., causal=True)`` gets one sequence per document segment through ``cu_seqlens``,
SDPA gets the equivalent block-diagonal causal mask, and rotary positions restart at every segment.

Three pairs of runs, each run from the same initial weights on the same batches:

* ``dash-det``: flash-attn-dash with ``deterministic=True`` and ``torch.use_deterministic_algorithms(True)``, the
  configuration meant to be bitwise reproducible: losses and final weights are compared bit for bit;
* ``dash-nondet``: flash-attn-dash with ``deterministic=False``;
* ``sdpa``: ``F.scaled_dot_product_attention`` with the block-diagonal causal mask.

The last two run with torch's switch off, as a job that does not ask for determinism would (SDPA's CUDA backends
switch to deterministic algorithms under it, so turning it on would hide what they do). Their report is the first step
where the two runs differ: in the loss (bitwise) or in the weights after the step's update (a hash of every
parameter's bytes), or "no divergence in N steps". A divergence there is the whole step's, of which attention's
backward is the usual source. Nothing is assumed: every verdict is what this run observed. On a CPU all pairs
normally come out identical, because the CPU reference path and CPU math are deterministic.

Writes ``train-reproducible-<device>.png`` (loss curves; per pair, |loss run 1 - loss run 2| per step) and
``train-reproducible-<device>.json`` (config, device, torch version, commit, per-step losses and fingerprints,
verdicts) into ``--out``, prints one verdict line per pair and a final ``RESULT`` line. Exit status 1 when the
deterministic pair is not bitwise identical.

    python examples/train_reproducible.py --device cpu
    python examples/train_reproducible.py --device cuda          # bf16, head dim 64, 4k-token rows, 50 steps
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import flash_attn_dash
from flash_attn_dash import flash_attn_varlen_func

# Head dims the CUDA kernels are built for; the CPU reference takes any even one (rotary halves the head dim).
KERNEL_HEAD_DIMS = (64, 128)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Per-device defaults: CPU tiny and fp32 (the reference path); CUDA bf16 with documents long enough (hundreds of
# tokens, several K/V tiles each) for a non-deterministic backward's reduction order to matter within 50 steps.
DEVICE_DEFAULTS = {
    "cpu": dict(steps=30, layers=2, d_model=64, heads=4, kv_heads=2, seq_len=128, batch=4, dtype="float32", lr=3e-3),
    "cuda": dict(steps=50, layers=4, d_model=512, heads=8, kv_heads=2, seq_len=4096, batch=8, dtype="bfloat16",
                 lr=1e-3),
}
VOCAB = 256
BOS = 0
IGNORE = -100  # cross_entropy's ignore_index: the last token of a segment has no next token in its document
NUM_MOTIFS = 64
MOTIF_LENGTHS = (3, 8)
PARETO_ALPHA = 1.2  # document lengths: Pareto tail, most documents short, a few longer than a row


@dataclass(frozen=True)
class Config:
    """One demo: model, data and training sizes, shared by all six runs."""

    device: str
    steps: int
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    seq_len: int
    batch: int
    dtype: str
    lr: float
    seed: int
    out: str
    vocab: int = VOCAB

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def config_errors(cfg: Config) -> list[str]:
    """What is wrong with ``cfg``, as messages naming the options; empty when it can run (CUDA availability aside)."""
    errors = [f"--{name.replace('_', '-')} must be >= {low}, got {getattr(cfg, name)}"
              for name, low in (("steps", 1), ("layers", 1), ("d_model", 2), ("heads", 1), ("kv_heads", 1),
                                ("seq_len", 2), ("batch", 1))
              if getattr(cfg, name) < low]
    if not cfg.lr > 0:
        errors.append(f"--lr must be > 0, got {cfg.lr}")
    if errors:
        return errors
    if cfg.heads % cfg.kv_heads:
        errors.append(f"--heads {cfg.heads} must be a multiple of --kv-heads {cfg.kv_heads} (grouped-query attention:"
                      " each K/V head serves heads / kv-heads query heads)")
    if cfg.d_model % cfg.heads:
        errors.append(f"--d-model {cfg.d_model} must be a multiple of --heads {cfg.heads}")
    elif cfg.head_dim % 2:
        errors.append(f"head dim --d-model / --heads = {cfg.head_dim} must be even (rotary embeddings)")
    elif cfg.device == "cuda" and cfg.head_dim not in KERNEL_HEAD_DIMS:
        errors.append(f"head dim --d-model / --heads = {cfg.d_model} / {cfg.heads} = {cfg.head_dim}: the CUDA kernels "
                      f"support head dims {' and '.join(map(str, KERNEL_HEAD_DIMS))}")
    if cfg.device == "cuda" and cfg.dtype != "bfloat16":
        errors.append(f"--dtype {cfg.dtype}: on cuda the kernels run bfloat16 (float32 runs on the CPU reference)")
    return errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train_reproducible.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=sorted(DEVICE_DEFAULTS), default="cpu")
    for name, kind in (("steps", int), ("layers", int), ("d-model", int), ("heads", int), ("kv-heads", int),
                       ("seq-len", int), ("batch", int), ("lr", float)):
        parser.add_argument(f"--{name}", type=kind, help="default: per device (cpu: %(cpu)s, cuda: %(cuda)s)" % {
            device: defaults[name.replace("-", "_")] for device, defaults in DEVICE_DEFAULTS.items()})
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--seed", type=int, default=0, help="data and initial weights (default 0)")
    parser.add_argument("--out", default="train-reproducible-out", help="directory for the PNG and the JSON")
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a checked Config; exits with a message naming the bad option before any training."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    defaults = DEVICE_DEFAULTS[args["device"]]
    cfg = Config(**{key: defaults[key] if value is None else value for key, value in args.items()})
    errors = config_errors(cfg)
    if not errors and cfg.device == "cuda" and not (torch.cuda.is_available() and flash_attn_dash.kernels_available()):
        errors.append("--device cuda needs a CUDA GPU and flash-attn-dash's compiled kernels (flash-attn-dash info)")
    if errors:
        parser.error("; ".join(errors))
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# Data: synthetic documents packed into rows


@dataclass(frozen=True)
class PackedBatch:
    """``batch`` rows of ``seq_len`` tokens; each row is a pack of document segments (a document longer than the room
    left in a row continues in the next row, as a new segment)."""

    tokens: torch.Tensor  # (batch, seq_len) int64
    targets: torch.Tensor  # (batch, seq_len) int64: the next token of the same segment, else IGNORE
    positions: torch.Tensor  # (batch, seq_len) int64: index within the segment (rotary positions)
    segments: torch.Tensor  # (batch, seq_len) int64: segment id, unique within the batch
    cu_seqlens: torch.Tensor  # (segments + 1,) int32: the segments' offsets in the flattened (batch * seq_len) tokens
    max_seqlen: int

    def to(self, device: torch.device) -> PackedBatch:
        return replace(self, **{name: getattr(self, name).to(device)
                                for name in ("tokens", "targets", "positions", "segments", "cu_seqlens")})


def pack_batch(rows: list[list[list[int]]]) -> PackedBatch:
    """A batch from rows given as lists of segments (lists of token ids); every row must hold the same number of
    tokens."""
    lengths = [len(segment) for row in rows for segment in row]
    row_lengths = {sum(map(len, row)) for row in rows}
    if len(row_lengths) != 1 or min(lengths) < 1:
        raise ValueError(f"rows must be equally long and segments non-empty, got row lengths {sorted(row_lengths)}")
    tokens, targets, positions, segments = [], [], [], []
    for index, segment in enumerate(segment for row in rows for segment in row):
        tokens += segment
        targets += segment[1:] + [IGNORE]
        positions += range(len(segment))
        segments += [index] * len(segment)
    shape = (len(rows), row_lengths.pop())
    cu_seqlens = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    return PackedBatch(*(torch.tensor(values).view(shape) for values in (tokens, targets, positions, segments)),
                       cu_seqlens=cu_seqlens, max_seqlen=max(lengths))


def synthetic_documents(rng: random.Random, vocab: int, seq_len: int) -> Iterator[list[int]]:
    """An endless stream of documents: BOS, then n-grams drawn from a fixed set of motifs (learnable: a motif's first
    token predicts the rest), truncated to a Pareto-distributed length between ``seq_len // 32`` (at least 8) and
    ``2 * seq_len``."""
    motifs = [[rng.randrange(1, vocab) for _ in range(rng.randint(*MOTIF_LENGTHS))] for _ in range(NUM_MOTIFS)]
    shortest = max(8, seq_len // 32)
    while True:
        length = min(2 * seq_len, int(shortest * rng.paretovariate(PARETO_ALPHA)))
        document = [BOS]
        while len(document) < length:
            document += rng.choice(motifs)
        yield document[:length]


def pack_rows(documents: Iterator[list[int]], seq_len: int) -> Iterator[list[list[int]]]:
    """Cut a document stream into rows of exactly ``seq_len`` tokens, as lists of segments."""
    row, room = [], seq_len
    for document in documents:
        while document:
            segment, document = document[:room], document[room:]
            row.append(segment)
            room -= len(segment)
            if room == 0:
                yield row
                row, room = [], seq_len


def make_batches(cfg: Config) -> list[PackedBatch]:
    """All training batches, from ``cfg.seed`` alone: every run of the demo trains on exactly these."""
    rows = pack_rows(synthetic_documents(random.Random(cfg.seed), cfg.vocab, cfg.seq_len), cfg.seq_len)
    return [pack_batch(list(itertools.islice(rows, cfg.batch))) for _ in range(cfg.steps)]


# ---------------------------------------------------------------------------------------------------------------
# Attention implementations: (q (b, s, h, d), k and v (b, s, h_kv, d), batch) -> (b, s, h, d)

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedBatch], torch.Tensor]


def dash_attention(deterministic: bool) -> AttentionFn:
    """flash-attn-dash varlen attention over the batch's document segments, causal within each."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        b, s, h, d = q.shape
        out = flash_attn_varlen_func(q.reshape(b * s, h, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                                     batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen, batch.max_seqlen,
                                     causal=True, deterministic=deterministic)
        return out.view(b, s, h, d)

    return attend


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """(b, 1, s, s) bool: query i sees key j iff both are in the same segment and j <= i."""
    return (segments[:, :, None] == segments[:, None, :]).tril()[:, None]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """PyTorch SDPA with the block-diagonal causal mask equivalent to the varlen call."""
    b, s, h, d = q.shape
    group = h // k.shape[2]
    # Query head i reads K/V head i // group, as in the varlen call. expand+reshape rather than repeat_interleave,
    # whose CUDA backward is non-deterministic: the GQA broadcast must add no non-determinism of its own.
    k, v = (t[:, :, :, None].expand(b, s, t.shape[2], group, d).reshape(b, s, h, d) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=block_causal_mask(batch.segments))
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------------------------------------------
# Model


def rotary_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (b, s, 1, head_dim / 2), fp32, of the rotary angles at ``positions`` (b, s)."""
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions[..., None].float() * inv_freq
    return angles.cos()[:, :, None], angles.sin()[:, :, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions; the attention itself is a pluggable ``AttentionFn``."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.d_model, bias=False)
        self.attn_dtype = DTYPES[cfg.dtype]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: PackedBatch,
                attention: AttentionFn) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        # Rotary runs in fp32; the attention takes the compute dtype (the CUDA kernels: bf16).
        q, k, v = (t.to(self.attn_dtype) for t in (apply_rotary(q, *rope), apply_rotary(k, *rope), v))
        return self.proj(attention(q, k, v, batch).reshape(b, s, -1))


class Block(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.d_model), nn.RMSNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: PackedBatch,
                attention: AttentionFn) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, batch, attention)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Token embedding, ``cfg.layers`` blocks, final RMSNorm, untied output head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, batch: PackedBatch, attention: AttentionFn) -> torch.Tensor:
        """Logits (batch, seq_len, vocab)."""
        rope = rotary_tables(batch.positions, self.head_dim)
        x = self.embed(batch.tokens)
        for block in self.blocks:
            x = block(x, rope, batch, attention)
        return self.head(self.norm(x))


# ---------------------------------------------------------------------------------------------------------------
# Training and comparison


@dataclass(frozen=True)
class PairSpec:
    """Two runs with one attention implementation and one setting of torch's deterministic switch."""

    name: str
    label: str
    attention: AttentionFn
    torch_deterministic: bool


# torch's switch is on only in the pair meant to be deterministic: under it, SDPA's CUDA backends pick deterministic
# algorithms too, which would hide what the non-deterministic runs do.
PAIRS = (
    PairSpec("dash-det", "flash-attn-dash deterministic=True", dash_attention(True), True),
    PairSpec("dash-nondet", "flash-attn-dash deterministic=False", dash_attention(False), False),
    PairSpec("sdpa", "PyTorch SDPA, block-diagonal causal mask", sdpa_attention, False),
)


@dataclass
class RunResult:
    """One training run: the loss of every step, a fingerprint of the weights after every step's update, and the
    final weights (on the CPU)."""

    losses: list[float]
    fingerprints: list[str]
    final_weights: dict[str, torch.Tensor]
    seconds: float


@contextmanager
def torch_deterministic(enabled: bool) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(enabled)`` for the block, then the previous setting."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def weights_fingerprint(model: nn.Module) -> str:
    """A hash of the bytes of every parameter (fp32 master weights), in parameter order."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def train(cfg: Config, batches: list[PackedBatch], attention: AttentionFn, torch_det: bool) -> RunResult:
    """Train a freshly initialised GPT (seed ``cfg.seed``: the same weights every run) for one step per batch."""
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    start = time.perf_counter()
    with torch_deterministic(torch_det):
        torch.manual_seed(cfg.seed)
        model = GPT(cfg).to(device)  # fp32 master weights; bf16 compute through autocast
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
        losses, fingerprints = [], []
        for batch in batches:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                logits = model(batch, attention)
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            fingerprints.append(weights_fingerprint(model))
    final = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    return RunResult(losses, fingerprints, final, time.perf_counter() - start)


def first_difference(a: list[str], b: list[str]) -> int | None:
    """The first 1-based step where two per-step sequences differ, or None."""
    return next((step for step, (x, y) in enumerate(zip(a, b), 1) if x != y), None)


@dataclass(frozen=True)
class PairReport:
    """What two runs of a pair did, step by step: steps are 1-based; the loss of step t is computed before its
    update, the weights fingerprint after it, so weights that first differ after step t show in the loss of t + 1."""

    name: str
    label: str
    steps: int
    first_loss_divergence: int | None
    first_weight_divergence: int | None
    final_weights_identical: bool
    differing_tensors: int
    tensors: int
    max_abs_weight_diff: float
    max_abs_loss_diff: float

    @property
    def identical(self) -> bool:
        return self.first_loss_divergence is None and self.first_weight_divergence is None \
            and self.final_weights_identical

    @property
    def first_divergence(self) -> int | None:
        steps = [s for s in (self.first_loss_divergence, self.first_weight_divergence) if s is not None]
        return min(steps, default=None)

    def verdict(self) -> str:
        if self.identical:
            return (f"{self.name} ({self.label}): no divergence in {self.steps} steps: losses and weights bitwise "
                    f"identical at every step, final weights identical")
        where = []
        if self.first_weight_divergence is not None:
            where.append(f"weights first differ after step {self.first_weight_divergence}")
        if self.first_loss_divergence is not None:
            where.append(f"losses first differ at step {self.first_loss_divergence}")
        return (f"{self.name} ({self.label}): diverged at step {self.first_divergence} of {self.steps}: "
                f"{', '.join(where)}; final weights differ in {self.differing_tensors}/{self.tensors} tensors "
                f"(max |dw| {self.max_abs_weight_diff:.3g}); max |dloss| {self.max_abs_loss_diff:.3g}")

    def to_json(self) -> dict:
        return {**asdict(self), "identical": self.identical, "first_divergence": self.first_divergence,
                "verdict": self.verdict()}


def compare_runs(spec: PairSpec, one: RunResult, two: RunResult) -> PairReport:
    """Losses compared bitwise (``float.hex``), weights by fingerprint per step and tensor by tensor at the end."""
    differing = [name for name in one.final_weights
                 if not torch.equal(one.final_weights[name], two.final_weights[name])]
    return PairReport(
        name=spec.name, label=spec.label, steps=len(one.losses),
        first_loss_divergence=first_difference([x.hex() for x in one.losses], [x.hex() for x in two.losses]),
        first_weight_divergence=first_difference(one.fingerprints, two.fingerprints),
        final_weights_identical=not differing, differing_tensors=len(differing), tensors=len(one.final_weights),
        max_abs_weight_diff=max(((one.final_weights[n] - two.final_weights[n]).abs().max().item() for n in differing),
                                default=0.0),
        max_abs_loss_diff=max(abs(x - y) for x, y in zip(one.losses, two.losses)))


def result_line(cfg: Config, reports: list[PairReport]) -> str:
    """The final one-line verdict: what each pair did on this device."""
    parts = [f"{r.name} " + ("bitwise identical" if r.identical else f"diverged at step {r.first_divergence}")
             for r in reports]
    return f"RESULT ({cfg.device}, {cfg.dtype}, {cfg.steps} steps): " + "; ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Outputs


def git_commit() -> str:
    """The commit that ran: $GIT_COMMIT when set (a machine that got a copy of the working tree can hold a stale
    .git, so the caller names the commit it sent), else ``git rev-parse HEAD`` of the flash_attn_dash checkout with
    "-dirty" when tracked files differ from it, else "unknown"."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        git = ["git", "-C", str(Path(flash_attn_dash.__file__).parent)]
        commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.strip() + ("-dirty" if dirty.strip() else "")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def plot(path: Path, cfg: Config, runs: dict[str, RunResult], reports: list[PairReport], title: str) -> None:
    """Loss curves of all runs on top; below, one panel per pair with |loss run 1 - loss run 2| per step on a
    logarithmic axis that runs linearly through 0, where bitwise-equal losses sit as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(1, cfg.steps + 1))
    fig = plt.figure(figsize=(13, 8), layout="constrained")
    grid = fig.add_gridspec(2, len(reports), height_ratios=(3, 2))
    top = fig.add_subplot(grid[0, :])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (color, report) in enumerate(zip(colors, reports)):
        # Wider lines for earlier pairs, so that curves lying exactly on top of each other stay visible.
        for run, style, width in (("1", "-", 6 - 2 * index), ("2", "--", 1.2)):
            top.plot(steps, runs[f"{report.name}-{run}"].losses, style, color=color, linewidth=width,
                     label=f"{report.name} run {run}")
    top.set(xlabel="step", ylabel="training loss", title=title)
    top.legend(ncol=len(reports))
    for column, (color, report) in enumerate(zip(colors, reports)):
        ax = fig.add_subplot(grid[1, column])
        diffs = [abs(x - y) for x, y in zip(runs[f"{report.name}-1"].losses, runs[f"{report.name}-2"].losses)]
        nonzero = [d for d in diffs if d > 0]
        # symlog: logarithmic from the decade of the smallest difference seen, linear below it through 0, so that
        # bitwise-equal losses sit on 0; ticks at 0 and at decades (none when every difference is 0).
        low = math.floor(math.log10(min(nonzero, default=1e-7)))
        high = math.ceil(math.log10(max(nonzero))) if nonzero else low + 2
        ax.set_yscale("symlog", linthresh=10.0 ** low)
        ax.set_yticks([0.0] + [10.0 ** e for e in range(low, high + 1, 1 + (high - low) // 6) if nonzero])
        ax.minorticks_off()
        ax.plot([s for s, d in zip(steps, diffs) if d > 0], nonzero, "o-", color=color, markersize=3)
        ax.plot([s for s, d in zip(steps, diffs) if d == 0], [0.0] * (len(diffs) - len(nonzero)), "v",
                color="gray", markersize=4, label="0: bitwise equal loss")
        if report.first_weight_divergence is not None:
            ax.axvline(report.first_weight_divergence, color="red", linestyle=":",
                       label=f"weights differ after step {report.first_weight_divergence}")
        ax.set_ylim(-0.3 * 10.0 ** low, 3 * 10.0 ** high)
        ax.set(xlabel="step", ylabel="|loss run 1 - loss run 2|", title=report.name)
        ax.legend(fontsize=7, loc="upper left")
        if report.identical:
            ax.text(0.5, 0.5, f"bitwise identical\n(losses and weights,\nall {report.steps} steps)",
                    transform=ax.transAxes, ha="center", va="center", fontsize=11, color=color)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    """Run the demo; returns what it writes to the JSON."""
    # torch's deterministic switch requires this cuBLAS workspace setting on CUDA; it is read when cuBLAS starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cfg = parse_args(argv)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device)
    batches = [b.to(device) for b in make_batches(cfg)]
    runs: dict[str, RunResult] = {}
    for spec in PAIRS:
        for run in (1, 2):
            runs[f"{spec.name}-{run}"] = done = train(cfg, batches, spec.attention, spec.torch_deterministic)
            print(f"{spec.name} run {run}: loss {done.losses[0]:.4f} -> {done.losses[-1]:.4f} in {done.seconds:.1f} s",
                  flush=True)
    reports = [compare_runs(spec, runs[f"{spec.name}-1"], runs[f"{spec.name}-2"]) for spec in PAIRS]
    result = result_line(cfg, reports)
    commit = git_commit()
    record = {
        "config": asdict(cfg), "device": device_name(cfg.device), "torch": torch.__version__, "commit": commit,
        "flash_attn_dash": flash_attn_dash.__version__,
        "runs": {name: {"losses": r.losses, "fingerprints": r.fingerprints, "seconds": r.seconds}
                 for name, r in runs.items()},
        "pairs": {spec.name: {**report.to_json(), "torch_deterministic_algorithms": spec.torch_deterministic}
                  for spec, report in zip(PAIRS, reports)},
        "result": result,
    }
    stem = out / f"train-reproducible-{cfg.device}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    title = (f"{cfg.layers}-layer GPT, d_model {cfg.d_model}, {cfg.heads}/{cfg.kv_heads} heads, {cfg.batch}x"
             f"{cfg.seq_len} packed tokens, {cfg.dtype} on {record['device']}; torch {torch.__version__}, "
             f"commit {commit[:10]}")
    plot(stem.with_suffix(".png"), cfg, runs, reports, title)
    for report in reports:
        print(report.verdict())
    print(result)
    return record


if __name__ == "__main__":
    sys.exit(0 if main()["pairs"]["dash-det"]["identical"] else 1)
