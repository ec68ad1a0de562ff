"""The forward's K/V block ranges and mask choice (hopper/fwd/block_range.hpp) compiled as host C++ and checked element
by element: every block outside [n_min, n_max) of a Q tile holds no key a row of the tile sees, the consumers' walk
(the masked and unmasked loops of FwdMainloopSm90::consume) visits every block of the range once and masks every block
that holds a key some row must not see (or a key past seqlen_k), for the full mask, the causal mask and sliding
windows, with the causal launch's shifted first tile. CPU only: needs g++ (or c++)."""
from __future__ import annotations

import random

import pytest

from flash_attn_dash import variants
from host_cpp import build_host_program, run_int_cases

CHECK_CPP = r"""
#include <cstdio>
#include "fwd/block_range.hpp"

using namespace flash_dash;

static bool sees(FwdMaskShape const& s, bool window, int i, int j) {
    int const d = s.seqlen_k - s.seqlen_q;
    if (i < 0 || i >= s.seqlen_q || j < 0 || j >= s.seqlen_k) return false;
    if (!s.causal) return true;
    int const right = window ? s.window_right : 0;
    return j <= i + d + right && (!window || j >= i + d - s.window_left);
}

// 0 if the tile starting at row0 is handled right, else a code saying what is wrong.
template <int kBlockM, int kBlockN, bool kWindow>
static int check_tile(FwdMaskShape const& s, int row0) {
    using B = FwdBlockRange<kBlockM, kBlockN, kWindow>;
    int const n_max = B::n_max(s, row0), n_min = B::n_min(s, row0);
    int const blocks = (s.seqlen_k + kBlockN - 1) / kBlockN;
    for (int n = 0; n < blocks; ++n) {
        bool any = false, cut = false;
        for (int i = row0; i < row0 + kBlockM; ++i) {
            if (i < 0 || i >= s.seqlen_q) continue;
            for (int j = n * kBlockN; j < (n + 1) * kBlockN; ++j) {
                bool const v = sees(s, kWindow, i, j);
                any |= v;
                cut |= !v;
            }
        }
        if (any && (n < n_min || n >= n_max)) return 1;  // a visible key outside the range
        if (n >= n_min && n < n_max && cut && !B::needs_mask(s, row0, n)) return 2;  // unmasked block with a hidden key
    }
    if (n_max <= n_min) return 0;
    // The consumers' walk: masked while needed, unmasked down to unmasked_min, again (windows) until n_min.
    int visits[4096] = {0};
    bool masked[4096] = {false};
    int n = n_max - 1, guard = 0;
    int const n_unmasked_min = B::unmasked_min(s, row0, n_min);
    do {
        for (; n >= n_min && B::needs_mask(s, row0, n); --n) { ++visits[n]; masked[n] = true; }
        for (; n >= n_unmasked_min; --n) { ++visits[n]; }
        if (++guard > 4) return 3;  // the loops must finish in two passes
    } while (kWindow && n >= n_min);
    for (int m = n_min; m < n_max; ++m) {
        if (visits[m] != 1) return 4;
        if (B::needs_mask(s, row0, m) && !masked[m]) return 5;
    }
    return 0;
}

template <int kBlockM, int kBlockN>
static int check(FwdMaskShape const& s, bool window, int m_offset) {
    int const tiles = (s.seqlen_q + m_offset + kBlockM - 1) / kBlockM;
    for (int m = 0; m < tiles; ++m) {
        int const row0 = m * kBlockM - m_offset;
        int const r = window ? check_tile<kBlockM, kBlockN, true>(s, row0) : check_tile<kBlockM, kBlockN, false>(s, row0);
        if (r) return r * 100000 + m;
    }
    return 0;
}

int main() {
    int bm, bn, sq, sk, causal, window, left, right, m_offset;
    while (std::scanf("%d %d %d %d %d %d %d %d %d", &bm, &bn, &sq, &sk, &causal, &window, &left, &right,
                      &m_offset) == 9) {
        FwdMaskShape const s{sq, sk, causal != 0, left, right};
        int r = -1;
        if (bm == 64 && bn == 128) r = check<64, 128>(s, window != 0, m_offset);
        DISPATCH
        std::printf("%d\n", r);
    }
    return 0;
}
"""

UNBOUNDED = 1 << 30  # hopper/common/window.hpp kUnboundedWindow
FWD_TILES = sorted({(t.block_m, t.block_n) for h in variants.HEAD_DIMS for t in (h.fwd_full, h.fwd_causal)})


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    dispatch = "\n        ".join(f"if (bm == {bm} && bn == {bn}) r = check<{bm}, {bn}>(s, window != 0, m_offset);"
                                  for bm, bn in FWD_TILES)
    return build_host_program(tmp_path_factory, "fwd_block_range", CHECK_CPP.replace("DISPATCH", dispatch))


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        bm, bn = rng.choice(FWD_TILES)
        sq, sk = rng.randint(1, 1500), rng.randint(1, 1500)
        kind = rng.choice(("full", "causal", "window"))
        if kind == "full":
            cases.append((bm, bn, sq, sk, 0, 0, UNBOUNDED, UNBOUNDED, 0))
            continue
        m_offset = rng.choice((0, rng.randrange(0, bm)))
        if kind == "causal":
            cases.append((bm, bn, sq, sk, 1, 0, UNBOUNDED, 0, m_offset))
            continue
        left = rng.choice((UNBOUNDED, rng.randint(0, 600)))
        right = rng.choice((0, UNBOUNDED, rng.randint(0, 600)))
        cases.append((bm, bn, sq, sk, 1, 1, left, right, m_offset))
    return cases


def test_fixed_windows(checker):
    cases = [(bm, bn, sq, sk, 1, 1, left, right, off)
             for bm, bn in FWD_TILES
             for sq, sk in ((1024, 1024), (700, 1300), (1300, 700), (1, 1), (799, 3), (3, 799))
             for left, right in ((128, 0), (64, 64), (0, 0), (300, UNBOUNDED), (UNBOUNDED, 100), (1, 200))
             for off in (0, 37)]
    assert run_int_cases(checker, cases) == [0] * len(cases)


@pytest.mark.parametrize("seed", range(3))
def test_random_shapes(checker, seed):
    cases = _cases(seed, 60)
    results = run_int_cases(checker, cases)
    bad = [(c, r) for c, r in zip(cases, results) if r != 0]
    assert not bad, f"{len(bad)} cases wrong, first {bad[0]} (code * 100000 + tile)"


def test_window_sides_on_block_boundaries(checker):
    """Sides that put the band's edge on, just before and just after a block boundary, with and without the shift."""
    sides = (0, 1, 63, 64, 65, 126, 127, 128, 129, 191, 192, 193, 254, 255, 256)
    cases = [(bm, bn, sq, sk, 1, 1, left, right, off)
             for bm, bn in FWD_TILES for sq, sk in ((1024, 1024), (1000, 1100), (1100, 1000))
             for left in sides + (UNBOUNDED,) for right in sides[:6] + (UNBOUNDED,) for off in (0, 64)]
    assert run_int_cases(checker, cases) == [0] * len(cases)
