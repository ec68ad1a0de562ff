"""The one place that decides how a backward runs: which order (policy), on how many CTAs, with which claim group.

:func:`bwd_launch` turns a call's arguments into a :class:`BwdLaunch`, which the binding passes to the kernel launcher
as is (the launcher only checks it, ``hopper/bwd/launch.h``). It is O(1) in the problem size: ``auto`` is a committed
rule (:func:`flash_attn_dash.schedule.auto.auto_schedule`), fallbacks and grid sizes are closed forms of the schedule
model (:mod:`flash_attn_dash.schedule.orders`), so the same decision is available on CPU (reference path, planner)
and costs a few microseconds per call. The model's ``build_plan`` makes the same decision through the same functions,
and the tests check the two against each other and against the kernel's recorded order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from . import variants
from .schedule.auto import BAND_SCHEDULE, auto_schedule
from .schedule.orders import claim_group, fallback_reason, num_ctas
from .schedule.tiles import TileGrid, band_steps

NO_WINDOW = (-1, -1)
CAUSAL_WINDOW = (-1, 0)  # the canonical causal mask


@dataclass(frozen=True)
class BwdLaunch:
    """A fully resolved backward launch.

    ``schedule``: the order that runs (a kernel policy); ``requested``: what the caller asked for (``"auto"`` resolved
    by the rule, or the walk of a non-deterministic backward); ``fallback``: why the requested order could not run
    this shape (``None`` if it runs); ``grid``: persistent CTAs; ``claim_group``: heads per claim group on the
    dynamic grid (1 elsewhere); ``gqa_fold``: the GQA sibling fold runs (one tile per K/V head walks every query
    head sharing it; the grid's heads are then the K/V heads, :func:`gqa_fold`).
    """

    schedule: str
    requested: str
    fallback: str | None
    grid: int
    claim_group: int
    gqa_fold: bool = False

    @property
    def schedule_id(self) -> int:
        """The policy id the kernels know the order by (``variants.SCHEDULES``)."""
        return variants.schedule(self.schedule).id


def check_schedule_name(schedule: str) -> None:
    """Raise ValueError unless ``schedule`` is ``"auto"`` or the name of an order (for some mask)."""
    if not isinstance(schedule, str) or (schedule != "auto" and schedule not in variants.SCHEDULE_NAMES):
        names = ", ".join(repr(s) for s in ("auto",) + variants.SCHEDULE_NAMES)
        raise ValueError(f"schedule must be one of {names}; got {schedule!r}")


def check_schedule(schedule: str, causal: bool) -> None:
    """Raise ValueError unless ``schedule`` is ``"auto"`` or an order defined for the mask (both modes alike)."""
    mask = "causal" if causal else "full"
    check_schedule_name(schedule)
    if schedule != "auto" and mask not in variants.schedule(schedule).masks:
        valid = ", ".join(repr(s) for s in ("auto",) + variants.schedules_for(mask))
        raise ValueError(f"schedule={schedule!r} is defined for {' and '.join(variants.schedule(schedule).masks)} "
                         f"masks only (causal={causal}); valid for {mask} masks: {valid}")


def model_mask(causal: bool, window: tuple[int, int]) -> str:
    """The schedule model's mask of a launch on the ``causal`` kernels with the kernels' ``window``
    (:func:`.features.kernel_window`; ``(-1, -1)`` with ``causal``: the causal mask): a window with a right side
    other than 0 is a band of the full mask."""
    if window == NO_WINDOW:
        return "causal" if causal else "full"
    if not causal:
        raise ValueError(f"window {window} runs on the causal kernels (causal=True), got causal=False")
    return "causal" if window[1] == 0 else "full"


def gqa_fold(heads: int, heads_k: int, band_steps: int | None) -> bool:
    """The GQA sibling fold's rule: it runs where query heads share K/V heads (``heads != heads_k``) on a sliding
    window whose K/V tiles walk at most ``variants.GQA_FOLD_MAX_BAND_STEPS`` Q tiles (``band_steps``:
    :meth:`.schedule.tiles.TileGrid.band_steps`, None on full and causal masks)."""
    return heads != heads_k and band_steps is not None and band_steps <= variants.GQA_FOLD_MAX_BAND_STEPS


def bwd_launch(causal: bool, head_dim: int, seqlen_q: int, seqlen_k: int, batch: int, heads: int, num_sms: int,
               deterministic: bool, schedule: str = "auto", window: tuple[int, int] = NO_WINDOW,
               heads_k: int | None = None, *, head_dim_v: int | None = None) -> BwdLaunch:
    """How the backward of this call runs on a persistent grid of at most ``num_sms`` CTAs (:func:`_bwd_launch`, cached;
    ``heads_k`` K/V heads, default ``heads``; ``head_dim_v`` v's head dim, default ``head_dim``)."""
    return _bwd_launch(*_launch_key(causal, head_dim, seqlen_q, seqlen_k, batch, heads, num_sms, deterministic,
                                    schedule, window, heads_k, head_dim_v))


def _launch_key(causal, head_dim, seqlen_q, seqlen_k, batch, heads, num_sms, deterministic, schedule="auto",
                window=NO_WINDOW, heads_k=None, head_dim_v=None) -> tuple:
    """:func:`_bwd_launch`'s arguments for a :func:`bwd_launch` call, defaults filled in (one cache entry per call)."""
    return (causal, head_dim, seqlen_q, seqlen_k, batch, heads, num_sms, deterministic, schedule, tuple(window),
            heads if heads_k is None else heads_k, head_dim if head_dim_v is None else head_dim_v)


@lru_cache(maxsize=4096)
def _bwd_launch(causal: bool, head_dim: int, seqlen_q: int, seqlen_k: int, batch: int, heads: int, num_sms: int,
                deterministic: bool, schedule: str, window: tuple[int, int], heads_k: int,
                head_dim_v: int) -> BwdLaunch:
    """How the backward of this call runs on a persistent grid of at most ``num_sms`` CTAs.

    Deterministic: ``schedule`` (``"auto"``: :func:`auto_schedule`) unless its assumptions fail for the shape, then
    its fallback. Non-deterministic: the first walk of ``variants.NONDETERMINISTIC_WALKS`` whose assumptions hold;
    ``schedule`` is validated but not used. ``causal``, ``window``: the kernels' (:func:`.features.kernel_window`).
    On a sliding window (the causal kernels with a window other than the causal mask's) ``auto`` is
    :data:`BAND_SCHEDULE` and non-deterministic backwards walk descending (or symmetric_shift on a causal window that
    removes no tile); ``shift``, a static-grid order of the full-mask kernels, raises NotImplementedError there.
    GQA (``heads != heads_k``) on a narrow sliding window runs the fold (:func:`gqa_fold`): the orders then walk a
    grid of ``batch * heads_k`` heads. Raises ValueError for a schedule not defined for the mask or a head dim without
    a backward kernel, or ``heads_k`` not dividing ``heads``. The tiles are the kernel's of (``head_dim``,
    ``head_dim_v``); ``auto``'s rule and measurements are the QK head dim's (MLA's kernel has hdim 192's tiles).
    """
    if not (isinstance(heads_k, int) and heads_k >= 1 and heads % heads_k == 0):
        raise ValueError(f"heads_k must be a positive divisor of heads={heads}, got {heads_k!r}")
    mask = model_mask(causal, window)
    windowed = window not in (NO_WINDOW, CAUSAL_WINDOW)
    if windowed:
        check_schedule_name(schedule)
    else:
        check_schedule(schedule, causal)
    block_m, block_n = variants.bwd_tile(head_dim, head_dim_v)
    grid = TileGrid(mask, seqlen_q, seqlen_k, block_m, block_n, window)
    fold = windowed and gqa_fold(heads, heads_k, grid.band_steps())
    grid_heads = batch * (heads_k if fold else heads)
    if deterministic:
        if schedule == "auto":
            wanted = BAND_SCHEDULE if windowed else auto_schedule(mask, head_dim, seqlen_q, seqlen_k)
        else:
            wanted = schedule
        if windowed and wanted == "shift":
            raise NotImplementedError(
                f"schedule='shift' does not run on sliding windows in the sm90 kernels (window {window}): use "
                f"'auto' ({BAND_SCHEDULE!r}), 'ascending', 'descending' or 'symmetric_shift'; CPU tensors run the "
                "reference with every schedule")
        candidates = (wanted,)
    else:
        candidates = ("descending",) if windowed and mask == "full" else variants.NONDETERMINISTIC_WALKS[mask]
        wanted = candidates[0]
    for name in candidates:
        why = fallback_reason(name, grid)
        if why is None:
            used = name
            break
    else:  # the last candidate falls back to its table fallback
        used = variants.schedule(candidates[-1]).fallback
    fallback = None if used == wanted else fallback_reason(wanted, grid)
    ctas = num_ctas(used, grid, grid_heads, num_sms)
    dynamic = variants.schedule(used).grid == "dynamic"
    # Non-deterministic walks claim in the same groups: head-major claims leave the last head's longest tiles for the
    # end of the run, where the other CTAs idle (causal tiles differ in length; test_schedule_orders has the model's
    # makespans).
    group = claim_group(grid.num_m, grid_heads, ctas) if dynamic else 1
    return BwdLaunch(used, wanted, fallback, ctas, group, fold)


# The cache's controls and the uncached decision (benchmarks/bench_host.py times both), as on an lru_cache.
bwd_launch.cache_clear = _bwd_launch.cache_clear  # type: ignore[attr-defined]
bwd_launch.cache_info = _bwd_launch.cache_info  # type: ignore[attr-defined]
bwd_launch.__wrapped__ = lambda *args, **kwargs: _bwd_launch.__wrapped__(*_launch_key(*args, **kwargs))  # type: ignore


# Varlen: the sequences of a pack share one persistent grid, so a deterministic varlen backward is reproducible in a
# useful sense only if each sequence gets the same bits whatever it is packed with (its position, the other
# sequences, their number, sm_margin, the SM count). ``ascending``, ``descending``, ``split`` and ``diagonal`` have
# that property (ranks follow a claim order of the head's tiles fixed by N, and each K/V tile walks its Q tiles in an
# order that does not depend on the grid); ``shift`` and ``symmetric_shift`` derive ranks from the grid's rounds, so
# they run when asked for but their bits follow the pack.
PORTABLE_SCHEDULES: tuple[str, ...] = tuple(s.name for s in variants.SCHEDULES if s.portable)
# The portable orders the varlen kernel runs (hopper/bwd/launch.h, with_varlen_policy: its tile table holds claim
# positions, which the policy turns into K/V tiles); split and diagonal on causal packs without a sliding window only
# (UP_WALKS). A pack asking for another runs one dense backward per sequence.
VARLEN_KERNEL_ORDERS: tuple[str, ...] = PORTABLE_SCHEDULES
UP_WALKS: tuple[str, ...] = ("split", "diagonal")
# Deterministic varlen "auto": a portable order chosen by what may change bits anyway (head dim, mask, window), never
# by the pack. Descending: tile n starts on its last Q tile instead of queueing behind tile n-1 (the model: 1.36x
# ascending at hdim 128, 8k); on full masks the model puts the two within 1% (schedule/auto.py).
VARLEN_AUTO = "descending"
# Diagonal instead on causal packs without a window at these head dims: descending queues a head's tiles one store
# apart on its last Q tile, which short documents pay for (research/overlap_model.py); measured on an H100
# (benchmarks/results/2026-12-07-session24-gpu.txt, call 4): hdim 64 +10.0% / +5.9% on Pareto packs of 16k / 64k
# tokens, +2.3% / +8.8% on uniform causal 2k / 8k ones; hdim 128 +2.8% / +0.4% on Pareto, -3.8% / -1.9% uniform
# (diagonal claims a head's longest tile last), so hdim 128 keeps descending.
VARLEN_AUTO_DIAGONAL_HDIMS: tuple[int, ...] = (64,)


# The orders the varlen backward kernel runs (hopper/bwd/launch.h, with_varlen_policy; the dynamic-grid ones of
# hopper/bwd/tiles.hpp): the portable ones when deterministic; a non-deterministic pack walks descending.
VARLEN_KERNEL_NONDETERMINISTIC_WALK = "descending"


@dataclass(frozen=True)
class VarlenKernelLaunch:
    """The varlen backward kernel's launch for a pack: the ``order`` every sequence walks, the ``grid`` and the GQA
    fold: with ``gqa_fold`` a sequence folds when its used lengths exceed ``fold_min_len_q`` and ``fold_min_len_k``
    (:func:`varlen_fold_lengths`), which is when its dense call folds."""

    order: str
    grid: int
    gqa_fold: bool = False
    fold_min_len_q: int = 0
    fold_min_len_k: int = 0


def varlen_fold_lengths(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """``(min_q, min_k)``: a sequence with used lengths ``len_q > min_q`` and ``len_k > min_k`` keeps both sides of
    ``window`` (the pack's kernel window, both sides bounded) at its own lengths, so its dense call runs that band
    and folds where the pack's would (FlashAttention-3's rule, :func:`.schedule.tiles.canonical_window`: a side
    that clips nothing is unbounded, ``left >= len_k - 1`` or ``right >= len_q - 1``; ``causal`` keeps ``right =
    0``); other sequences run a mask with an unbounded side, which does not fold."""
    left, right = window
    return (0 if causal else right + 1), left + 1


def varlen_kernel_launch(deterministic: bool, schedule: str, head_dim: int, total_k: int, batch: int, heads: int,
                         num_sms: int, heads_k: int | None = None, window: tuple[int, int] = NO_WINDOW,
                         causal: bool = False, *, head_dim_v: int | None = None) -> VarlenKernelLaunch | None:
    """The varlen backward kernel's launch for this pack, from shapes alone (no offsets are read): the order
    :func:`varlen_request` asks each sequence for when the kernel runs it, else None (the request runs one dense
    backward per sequence); the grid is at most ``num_sms`` CTAs and at most the pack's tile count's upper bound.
    ``window``: the kernels' for the pack (:func:`.features.kernel_mask` at the maximum lengths), ``causal``: the
    call's. GQA packs on a window the dense backward folds (:func:`gqa_fold`) fold the sequences whose dense calls
    fold (:func:`varlen_fold_lengths`; a sequence's own window only unbounds sides, so where the pack's does not
    fold, no sequence's does): each sequence sums its siblings' dK/dV as its dense call does."""
    window = tuple(window)
    order = (varlen_request(deterministic, schedule, head_dim, window) if deterministic
             else VARLEN_KERNEL_NONDETERMINISTIC_WALK)
    if order not in VARLEN_KERNEL_ORDERS or (order in UP_WALKS and window != CAUSAL_WINDOW):
        return None
    block_m, block_n = variants.bwd_tile(head_dim, head_dim_v)
    fold = window not in (NO_WINDOW, CAUSAL_WINDOW) and gqa_fold(
        heads, heads if heads_k is None else heads_k, band_steps(window, block_m, block_n))
    grid = max(1, min(num_sms, heads * (total_k // block_n + batch)))
    if not fold:
        return VarlenKernelLaunch(order, grid)
    return VarlenKernelLaunch(order, grid, True, *varlen_fold_lengths(causal, window))


def varlen_request(deterministic: bool, schedule: str, head_dim: int, window: tuple[int, int]) -> str:
    """The schedule a varlen backward asks :func:`bwd_launch` for on every sequence: deterministic ``"auto"`` is
    ``"diagonal"`` where the kernels' window for the pack (``window``: :func:`.features.kernel_window` at the pack's
    maximum lengths) is the causal mask, at the head dims of :data:`VARLEN_AUTO_DIAGONAL_HDIMS`, else
    :data:`VARLEN_AUTO`; anything else as given (non-deterministic backwards walk their own order anyway)."""
    if not (deterministic and schedule == "auto"):
        return schedule
    if tuple(window) == CAUSAL_WINDOW and head_dim in VARLEN_AUTO_DIAGONAL_HDIMS:
        return "diagonal"
    return VARLEN_AUTO


def sequence_launch(causal: bool, head_dim: int, seqlen_q: int, seqlen_k: int, heads: int, num_sms: int,
                    deterministic: bool, request: str, window: tuple[int, int] = NO_WINDOW,
                    heads_k: int | None = None, *, head_dim_v: int | None = None) -> BwdLaunch:
    """The launch of one varlen sequence's backward (used lengths ``seqlen_q``/``seqlen_k``; ``causal``, ``window``:
    the kernels' for that sequence; ``request``: the pack's, :func:`varlen_request`) as a batch-1 dense call: what the
    per-sequence CUDA path runs, and the order the varlen kernels must give it."""
    return bwd_launch(causal, head_dim, seqlen_q, seqlen_k, 1, heads, num_sms, deterministic, request, window,
                      heads_k, head_dim_v=head_dim_v)
