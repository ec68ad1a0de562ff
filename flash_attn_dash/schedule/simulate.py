"""SM timelines of a plan under the DASH cost model, and its critical path.

Cost model (the paper's): each step is a compute of cost ``c`` followed by a reduce of cost ``r`` on the same CTA.  The
reduce of a step may start only when its compute is done and the step with rank - 1 of the same dQ tile has finished its
reduce; the CTA waits meanwhile (that wait is the bubble).  All CTAs are co-resident and start at time 0. Earliest-start
times in this model are exactly longest paths in the step DAG (:mod:`.dag`), so the makespan is the critical path.
A step is one whole (m, n) tile: one that a mask or sliding window covers only in part costs ``c`` like any other,
because the kernels compute whole tiles and mask inside them (only tiles with nothing visible are skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .plan import Plan

Progress = Callable[[float], None]
"""Called with the finished fraction (0..1) about every half second of a long walk."""


class Deadlock(RuntimeError):
    """The CTAs of a plan block each other forever."""


def walk(plan: Plan, c: Real, r: Real, progress: Progress | None = None) -> list[Real]:
    """End time of every step's reduce (CTA-major step order); raises :class:`Deadlock` if the CTAs cannot all finish.

    Event driven: each CTA runs until its next step waits on a rank predecessor that has not finished; it is parked on
    that step and resumed when it finishes.  Costs keep their Python type, so ints and Fractions give exact times.
    """
    pred = plan.rank_predecessor().tolist()
    ptr = plan.cta_ptr.tolist()
    total = len(pred)
    end: list = [None] * total
    waiter = [-1] * total  # the one CTA parked on each step (a step has one rank successor)
    pos, clock = ptr[:-1], [0] * plan.num_ctas
    ready = list(range(plan.num_ctas - 1, -1, -1))
    done, last_report = 0, time.monotonic()
    cr = c + r
    while ready:
        g = ready.pop()
        s, stop, t = pos[g], ptr[g + 1], clock[g]
        first = s
        while s < stop:
            p = pred[s]
            if p < 0:
                t = t + cr
            else:
                e = end[p]
                if e is None:
                    waiter[p] = g
                    break
                t = t + c
                t = (t if t > e else e) + r
            end[s] = t
            w = waiter[s]
            if w >= 0:
                ready.append(w)
            s += 1
        pos[g], clock[g] = s, t
        done += s - first
        if progress is not None and time.monotonic() - last_report > 0.5:
            last_report = time.monotonic()
            progress(done / max(total, 1))
    stuck = [g for g in range(plan.num_ctas) if pos[g] < ptr[g + 1]]
    if stuck:
        g = stuck[0]
        s = pos[g]
        p = pred[s]
        raise Deadlock(f"{len(stuck)} CTAs stuck; CTA {g} at {plan.describe_step(s)} waits for {plan.describe_step(p)}")
    return end


@dataclass(frozen=True)
class Timeline:
    """Per-step start/end times of a simulated plan (float64 arrays in CTA-major step order) and its summary numbers."""

    plan: Plan
    c: Real
    r: Real
    makespan: Real  # exact in the costs' type
    compute_start: np.ndarray = field(repr=False)
    reduce_start: np.ndarray = field(repr=False)
    reduce_end: np.ndarray = field(repr=False)

    @property
    def compute_end(self) -> np.ndarray:
        return self.compute_start + float(self.c)

    @property
    def wait(self) -> np.ndarray:
        """Per step, the time its CTA waited for the rank predecessor between compute and reduce."""
        return self.reduce_start - self.compute_end

    @property
    def busy_time(self) -> float:
        return self.plan.num_steps * float(self.c + self.r)

    @property
    def bubble_fraction(self) -> float:
        """Idle time (waits and CTAs finishing early) over ``num_ctas * makespan``."""
        capacity = self.plan.num_ctas * float(self.makespan)
        return 0.0 if capacity == 0 else 1.0 - self.busy_time / capacity

    @property
    def wait_fraction(self) -> float:
        """Reduce waits alone over ``num_ctas * makespan``."""
        capacity = self.plan.num_ctas * float(self.makespan)
        return 0.0 if capacity == 0 else float(self.wait.sum()) / capacity

    def cta_intervals(self, cta: int) -> list[tuple[float, float, float, float]]:
        """``(compute_start, compute_end, reduce_start, reduce_end)`` of every step of ``cta``, in order."""
        lo, hi = int(self.plan.cta_ptr[cta]), int(self.plan.cta_ptr[cta + 1])
        cols = (self.compute_start, self.compute_end, self.reduce_start, self.reduce_end)
        return [tuple(float(a[i]) for a in cols) for i in range(lo, hi)]


def simulate(plan: Plan, c: Real, r: Real, progress: Progress | None = None) -> Timeline:
    """Simulate ``plan`` with per-step compute cost ``c`` and reduce cost ``r`` (both >= 0)."""
    if c < 0 or r < 0:
        raise ValueError(f"c and r must be >= 0, got c={c!r}, r={r!r}")
    end = walk(plan, c, r, progress)
    reduce_end = np.asarray(end, dtype=np.float64)
    compute_start = np.empty_like(reduce_end)
    if reduce_end.size:
        compute_start[1:] = reduce_end[:-1]
        starts = plan.cta_ptr[:-1][plan.cta_ptr[:-1] < plan.cta_ptr[1:]]
        compute_start[starts] = 0.0
    makespan = max(end) if end else 0
    return Timeline(plan, c, r, makespan, compute_start, reduce_end - float(r), reduce_end)


def critical_path(plan: Plan, c: Real, r: Real) -> Real:
    """Length of the longest path of the plan's step DAG (= the simulated makespan; exact for int/Fraction costs)."""
    end = walk(plan, c, r)
    return max(end) if end else 0
