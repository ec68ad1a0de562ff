"""``auto``: the schedule a deterministic backward takes, decided in O(1) from committed measurements and rules.

:func:`auto_schedule` is what runs (through :func:`flash_attn_dash.launch.bwd_launch`): on a sliding-window band,
:data:`BAND_SCHEDULE`; otherwise a matching entry of ``MEASURED_PREFERENCES`` (the order measured fastest on the H200
for that mask, head dim and length, on shapes with equal query and key lengths), else :func:`rule_schedule`, a closed
form of the model's pick (the model's best or within ``TIE_TOLERANCE`` of it at every shape
``tests/test_schedule_auto.py`` samples).  The preferred order may not fit a shape (symmetric_shift needs seqlen_q ==
seqlen_k and an even K/V tile count); then its fallback runs.

:func:`predict` simulates every order for the planner (``flash-attn-dash plan``), :func:`predict_pack` every order on
a varlen pack's shared grid (``plan --seqlens``); :func:`model_choice` is the pick the model alone would make, which
the tests compare with the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .costs import default_costs
from .orders import SCHEDULES, applicable
from .pack_plan import build_pack_plan
from .packs import PackTiles
from .plan import Plan, build_plan
from .simulate import Progress, Timeline, simulate
from .tiles import MASKS, TileGrid, bwd_tile_shape

TIE_TOLERANCE = 0.01


@dataclass(frozen=True)
class MeasuredPreference:
    """A schedule measured to be fastest on real hardware for ``mask``/``head_dim`` and ``min_seqlen <= seqlen <=
    max_seqlen``, on the DASH grid (seqlen_q == seqlen_k, 16k tokens per batch, hidden 2048): it applies to shapes
    with equal query and key lengths only.

    ``source`` names the measurement (benchmark file and date) so the override can be audited.
    """

    mask: str
    head_dim: int
    min_seqlen: int
    max_seqlen: int
    schedule: str
    source: str


# Measured on our H200 (hdim 256: an H100) where the model's tie rule would pick otherwise (dynamic-grid
# ascending/descending, tree 881345f, full grid 0458 plus the claim-group sweep). Full masks: the model puts
# ascending, descending and shift within 1% of each other; shift measured fastest or tied at every point (e.g. hdim 128 2k/16k: 508/585 vs ascending
# 494/563, descending 504/573). Causal: the model puts descending 2-3% ahead of symmetric_shift (it does not model the
# claim latency); symmetric_shift measured 2-7% faster at hdim 64 everywhere and at hdim 128 512/1k, descending 1-4%
# faster at hdim 128 2k-16k in both runs. Outside these ranges the model decides.
_GRID = "benchmarks/results/2026-11-30-0458-attn.json"
_SWEEP = "benchmarks/results/2026-11-30-0450-claim-spread-sweep.md"
# hdim 256 causal: descending's tiles all open on the head's last Q tile, and at this head dim a rank hand-off (a 64 KB
# reduce-add, then its completion) is a large part of a step, so a tile's first step waits on the chain where
# symmetric_shift's pairs start staggered (store-warp timeline: benchmarks/results/2026-12-06-0802-timeline-*).
_HDIM256_A = "benchmarks/results/2026-12-06-0803-hdim256-orders-fa4-h100.json.gz"
_HDIM256_B = "benchmarks/results/2026-12-06-0817-hdim256-causal-orders-h100.json.gz"
MEASURED_PREFERENCES: tuple[MeasuredPreference, ...] = (
    MeasuredPreference("full", 64, 512, 16384, "shift",
                       f"{_GRID}: shift 314/407/482/528/546/537 vs ascending 312/400/477/516/540/527 TFLOP/s "
                       "at 512-16k"),
    MeasuredPreference("full", 128, 512, 16384, "shift",
                       f"{_GRID}: shift 334/424/508/564/578/585 vs descending 323/423/504/555/576/573 TFLOP/s "
                       "at 512-16k"),
    MeasuredPreference("causal", 64, 512, 16384, "symmetric_shift",
                       f"{_GRID}: symmetric_shift 195/292/388/464/500/532 vs descending 191/274/379/442/479/495 "
                       f"TFLOP/s at 512-16k; {_SWEEP}"),
    MeasuredPreference("causal", 128, 512, 1024, "symmetric_shift",
                       f"{_GRID}: symmetric_shift 207/313 vs descending 196/310 TFLOP/s at 512/1k"),
    MeasuredPreference("causal", 128, 2048, 16384, "descending",
                       f"{_GRID}: descending 424/506/555/578 vs symmetric_shift 414/497/551/557 TFLOP/s at 2k-16k; "
                       f"{_SWEEP}: 424/505/559 vs 418/498/551 at 2k-8k"),
    MeasuredPreference("causal", 256, 1024, 16384, "symmetric_shift",
                       f"{_HDIM256_A} and {_HDIM256_B} (H100): symmetric_shift 217/269/305/325/339 vs descending "
                       "197/250/284/301/309 TFLOP/s at 1k/2k/4k/8k/16k"),
)


BAND_SCHEDULE = "descending"
"""What ``auto`` requests on a band (a window that removes tiles, ``TileGrid.banded``), picked by simulation: no band
has been measured on a GPU yet.  Descending starts every tile on its own top row, so it waits only where the band's
tail shares the last Q tile, and it claims a head's longest tiles first; it is the model's best or within
``TIE_TOLERANCE`` of it on every model-shaped band ``tests/test_schedule_bands.py`` samples.  ``shift`` on a band
never waits but claims the longest tiles last (up to 11% slower in the model on windows of thousands of keys, tied on
narrow ones), ``symmetric_shift`` falls back to descending and ``ascending`` queues (29x slower at 32k, window 128).
``docs/features.md`` has the numbers."""


@dataclass(frozen=True)
class Prediction:
    """Model prediction for one requested schedule."""

    schedule: str
    schedule_used: str
    description: str
    fallback: str | None
    makespan: float
    bubble_fraction: float
    wait_fraction: float
    timeline: Timeline = field(repr=False, compare=False)

    @property
    def valid(self) -> bool:
        """Whether the schedule's own order runs (False when it fell back to another schedule)."""
        return self.schedule == self.schedule_used


