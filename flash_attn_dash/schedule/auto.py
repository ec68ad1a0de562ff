"""``auto``: pick the schedule of a backward call from the model, overridable by measured preferences.

Rule: simulate every schedule applicable to the mask whose assumptions hold for the shape (a schedule that would fall
back runs the same order as another candidate, so it is skipped); take the smallest predicted makespan; predictions
within ``TIE_TOLERANCE`` of the best count as ties, broken by the order of ``SCHEDULES`` (simplest first), because the
model is coarser than 1%.  A matching entry of ``MEASURED_PREFERENCES`` overrides the model when its schedule is valid
for the shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .costs import default_costs
from .orders import SCHEDULES, applicable
from .plan import build_plan
from .simulate import Progress, Timeline, simulate
from .tiles import MASKS, bwd_tile_shape

TIE_TOLERANCE = 0.01


@dataclass(frozen=True)
class MeasuredPreference:
    """A schedule measured to be fastest on real hardware for ``mask``/``head_dim`` and ``min_seqlen <= seqlen_k <=
    max_seqlen``.

    ``source`` names the measurement (benchmark file and date) so the override can be audited.
    """

    mask: str
    head_dim: int
    min_seqlen: int
    max_seqlen: int
    schedule: str
    source: str


# Measured on our H200 where the model's tie rule would pick otherwise (dynamic-grid ascending/descending, tree
# 881345f, full grid 0458 plus the claim-group sweep). Full masks: the model puts ascending, descending and shift within
# 1% of each other; shift measured fastest or tied at every point (e.g. hdim 128 2k/16k: 508/585 vs ascending
# 494/563, descending 504/573). Causal: the model puts descending 2-3% ahead of symmetric_shift (it does not model the
# claim latency); symmetric_shift measured 2-7% faster at hdim 64 everywhere and at hdim 128 512/1k, descending 1-4%
# faster at hdim 128 2k-16k in both runs. Outside these ranges the model decides.
_GRID = "benchmarks/results/2026-11-30-0458-attn.json"
_SWEEP = "benchmarks/results/2026-11-30-0450-claim-spread-sweep.md"
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
)


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


def predict(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, batch: int, heads: int, num_sms: int,
            c: float | None = None, r: float | None = None, progress: Progress | None = None) -> list[Prediction]:
    """Simulate every schedule applicable to ``mask`` (in ``SCHEDULES`` order); default costs from :mod:`.costs`.

    ``progress`` receives the overall finished fraction across all schedules.
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    block_m, block_n = bwd_tile_shape(head_dim, mask == "causal")
    default_c, default_r = default_costs(head_dim, block_m, block_n)
    c = default_c if c is None else c
    r = default_r if r is None else r
    schedules = [s for s in SCHEDULES if applicable(s, mask)]
    out = []
    for index, schedule in enumerate(schedules):
        plan = build_plan(mask, seqlen_q, seqlen_k, block_m, block_n, batch, heads, num_sms, schedule, costs=(c, r))
        overall = None if progress is None else lambda f, i=index: progress((i + f) / len(schedules))
        timeline = simulate(plan, c, r, overall)
        out.append(Prediction(schedule, plan.schedule_used, plan.description, plan.fallback, float(timeline.makespan),
                              timeline.bubble_fraction, timeline.wait_fraction, timeline))
    return out


def _measured(mask: str, head_dim: int, seqlen_k: int, valid: set[str],
              measured: tuple[MeasuredPreference, ...]) -> MeasuredPreference | None:
    for pref in measured:
        if (pref.mask, pref.head_dim) == (mask, head_dim) and pref.min_seqlen <= seqlen_k <= pref.max_seqlen \
                and pref.schedule in valid:
            return pref
    return None


def choose(predictions: list[Prediction], mask: str, head_dim: int, seqlen_k: int,
           measured: tuple[MeasuredPreference, ...] | None = None,
           allowed: tuple[str, ...] | None = None) -> tuple[str, str]:
    """Apply the ``auto`` rule to ``predictions`` of one shape; returns ``(schedule, reason)``.

    ``allowed`` restricts the pick to the schedules a caller can run (e.g. those the compiled kernels implement).
    """
    valid = [p for p in predictions if p.valid and (allowed is None or p.schedule in allowed)]
    base = next(p for p in predictions if p.schedule == "ascending")
    skipped = "".join(f"; {p.schedule} skipped ({p.fallback})" for p in predictions if not p.valid)
    pref = _measured(mask, head_dim, seqlen_k, {p.schedule for p in valid},
                     MEASURED_PREFERENCES if measured is None else measured)
    if pref is not None:
        return pref.schedule, f"{pref.schedule}: measured fastest for {mask} hdim {head_dim} ({pref.source}){skipped}"
    best = min(p.makespan for p in valid)
    pick = next(p for p in valid if p.makespan <= best * (1 + TIE_TOLERANCE))
    speedup = base.makespan / pick.makespan if pick.makespan else 1.0
    tie = "" if pick.makespan == best else f", within {TIE_TOLERANCE:.0%} of the best so the simpler order wins"
    return pick.schedule, (f"{pick.schedule}: smallest predicted makespan ({speedup:.3f}x over ascending, "
                           f"{pick.bubble_fraction:.1%} idle{tie}){skipped}")


@lru_cache(maxsize=256)
def choose_schedule(mask: str, head_dim: int, seqlen_q: int, seqlen_k: int, batch: int, heads: int, num_sms: int,
                    c: float | None = None, r: float | None = None,
                    allowed: tuple[str, ...] | None = None) -> tuple[str, str]:
    """The schedule ``auto`` takes for this call, and a one-line reason (cached: the result is a pure function).

    ``allowed``: only pick among these schedules (default: every modelled one).
    """
    predictions = predict(mask, head_dim, seqlen_q, seqlen_k, batch, heads, num_sms, c, r)
    return choose(predictions, mask, head_dim, seqlen_k, allowed=allowed)
