"""SM-timeline (Gantt) charts of simulated plans; matplotlib is imported only here, with the Agg backend."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .simulate import Timeline

_WAIT_COLOUR = "#ff0000"
_RED_IN_TAB20 = (6, 7)  # left out of the head colours so waits stay unambiguous
_REDUCE_COLOUR = "#404040"


def sample_ctas(num_ctas: int, limit: int) -> list[int]:
    """At most ``limit`` CTA indices spread evenly over ``[0, num_ctas)`` (always including the first and last)."""
    if num_ctas <= limit:
        return list(range(num_ctas))
    return sorted({int(round(x)) for x in np.linspace(0, num_ctas - 1, limit)})


def draw_gantt(timelines: Sequence[Timeline], titles: Sequence[str], path: str, max_ctas: int = 16,
               unit: str = "model time units", detail_steps: int = 400) -> None:
    """Write one Gantt panel per timeline to ``path`` (PNG).

    Rows are CTAs (a sample when there are more than ``max_ctas``); compute bars are coloured by (batch, head), reduce
    bars are dark grey, and red bars show the time a CTA waited for its rank predecessor before reducing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(timelines), 1, figsize=(14, 1.0 + 0.28 * max_ctas * len(timelines)), squeeze=False)
    tab20 = plt.get_cmap("tab20")
    colours = [tab20(i) for i in range(20) if i not in _RED_IN_TAB20]
    for ax, timeline, title in zip(axes[:, 0], timelines, titles):
        plan = timeline.plan
        rows = sample_ctas(plan.num_ctas, max_ctas)
        c, r = float(timeline.c), float(timeline.r)
        for y, cta in enumerate(rows):
            lo, hi = int(plan.cta_ptr[cta]), int(plan.cta_ptr[cta + 1])
            if lo == hi:
                continue
            start, end = timeline.compute_start[lo:hi], timeline.reduce_end[lo:hi]
            head = (plan.step_b[lo:hi] * plan.heads + plan.step_h[lo:hi]) % len(colours)
            wait = timeline.wait[lo:hi]
            if hi - lo <= detail_steps:
                ax.broken_barh(list(zip(start, np.full(hi - lo, c))), (y - 0.4, 0.8),
                               facecolors=[colours[k] for k in head], linewidth=0)
                ax.broken_barh(list(zip(timeline.reduce_start[lo:hi], np.full(hi - lo, r))), (y - 0.4, 0.8),
                               facecolors=_REDUCE_COLOUR, linewidth=0)
            else:
                # Too many steps to see individually: one bar per run of the same head without waits.
                cut = np.flatnonzero((head[1:] != head[:-1]) | (wait[1:] > 0)) + 1
                first, last = np.concatenate([[0], cut]), np.concatenate([cut, [hi - lo]]) - 1
                ax.broken_barh(list(zip(start[first], end[last] - start[first])), (y - 0.4, 0.8),
                               facecolors=[colours[k] for k in head[first]], linewidth=0)
            waiting = wait > 0
            ax.broken_barh(list(zip(start[waiting] + c, wait[waiting])), (y - 0.25, 0.5),
                           facecolors=_WAIT_COLOUR, linewidth=0)
        ax.set_yticks(range(len(rows)), [str(g) for g in rows], fontsize=7)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.invert_yaxis()
        ax.set_xlim(0, float(timeline.makespan) * 1.01 or 1.0)
        ax.set_ylabel("CTA")
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(unit)
    handles = [Patch(color=colours[0], label="compute (colour = head)"), Patch(color=_REDUCE_COLOUR, label="dQ reduce"),
               Patch(color=_WAIT_COLOUR, label="wait for rank predecessor")]
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