def _predictions(schedules: list[str], build: Callable[[str], Plan], c: float, r: float,
                 progress: Progress | None) -> list[Prediction]:
    """Simulate ``build(schedule)`` for every schedule; ``progress`` receives the overall finished fraction."""
    out = []
    for index, schedule in enumerate(schedules):
        plan = build(schedule)
        overall = None if progress is None else lambda f, i=index: progress((i + f) / len(schedules))
        timeline = simulate(plan, c, r, overall)
        out.append(Prediction(schedule, plan.schedule_used, plan.description, plan.fallback, float(timeline.makespan),
                              timeline.bubble_fraction, timeline.wait_fraction, timeline))
    return out


def _tiles_and_costs(mask: str, head_dim: int, c: float | None, r: float | None) -> tuple[int, int, float, float]:
    """The backward tile shape for ``mask`` and ``head_dim``, and the per-step costs (defaults from :mod:`.costs`)."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    block_m, block_n = bwd_tile_shape(head_dim, mask == "causal")
    default_c, default_r = default_costs(head_dim, block_m, block_n)
    return block_m, block_n, default_c if c is None else c, default_r if r is None else r


def predict(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, batch: int, heads: int, num_sms: int,
            c: float | None = None, r: float | None = None, progress: Progress | None = None,
            window: tuple[int, int] = (-1, -1), heads_kv: int | None = None, fold: bool = False) -> list[Prediction]:
    """Simulate every schedule applicable to ``mask`` with ``window`` (every schedule on a band; in ``SCHEDULES``
    order); default costs from :mod:`.costs`. ``heads_kv``: K/V heads (GQA), ``fold``: the GQA sibling fold
    (:func:`.plan.build_plan`).

    ``progress`` receives the overall finished fraction across all schedules.
    """
    block_m, block_n, c, r = _tiles_and_costs(mask, head_dim, c, r)
    grid = TileGrid(mask, seqlen_q, seqlen_k, block_m, block_n, window)
    schedules = [s for s in SCHEDULES if applicable(s, grid.mask, grid.banded)]
    return _predictions(schedules, lambda schedule: build_plan(mask, seqlen_q, seqlen_k, block_m, block_n, batch,
                                                               heads, num_sms, schedule, costs=(c, r), window=window,
                                                               heads_kv=heads_kv, fold=fold),
                        c, r, progress)


def predict_pack(mask: str, head_dim: int, seqlens_q, seqlens_k, heads: int, num_sms: int, c: float | None = None,
                 r: float | None = None, progress: Progress | None = None,
                 window: tuple[int, int] = (-1, -1)) -> list[Prediction]:
    """:func:`predict` for a varlen pack of sequences with lengths ``seqlens_q[b]`` / ``seqlens_k[b]`` (None: the
    same) sharing one persistent grid (:func:`.pack_plan.build_pack_plan`): every schedule applicable to the pack's
    mask, or every schedule when the window bands a sequence.  Each :attr:`Prediction.timeline`'s plan is a
    :class:`.pack_plan.PackPlan`."""
    block_m, block_n, c, r = _tiles_and_costs(mask, head_dim, c, r)
    pack = PackTiles(mask, seqlens_q, seqlens_k, block_m, block_n, window)
    schedules = [s for s in SCHEDULES if applicable(s, pack.mask, pack.banded)]
    return _predictions(schedules, lambda schedule: build_pack_plan(mask, seqlens_q, seqlens_k, block_m, block_n,
                                                                    heads, num_sms, schedule, costs=(c, r),
                                                                    window=window),
                        c, r, progress)


def _measured(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int) -> MeasuredPreference | None:
    if seqlen_q != seqlen_k:
        return None
    for pref in MEASURED_PREFERENCES:
        if (pref.mask, pref.head_dim) == (mask, head_dim) and pref.min_seqlen <= seqlen_k <= pref.max_seqlen:
            return pref
    return None


def rule_schedule(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int) -> str:
    """The model-backed rule for shapes no measurement covers. Full masks: shift while a head has no more K/V tiles
    than Q tiles (N <= M; with more, the tiles of a head running in one round outnumber the rows they could
    stagger over, shift's groups fall back and its static grid loses to the claimed one, up to several times in the
    model), else ascending. Causal masks: descending (tile n's first step is its last Q tile, which every earlier
    tile of the head also visits first)."""
    if mask == "causal":
        return "descending"
    block_m, block_n = bwd_tile_shape(head_dim, False)
    return "shift" if -(-seqlen_k // block_n) <= -(-seqlen_q // block_m) else "ascending"


def _mask(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> tuple[str, bool]:
    """The canonical mask of ``mask`` with ``window`` and whether the window is a band."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if window == (-1, -1):  # the launch decider's path (no window yet): no grid to build
        return mask, False
    grid = TileGrid(mask, seqlen_q, seqlen_k, *bwd_tile_shape(head_dim, mask == "causal"), window)
    return grid.mask, grid.banded


