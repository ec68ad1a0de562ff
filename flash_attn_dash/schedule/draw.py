"""SM-timeline (Gantt) charts of simulated plans; matplotlib is imported only here, and without pyplot (no global
backend is set)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .simulate import Timeline

# Five Okabe-Ito colours (told apart with the common colour-vision deficiencies), cycled so that consecutive heads never
# share one; its vermillion, sky blue and black are left out so no head looks like a wait or like its neighbour.
COMPUTE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#F0E442", "#CC79A7")
REDUCE_COLOUR = "#9A9A9A"
WAIT_COLOUR = "#000000"

DPI = 110
WIDTH_IN = 14.0
MAX_HEIGHT_IN = 30.0
MAX_PNG_PX = (round(WIDTH_IN * DPI), round(MAX_HEIGHT_IN * DPI))
"""The largest image :func:`draw_gantt` writes, ``(width, height)`` in pixels; rows get thinner past it."""

_HEADER_IN = 1.2  # title (two lines) and the legend under the panels
_PANEL_IN = 0.7  # a panel's title, tick labels and axis label
_ROW_IN = 0.28
_LABEL_IN = 0.12  # the least vertical room per y tick label (7 pt text)


@dataclass(frozen=True)
class GanttFigure:
    """What :func:`draw_gantt` wrote: per-panel tuples are in the order of the timelines."""

    path: str
    title: str
    panel_titles: tuple[str, ...]
    xlabel: str
    xlims: tuple[tuple[float, float], ...]
    rows: tuple[tuple[int, ...], ...]  # the CTAs drawn in each panel, top to bottom
    legend: tuple[tuple[str, str], ...]  # (label, colour)
    size_px: tuple[int, int]


def sample_ctas(num_ctas: int, limit: int) -> list[int]:
    """At most ``limit`` CTA indices spread evenly over ``[0, num_ctas)`` (always including the first and last)."""
    if num_ctas <= limit:
        return list(range(num_ctas))
    return sorted({int(round(x)) for x in np.linspace(0, num_ctas - 1, limit)})


def describe_ctas(rows: Sequence[int], num_ctas: int) -> str:
    """Which CTAs a panel shows, e.g. ``"CTAs 0, 9, 17, …, 131 of 132 shown"``."""
    if len(rows) == num_ctas:
        return f"all {num_ctas} CTA{'s' if num_ctas != 1 else ''} shown"
    listed = [str(g) for g in rows] if len(rows) <= 4 else [str(g) for g in rows[:3]] + ["…", str(rows[-1])]
    return f"CTAs {', '.join(listed)} of {num_ctas} shown"


def _head_labels(num_heads: int) -> list[str]:
    """Legend label of each compute colour: the flat heads ``b * heads + h`` it stands for."""
    labels = []
    for i in range(min(num_heads, len(COMPUTE_COLOURS))):
        members = [str(h) for h in range(i, num_heads, len(COMPUTE_COLOURS))]
        more = ", …" if len(members) > 2 else ""
        labels.append(f"head {members[0]}" if len(members) == 1 else f"heads {', '.join(members[:2])}{more}")
    return labels


def draw_gantt(timelines: Sequence[Timeline], titles: Sequence[str], path: str, heading: str, max_ctas: int = 16,
               unit: str = "model time units", scale: float = 1.0, detail_steps: int = 400) -> GanttFigure:
    """Write one Gantt panel per timeline to ``path`` (PNG), all on one time axis, and describe what was drawn.

    Times are divided by ``scale`` and labelled ``unit``.  Rows are CTAs (an even sample when there are more than
    ``max_ctas``).  Compute bars are coloured by flat head ``b * heads + h`` cycling through ``COMPUTE_COLOURS``,
    reduce bars are grey and half-height black bars are the time a CTA waited for its rank predecessor.  A CTA with
    more than ``detail_steps`` steps is drawn as one bar per K/V tile (reduces included) between waits.
    """
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    samples = [sample_ctas(t.plan.num_ctas, max_ctas) for t in timelines]
    shown = [describe_ctas(rows, t.plan.num_ctas) for rows, t in zip(samples, timelines)]
    if len(set(shown)) == 1:
        title = f"{heading}\n{shown[0]}"
    else:  # the schedules run different grids, so each panel names its own sample
        title = f"{heading}\nup to {max_ctas} CTAs per panel, sampled evenly (listed per panel)"
        titles = [f"{t}; {s}" for t, s in zip(titles, shown)]
    total_rows = max(1, sum(len(rows) for rows in samples))
    fixed_in = _HEADER_IN + _PANEL_IN * len(timelines)
    height_in = min(MAX_HEIGHT_IN, fixed_in + _ROW_IN * total_rows)
    row_in = max(height_in - fixed_in, _LABEL_IN) / total_rows
    label_every = math.ceil(_LABEL_IN / row_in)  # thin the CTA labels when capped rows get too low for text
    xmax = max(float(t.makespan) for t in timelines) / scale * 1.01 or 1.0
    xlabel = f"time ({unit})"
    heads = max(t.plan.batch * t.plan.heads for t in timelines)
    k = len(COMPUTE_COLOURS)

    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False)[:, 0]
    for ax, timeline, rows, panel_title in zip(axes, timelines, samples, titles):
        plan = timeline.plan
        c, r = float(timeline.c) / scale, float(timeline.r) / scale
        for y, cta in enumerate(rows):
            lo, hi = int(plan.cta_ptr[cta]), int(plan.cta_ptr[cta + 1])
            if lo == hi:
                continue
            start, end = timeline.compute_start[lo:hi] / scale, timeline.reduce_end[lo:hi] / scale
            wait = timeline.wait[lo:hi] / scale
            head = plan.step_b[lo:hi] * plan.heads + plan.step_h[lo:hi]
            colour = [COMPUTE_COLOURS[i] for i in head % k]
            if hi - lo <= detail_steps:
                ax.broken_barh(list(zip(start, np.full(hi - lo, c))), (y - 0.4, 0.8), facecolors=colour, linewidth=0)
                ax.broken_barh(list(zip(timeline.reduce_start[lo:hi] / scale, np.full(hi - lo, r))), (y - 0.4, 0.8),
                               facecolors=REDUCE_COLOUR, linewidth=0)
            else:
                # Too many steps to see one by one: a bar per K/V tile, split at waits; white edges mark tile changes.
                tile = plan.kv_tile_ids(plan.step_b[lo:hi], plan.step_h[lo:hi], plan.step_n[lo:hi])
                cut = np.flatnonzero((tile[1:] != tile[:-1]) | (wait[1:] > 0)) + 1
                first, last = np.concatenate([[0], cut]), np.concatenate([cut, [hi - lo]]) - 1
                ax.broken_barh(list(zip(start[first], end[last] - start[first])), (y - 0.4, 0.8),
                               facecolors=[colour[i] for i in first], edgecolor="white", linewidth=0.4)
            waiting = wait > 0
            ax.broken_barh(list(zip(start[waiting] + c, wait[waiting])), (y - 0.25, 0.5),
                           facecolors=WAIT_COLOUR, linewidth=0)
        ticks = range(0, len(rows), label_every)
        ax.set_yticks(list(ticks), [str(rows[i]) for i in ticks], fontsize=7)
        ax.set_ylim(len(rows) - 0.4, -0.6)  # CTA 0 on top
        ax.set_ylabel("CTA")
        ax.set_title(panel_title, fontsize=9, loc="left")
        ax.tick_params(labelbottom=True)  # sharex hides inner tick labels; each panel keeps its time scale readable
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    axes[0].set_xlim(0.0, xmax)
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    handles = [Patch(color=COMPUTE_COLOURS[i], label=label) for i, label in enumerate(_head_labels(heads))]
    handles += [Patch(color=REDUCE_COLOUR, label="dQ reduce"),
                Patch(color=WAIT_COLOUR, label="wait for rank predecessor")]
    fig.legend(handles=handles, loc="outside lower center", fontsize=8, ncol=len(handles),
               title="compute colour = head b·heads + h", title_fontsize=8)
    fig.savefig(path, dpi=DPI, format="png")
    width, height = (int(x) for x in fig.bbox.size)  # as Agg sizes its canvas
    return GanttFigure(path=path, title=title, panel_titles=tuple(titles), xlabel=xlabel,
                       xlims=tuple(tuple(map(float, ax.get_xlim())) for ax in axes),
                       rows=tuple(tuple(rows) for rows in samples),
                       legend=tuple((h.get_label(), to_hex(h.get_facecolor())) for h in handles),
                       size_px=(width, height))
