"""The forward's persistent tile scheduler (hopper/tile_scheduler_fwd.hpp), compiled as host C++: every CTA's walk
together covers every (m block, head, batch) tile exactly once, causal walks hand out the longest tiles first within
each head group, and the tiles in flight at once come from few heads.  CPU only: needs g++ (or c++)."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from host_cpp import build_host_program


WALK_CPP = r"""
#include <cstdio>
#include "schedule/fwd_tile_scheduler.hpp"
using namespace flash_dash;
int main() {
    int num_m, heads, batch, causal, grid;
    while (std::scanf("%d %d %d %d %d", &num_m, &heads, &batch, &causal, &grid) == 5) {
        FwdTileScheduler const s(num_m, heads, batch, causal != 0, grid);
        std::printf("%d %d\n", s.total, s.head_group);
        for (int cta = 0; cta < grid; ++cta) {
            for (int t = cta; t < s.total; t = s.next_tile(t)) {
                FwdTile const x = s.decode(t);
                std::printf("%d %d %d %d %d\n", cta, t, x.m_block, x.head, x.batch);
            }
        }
        std::printf("end\n");
    }
    return 0;
}
"""

CASES = [  # (num_m, heads, batch, causal, grid)
    (16, 16, 8, 1, 132), (32, 16, 4, 1, 132), (128, 16, 1, 1, 132), (11, 32, 8, 1, 132), (86, 32, 1, 1, 132),
    (16, 16, 8, 0, 132), (1, 1, 1, 1, 132), (1, 1, 1, 0, 132), (7, 3, 5, 1, 114), (9, 6, 3, 1, 78), (5, 2, 1, 1, 1),
    (40, 8, 3, 1, 3), (64, 48, 1, 1, 131), (3, 1, 300, 1, 132),
]


@pytest.fixture(scope="module")
def walk_binary(tmp_path_factory):
    return build_host_program(tmp_path_factory, "walk", WALK_CPP)


def _walks(exe: Path, cases):
    stdin = "".join(" ".join(map(str, c)) + "\n" for c in cases)
    lines = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.splitlines()
    out, i = [], 0
    for _ in cases:
        total, head_group = map(int, lines[i].split())
        i += 1
        rows = []
        while lines[i] != "end":
            rows.append(tuple(map(int, lines[i].split())))
            i += 1
        i += 1
        out.append((total, head_group, rows))
    return out


@pytest.mark.parametrize("case", CASES)
def test_every_tile_exactly_once(walk_binary, case):
    num_m, heads, batch, causal, grid = case
    total, _, rows = _walks(walk_binary, [case])[0]
    assert total == num_m * heads * batch
    assert sorted(t for _, t, *_ in rows) == list(range(total))  # each linear index once, on one CTA
    tiles = {(m, h, b) for *_, m, h, b in rows}
    assert tiles == {(m, h, b) for m in range(num_m) for h in range(heads) for b in range(batch)}
    for cta in range(grid):  # each CTA walks increasing linear indices, starting at its own
        ts = [t for c, t, *_ in rows if c == cta]
        assert ts == sorted(ts) and (not ts or ts[0] == cta)


@pytest.mark.parametrize("case", [c for c in CASES if c[3]])
def test_causal_order_is_longest_first_within_head_groups(walk_binary, case):
    num_m, heads, batch, _, grid = case
    _, head_group, rows = _walks(walk_binary, [case])[0]
    unit = grid // math.gcd(num_m, grid)  # heads whose tiles fill whole rounds of grid tiles
    cap = max(1, grid // 4)
    assert head_group == (cap // unit * unit if unit <= cap else unit)
    assert (head_group * num_m) % grid == 0  # every round of grid tiles lies inside one group
    num_groups = max(1, (heads * batch + head_group // 2) // head_group)
    by_t = sorted(rows, key=lambda r: r[1])
    bh = [b * heads + h for _, _, _, h, b in by_t]
    for t, (_, _, m, _, _) in enumerate(by_t):
        group = min(bh[t] // head_group, num_groups - 1)  # the last group holds the rest
        assert group == min(t // (head_group * num_m), num_groups - 1)  # groups run one after another
        if t > 0 and min(bh[t - 1] // head_group, num_groups - 1) == group:
            assert m <= by_t[t - 1][2]  # within a group: m never increases
    # The first tiles in flight read the K/V of few heads: the groups that grid consecutive tiles can touch.
    window = {b * heads + h for _, _, _, h, b in by_t[:grid]}
    assert len(window) <= 2 * head_group * (1 + -(-grid // (head_group * num_m)))
    if head_group * num_m >= grid:
        assert len(window) <= 2 * head_group


GRID_CPP = r"""
#include <cstdio>
#include "schedule/fwd_tile_scheduler.hpp"
int main() {
    int total, sms, equal;
    while (std::scanf("%d %d %d", &total, &sms, &equal) == 3) {
        std::printf("%d\n", flash_dash::FwdTileScheduler::grid_size(total, sms, equal != 0));
    }
    return 0;
}
"""


def test_grid_size_keeps_the_rounds_with_the_fewest_ctas(tmp_path_factory):
    exe = build_host_program(tmp_path_factory, "grid", GRID_CPP)
    cases = [(t, sms, eq) for t in (1, 2, 5, 67, 131, 132, 133, 200, 264, 265, 2048, 2752, 2816, 3072)
             for sms in (1, 2, 78, 114, 132) for eq in (0, 1)]
    stdin = "".join(f"{t} {s} {e}\n" for t, s, e in cases)
    grids = list(map(int, subprocess.run([str(exe)], input=stdin, capture_output=True, text=True,
                                         check=True).stdout.split()))
    assert len(grids) == len(cases)
    for (total, sms, equal), grid in zip(cases, grids):
        full = min(total, sms)
        rounds = -(-total // full)
        if not equal:
            assert grid == full  # causal: one CTA per SM (up to the tile count)
            continue
        assert 1 <= grid <= full and -(-total // grid) == rounds  # never more rounds than one CTA per SM
        assert grid == 1 or -(-total // (grid - 1)) > rounds  # and no CTA to spare
    assert grids[cases.index((2048, 132, 1))] == 128  # hdim 128, 16k tokens: 16 rounds of 128