def auto_schedule(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, window: tuple[int, int] = (-1, -1)) -> str:
    """The order ``auto`` requests for a deterministic backward of this shape (before the shape's fallbacks);
    ``window`` is FlashAttention's ``window_size``."""
    mask, banded = _mask(mask, head_dim, seqlen_q, seqlen_k, window)
    if banded:
        return BAND_SCHEDULE
    pref = _measured(mask, head_dim, seqlen_q, seqlen_k)
    return pref.schedule if pref is not None else rule_schedule(mask, head_dim, seqlen_q, seqlen_k)


def auto_reason(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, window: tuple[int, int] = (-1, -1)) -> str:
    """Why :func:`auto_schedule` requests its order, in one line (for the planner and ``backward_schedule_used``)."""
    mask, banded = _mask(mask, head_dim, seqlen_q, seqlen_k, window)
    if banded:
        return (f"{BAND_SCHEDULE}: the rule for bands, picked by simulation (nothing measured on a GPU yet; the "
                f"model's best or within {TIE_TOLERANCE:.0%} of it)")
    pref = _measured(mask, head_dim, seqlen_q, seqlen_k)
    if pref is not None:
        return f"{pref.schedule}: measured fastest for {mask} hdim {head_dim} ({pref.source})"
    return (f"{rule_schedule(mask, head_dim, seqlen_q, seqlen_k)}: the model-backed rule for {mask} masks where "
            f"nothing was measured (the model's best or within {TIE_TOLERANCE:.0%} of it)")


def model_choice(predictions: list[Prediction]) -> Prediction:
    """The pick of the model alone: the smallest predicted makespan among the orders that run as themselves;
    predictions within ``TIE_TOLERANCE`` of the best are ties, broken by table order (simplest first)."""
    valid = [p for p in predictions if p.valid]
    best = min(p.makespan for p in valid)
    return next(p for p in valid if p.makespan <= best * (1 + TIE_TOLERANCE))
