"""Every kernel variant flash-attn-dash can compile, in one declarative table.

``hopper/generate.py`` writes from this table the kernel translation units and schedule header under
``hopper/generated/`` and the binding's kernel table ``csrc/kernel_table.h``; the package reads head dims, tile shapes
and schedule names and ids from here. The build knobs ``FLASH_DASH_HDIMS``, ``FLASH_DASH_DTYPES`` and
``FLASH_DASH_PASSES`` select subsets of it (``build_config.py``).

A new head dim is a new :class:`HeadDim` entry; a new backward order is a policy in ``hopper/schedule/policies.hpp``,
a :class:`Schedule` entry here and its model in ``flash_attn_dash/schedule/orders.py``. Run
``python hopper/generate.py`` after editing; CI fails while a generated file is stale.

Pure Python (no torch): setup.py and the generator import it before torch exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MASKS = ("full", "causal")
DTYPES = ("bf16", "fp16")
PASSES = ("fwd", "bwd")


@dataclass(frozen=True)
class FwdTile:
    """One forward kernel configuration.

    ``block_m`` query rows per tile (one consumer warpgroup per 64 rows) by ``block_n`` keys per step, ``kv_stages``
    shared-memory stages of K and of V, ``q_stages`` Q buffers (2: the next tile's Q is loaded a tile ahead).
    ``l2_prefetch``: launches with this configuration prefetch the CTA's next tile (its Q and first two K/V blocks)
    into L2 once the current tile's first loads are out; it pays where all CTAs cross tile boundaries together
    (full masks).
    """

    block_m: int
    block_n: int
    kv_stages: int
    q_stages: int = 1
    l2_prefetch: bool = False

    def same_kernel(self, other: FwdTile) -> bool:
        """Whether two configurations compile to one kernel (they differ at most in the launch-time prefetch)."""
        return (self.block_m, self.block_n, self.kv_stages, self.q_stages) == \
            (other.block_m, other.block_n, other.kv_stages, other.q_stages)


@dataclass(frozen=True)
class BwdTile:
    """One backward kernel configuration: ``block_m`` x ``block_n`` tiles (Q rows x K/V rows) and the ``setmaxnreg``
    split between the producer/dQ-store warpgroup and the two MMA warpgroups (it must fit the launch allocation of
    168 registers x 384 threads).

    ``q_stages`` / ``do_stages``: shared-memory stages of Q and of dO. ``swap_dkv``: dK and dV are computed transposed
    (dV^T = dO^T P, head dim on the WGMMA M axis, P and dS through shared memory), so each MMA warpgroup holds half
    of them: what head dims above 128 need (``hopper/bwd/traits.hpp``).
    """

    block_m: int
    block_n: int
    producer_regs: int
    mma_regs: int
    q_stages: int = 2
    do_stages: int = 2
    swap_dkv: bool = False


@dataclass(frozen=True)
class HeadDim:
    """Kernels of one head dim (``qk`` for Q/K, ``v`` for V and the output), per pass and mask.

    ``default_build=False``: compiled only when ``FLASH_DASH_HDIMS`` names it, for an entry whose kernels have not
    passed the GPU tests yet (a default build refuses that head dim with a named error).
    ``fwd_inline_steps``: the forward consumer's step lambdas are forced inline (``hopper/fwd/mainloop.hpp``,
    FLASH_DASH_FWD_INLINE_STEPS), where ptxas would otherwise pass O's accumulator through the stack.
    """

    qk: int
    v: int
    fwd_full: FwdTile
    fwd_causal: FwdTile
    bwd: BwdTile
    default_build: bool = True
    fwd_inline_steps: bool = False

    @property
    def tag(self) -> str:
        """``hdim128`` (or ``hdim192v128`` when the V head dim differs)."""
        return f"hdim{self.build_name}"

    @property
    def build_name(self) -> str:
        """How ``FLASH_DASH_HDIMS`` names the entry: ``128``, or ``192v128`` when the V head dim differs."""
        return f"{self.qk}" if self.qk == self.v else f"{self.qk}v{self.v}"

    @property
    def label(self):
        """The entry in messages: ``128``, or the pair ``(192, 128)`` when the V head dim differs."""
        return self.qk if self.qk == self.v else (self.qk, self.v)

    def fwd(self, mask: str) -> FwdTile:
        _check_mask(mask)
        return self.fwd_causal if mask == "causal" else self.fwd_full


# Tile configurations chosen by measurement on the H200 (benchmarks/results/README.md).
HEAD_DIMS: tuple[HeadDim, ...] = (
    HeadDim(64, 64,
            fwd_full=FwdTile(192, 128, kv_stages=3),
            fwd_causal=FwdTile(192, 128, kv_stages=3),
            bwd=BwdTile(128, 128, producer_regs=24, mma_regs=240)),
    HeadDim(96, 96,
            fwd_full=FwdTile(128, 128, kv_stages=2, q_stages=2, l2_prefetch=True),
            fwd_causal=FwdTile(128, 128, kv_stages=2, q_stages=2),
            bwd=BwdTile(64, 128, producer_regs=40, mma_regs=232)),
    HeadDim(128, 128,
            fwd_full=FwdTile(128, 128, kv_stages=2, q_stages=2, l2_prefetch=True),
            fwd_causal=FwdTile(128, 128, kv_stages=2, q_stages=2),
            bwd=BwdTile(64, 128, producer_regs=40, mma_regs=232)),
    # Forward: Q (one stage) and two K/V stages fill the shared memory, so O leaves from registers
    # (FwdKernelTraits::kStagedO). Backward: swapped dK/dV; Q, dO, K, V, P, dS and the fp32 dQ hand-off buffer
    # (64 x d) fill the shared memory at these tiles with one dO stage (hdim 256's 64 keys: one Q stage too).
    HeadDim(192, 192,
            fwd_full=FwdTile(128, 96, kv_stages=2, l2_prefetch=True),
            fwd_causal=FwdTile(128, 96, kv_stages=2),
            bwd=BwdTile(64, 96, producer_regs=24, mma_regs=240, q_stages=2, do_stages=1, swap_dkv=True),
            fwd_inline_steps=True),
    HeadDim(256, 256,
            fwd_full=FwdTile(128, 64, kv_stages=2, l2_prefetch=True),
            fwd_causal=FwdTile(128, 64, kv_stages=2),
            bwd=BwdTile(64, 64, producer_regs=24, mma_regs=240, q_stages=1, do_stages=1, swap_dkv=True),
            fwd_inline_steps=True),
    # DeepSeek-V3's MLA (qk 192, v 128), opt-in (its four units would lengthen every default build). V's 128 columns
    # keep the forward's O accumulator at hdim 128's size, so it runs FA4's 128 x 128 tiles (faster than 128 x 96 in
    # an A/B); Q and two K/V stages then fill the shared memory and O leaves from registers. The backward has hdim
    # 192's tiles with 20 KB of shared memory spare (a second dO stage there measured slower).
    HeadDim(192, 128,
            fwd_full=FwdTile(128, 128, kv_stages=2, l2_prefetch=True),
            fwd_causal=FwdTile(128, 128, kv_stages=2),
            bwd=BwdTile(64, 96, producer_regs=24, mma_regs=240, q_stages=2, do_stages=1, swap_dkv=True),
            default_build=False, fwd_inline_steps=True),
)


@dataclass(frozen=True)
class Schedule:
    """A dQ accumulation order of the backward (the DASH schedules).

    ``policy`` is the C++ policy type in ``hopper/schedule/policies.hpp`` (it may use the kernel's ``Traits``) and
    ``requires`` a compile-time condition on ``Traits`` for it to be instantiated. ``fallback`` is the order that runs
    when a call's shape breaks this order's assumptions (the model's ``orders.fallback_reason`` says when).
    ``portable``: a sequence's ranks and walks are functions of its own (n, m, N, M, mask), so its bits do not depend
    on its batch position, its neighbours, the grid or the SM count (``docs/portable-orders.md``).
    """

    name: str
    id: int
    masks: tuple[str, ...]
    policy: str
    grid: str  # "dynamic" (claimed tiles), "static" (tile t on CTA t mod G) or "pair" (tiles n and N-1-n together)
    requires: str = "true"
    fallback: str | None = None
    portable: bool = False


SCHEDULES: tuple[Schedule, ...] = (
    Schedule("ascending", 0, MASKS, "Ascending", grid="dynamic", portable=True),
    Schedule("descending", 1, MASKS, "Descending", grid="dynamic", portable=True),
    Schedule("shift", 2, ("full",), "Shift", grid="static"),
    Schedule("symmetric_shift", 3, ("causal",), "SymmetricShift<Traits::kBlockN / Traits::kBlockM>", grid="pair",
             requires="Traits::kBlockN % Traits::kBlockM == 0", fallback="descending"),
    Schedule("split", 4, ("causal",), "Split", grid="dynamic", fallback="descending", portable=True),
    Schedule("diagonal", 5, ("causal",), "Diagonal", grid="dynamic", fallback="descending", portable=True),
)

# The walk of a non-deterministic backward, per mask: the first order whose assumptions hold for the call. Its dQ adds
# after each tile's first store are unordered, so only the work balance and that first store matter: full masks take
# shift (every row's first contribution is a first step, and the static grid has no claim latency), causal masks the
# balanced pair grid, else descending (ascending would start tile n on row n, which tile 0 reaches after n steps).
NONDETERMINISTIC_WALKS: dict[str, tuple[str, ...]] = {
    "full": ("shift",),
    "causal": ("symmetric_shift", "descending"),
}

SCHEDULE_NAMES: tuple[str, ...] = tuple(s.name for s in SCHEDULES)

# Softcap kernels (forward kSoftcap, backward Is_softcap) exist for the full and causal masks; SOFTCAP_WITH names the
# features they also combine with, of ("window", "sink"): a sliding window would add one forward and five backward
# kernels per translation unit, a sink one or two forward kernels (the backward needs none). The launchers instantiate
# exactly these (hopper/generated/features.h) and the API refuses the others (features.kernel_refusal).
SOFTCAP_WITH: tuple[str, ...] = ("window",)
SOFTCAP_COMBINABLE = ("window", "sink")

# GQA sibling fold of the backward (hopper/schedule/sibling_walk.hpp): one tile per (batch, K/V head, K/V tile) runs
# every query head sharing the K/V head, dK/dV in registers and stored once (no fp32 accumulators, atomics, counters
# or postprocess). Every backward translation unit instantiates it for sliding windows; flash_attn_dash.launch runs it
# for calls with heads != heads_k on a band of at most GQA_FOLD_MAX_BAND_STEPS Q tiles per K/V tile. Why narrow bands
# only: there a K/V tile's short walk is dominated by its per-tile dK/dV accumulation, which the fold removes; on full
# and causal masks and wide bands G-times longer, G-times fewer tiles measured slower (deterministic most: the
# siblings' dQ waits line up behind one tile's walk). The bound sits where the measured gain ends
# (research/fold_threshold.py).
GQA_FOLD_MAX_BAND_STEPS = 20


def _check_mask(mask: str) -> None:
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")


def schedule(name: str) -> Schedule:
    """The table entry of schedule ``name``."""
    for s in SCHEDULES:
        if s.name == name:
            return s
    raise ValueError(f"schedule must be one of {', '.join(repr(n) for n in SCHEDULE_NAMES)}; got {name!r}")


def schedules_for(mask: str) -> tuple[str, ...]:
    """Names of the schedules defined for ``mask``, in table order."""
    _check_mask(mask)
    return tuple(s.name for s in SCHEDULES if mask in s.masks)


def head_dim(qk: int, v: int | None = None) -> HeadDim:
    """The table entry of head dim ``qk`` (V head dim ``v``, default ``qk``)."""
    v = qk if v is None else v
    for h in HEAD_DIMS:
        if (h.qk, h.v) == (qk, v):
            return h
    known = ", ".join(str(h.qk) if h.qk == h.v else f"({h.qk}, {h.v})" for h in HEAD_DIMS)
    raise ValueError(f"head_dim must be one of {known} (the kernels in flash_attn_dash/variants.py), got "
                     f"{qk if qk == v else (qk, v)}")


def bwd_tile(qk: int, v: int | None = None) -> tuple[int, int]:
    """``(block_m, block_n)`` of the backward kernel of this head dim (both masks)."""
    t = head_dim(qk, v).bwd
    return t.block_m, t.block_n


def fwd_tile(qk: int, mask: str, v: int | None = None) -> tuple[int, int]:
    """``(block_m, block_n)`` of the forward kernel of this head dim and mask."""
    t = head_dim(qk, v).fwd(mask)
    return t.block_m, t.block_n


@dataclass(frozen=True)
class Variant:
    """One kernel translation unit: a pass for one head dim and dtype."""

    pass_: str
    head: HeadDim
    dtype: str

    @property
    def name(self) -> str:
        """``fwd_hdim128_bf16``: the instantiation's name, its file stem and its entry point's suffix."""
        return f"{self.pass_}_{self.head.tag}_{self.dtype}"


def variants() -> tuple[Variant, ...]:
    """Every translation unit of the table, in a fixed order."""
    return tuple(Variant(p, h, d) for p in PASSES for h in HEAD_DIMS for d in DTYPES)
