"""The backward's tile ranges and mask choice compiled as host C++ and checked element by element: a K/V tile's Q tiles
outside [m_min(n), m_end(n)) (hopper/schedule/policies.hpp) hold no (query, key) pair the mask shows, and every step
inside that holds a hidden pair (or one past seqlen_q / seqlen_k) takes the element mask
(hopper/bwd/tile_mask.hpp), for the full mask, the causal mask and sliding windows. CPU only: needs g++ (or c++)."""
from __future__ import annotations

import random

import pytest

from flash_attn_dash import variants
from host_cpp import build_host_program, run_int_cases

CHECK_CPP = r"""
#include <cstdio>
#include "bwd/tile_mask.hpp"

using namespace flash_dash;
using namespace flash_dash::bwd;

static bool sees(SchedShape const& s, bool local, int i, int j) {
    int const d = s.seqlen_k - s.seqlen_q;
    if (i < 0 || i >= s.seqlen_q || j < 0 || j >= s.seqlen_k) return false;
    if (!s.causal) return true;
    int const right = local ? s.window_right : 0;
    return j <= i + d + right && (!local || j >= i + d - s.window_left);
}

template <int kBlockM, int kBlockN, bool Is_causal, bool Is_local>
static int check(SchedShape const& s) {
    for (int n = 0; n < s.num_n; ++n) {
        int const lo = m_min_of(s, n), end = m_end_of(s, n);
        for (int m = 0; m < s.num_m; ++m) {
            bool any = false, hidden = false;
            for (int i = m * kBlockM; i < (m + 1) * kBlockM; ++i) {
                for (int j = n * kBlockN; j < (n + 1) * kBlockN; ++j) {
                    bool const v = sees(s, Is_local, i, j);
                    any |= v;
                    hidden |= !v;
                }
            }
            bool const visited = m >= lo && m < end;
            if (any && !visited) return 1;
            if (visited && hidden && !tile_needs_mask<kBlockM, kBlockN, Is_causal, Is_local>(s, m * kBlockM, n * kBlockN))
                return 2;
        }
    }
    return 0;
}

template <int kBlockM, int kBlockN>
static int dispatch(SchedShape const& s, bool local) {
    if (!s.causal) return check<kBlockM, kBlockN, false, false>(s);
    return local ? check<kBlockM, kBlockN, true, true>(s) : check<kBlockM, kBlockN, true, false>(s);
}

int main() {
    int bm, bn, sq, sk, causal, local, left, right;
    while (std::scanf("%d %d %d %d %d %d %d %d", &bm, &bn, &sq, &sk, &causal, &local, &left, &right) == 8) {
        SchedShape s{};
        s.batch = 1; s.heads = 1; s.heads_k = 1; s.seqlen_q = sq; s.seqlen_k = sk; s.block_m = bm; s.block_n = bn;
        s.num_m = (sq + bm - 1) / bm; s.num_n = (sk + bn - 1) / bn; s.grid = 1; s.claim_group = 1;
        s.causal = causal != 0; s.window_left = left; s.window_right = right;
        int r = -1;
        DISPATCH
        std::printf("%d\n", r);
    }
    return 0;
}
"""

UNBOUNDED = 1 << 30  # hopper/common/window.hpp kUnboundedWindow
BWD_TILES = sorted({variants.bwd_tile(h.qk) for h in variants.HEAD_DIMS})


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    dispatch = "\n        ".join(f"if (bm == {bm} && bn == {bn}) r = dispatch<{bm}, {bn}>(s, local != 0);"
                                  for bm, bn in BWD_TILES)
    return build_host_program(tmp_path_factory, "bwd_tile_mask", CHECK_CPP.replace("DISPATCH", dispatch))


@pytest.mark.parametrize("seed", range(3))
def test_tile_ranges_and_masks(checker, seed):
    rng = random.Random(seed)
    cases = []
    for _ in range(60):
        bm, bn = rng.choice(BWD_TILES)
        sq, sk = rng.randint(1, 1500), rng.randint(1, 1500)
        kind = rng.choice(("full", "causal", "window"))
        if kind == "full":
            cases.append((bm, bn, sq, sk, 0, 0, UNBOUNDED, UNBOUNDED))
        elif kind == "causal":
            cases.append((bm, bn, sq, sk, 1, 0, UNBOUNDED, 0))
        else:
            left = rng.choice((UNBOUNDED, rng.randint(0, 600)))
            right = rng.choice((0, UNBOUNDED, rng.randint(0, 600)))
            cases.append((bm, bn, sq, sk, 1, 1, left, right))
    results = run_int_cases(checker, cases)
    bad = [(c, r) for c, r in zip(cases, results) if r != 0]
    assert not bad, f"{len(bad)} cases wrong, first {bad[0]}"


def test_window_sides_on_tile_boundaries(checker):
    """Sides that put the band's edge on, just before and just after a tile boundary."""
    sides = (0, 1, 62, 63, 64, 65, 126, 127, 128, 129, 191, 192, 255, 256)
    cases = [(bm, bn, sq, sk, 1, 1, left, right)
             for bm, bn in BWD_TILES for sq, sk in ((1024, 1024), (1000, 1100), (1100, 1000))
             for left in sides + (UNBOUNDED,) for right in sides[:6] + (UNBOUNDED,)]
    assert run_int_cases(checker, cases) == [0] * len(cases)
