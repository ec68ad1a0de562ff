"""The kernel's schedule policies (hopper/schedule/policies.hpp) compiled as host C++ reproduce the Python model exactly.

The C++ program below walks every CTA of the persistent grid through the same policy calls the kernel roles make
(first_tile/next_tile/make_ctx/init/num_steps/m_block/rank) for the launch the model plans (the order that runs, its
grid size and claim group, which flash_attn_dash.launch decides for the kernels' tiles), and checks it the way the
launcher does (the policy's ``unsupported``, the generated ``mask_mismatch``).  Its CTA-major step list (cta, b, h, n,
m, rank) must equal the model's ``build_plan(...)`` arrays element for element, and therefore also ``trace_array()``.
On the dynamic grid (ascending, descending, split) the CTA of a tile depends on timing, so both sides list every
tile's steps in claim order (CTA -1) instead. GQA-folded cases walk the folded grid (``folded_grid``) and every tile's
siblings through ``SiblingWalk`` (hopper/schedule/sibling_walk.hpp), as the kernel roles do. CPU only: needs g++ (or
c++).
"""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from flash_attn_dash import variants
from flash_attn_dash.launch import bwd_launch
from flash_attn_dash.schedule import TileGrid, build_plan
from flash_attn_dash.schedule.orders import claim_group, fallback_reason
from host_cpp import build_host_program


MIRROR_CPP = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "generated/schedule_ids.h"
#include "schedule/policies.hpp"
#include "schedule/sibling_walk.hpp"

using namespace flash_dash;
using namespace flash_dash::bwd;

static std::vector<long long> out;

template <class Policy, bool kFold>
static void tile_steps(SchedShape const& s, int group, int cta, int t) {
    TileCtx const c = Policy::make_ctx(s, t);
    auto const st = Policy::init(s, c);
    int const steps = Policy::num_steps(s, c, st);
    SiblingWalk<kFold> const siblings{group};
    std::vector<int> walked;
    siblings.for_each_step(c, steps, [](int h) { return h; }, [&](int h, int step) {
        int const m = Policy::m_block(s, c, st, step);
        int const rank = Policy::rank(s, c, st, m);
        long long const row[6] = {cta, c.b, h, c.n, m, rank};
        out.insert(out.end(), row, row + 6);
        walked.push_back(step);
    });
    // The MMA warpgroups' view of the same sequence (SiblingWalk::Cursor) must step alike.
    typename SiblingWalk<kFold>::Cursor cursor{};
    int const count = siblings.num_steps(steps);
    bool same = count == int(walked.size());
    for (int k = 0; same && k < count; ++k) {
        same = cursor.step(k) == walked[k];
        cursor.advance(steps);
    }
    if (!same) { std::fprintf(stderr, "cursor differs from for_each_step\n"); std::exit(3); }
    if constexpr (!kFold) {  // an unfolded tile of a folded (varlen) kernel walks as the unfolded kernel's
        SiblingWalk<true> const unfolded{group, false};
        std::vector<int> again;
        unfolded.for_each_step(c, steps, [](int h) { return h; }, [&](int h, int step) {
            if (h != c.h) { std::fprintf(stderr, "unfolded tile walks head %d\n", h); std::exit(4); }
            again.push_back(step);
        });
        typename SiblingWalk<true>::Cursor cur{};
        bool alike = again == walked && unfolded.num_steps(steps) == count &&
                     unfolded.kv_head(c) == siblings.kv_head(c) && unfolded.query_heads(s) == siblings.query_heads(s);
        for (int k = 0; alike && k < count; ++k) {
            alike = cur.step(k) == walked[k];
            cur.advance(steps);
        }
        if (!alike) { std::fprintf(stderr, "an unfolded tile of a folded kernel walks otherwise\n"); std::exit(4); }
    }
}

template <class Policy, bool kFold>
static void walk(SchedShape const& s, int group) {
    int const num_tiles = s.num_tiles();
    if constexpr (Policy::kDynamic) {  // every claim in claim order; the CTA is decided at run time
        for (int t = 0; t < num_tiles; ++t) { tile_steps<Policy, kFold>(s, group, -1, t); }
        return;
    } else {
        for (int cta = 0; cta < s.grid; ++cta) {
            for (int t = Policy::first_tile(s, cta); t < num_tiles; t = Policy::next_tile(s, t)) {
                tile_steps<Policy, kFold>(s, group, cta, t);
            }
        }
    }
}

template <class Policy>
static void run(SchedShape const& s, bool fold) {
    if (char const* why = Policy::unsupported(s)) { std::printf("unsupported %s\n", why); return; }
    out.clear();
    int const group = s.heads / s.heads_k;
    if (fold) { walk<Policy, true>(folded_grid(s), group); }
    else { walk<Policy, false>(s, group); }
    std::printf("%zu\n", out.size() / 6);
    for (size_t i = 0; i < out.size(); ++i) std::printf("%lld%c", out[i], i + 1 == out.size() ? '\n' : ' ');
    if (out.empty()) std::printf("\n");
}

int main() {
    char mask[16];
    int sq, sk, bm, bn, batch, heads, heads_k, grid, group, sched, left, right, fold;
    // one case per line: mask sq sk block_m block_n batch heads heads_k grid claim_group schedule_id (the policy
    // that runs) window_left window_right (the kernels' window, -1 = unbounded; "causal" = the causal kernels)
    // fold (1: the GQA-folded kernels; the launcher's SchedShape is then folded_grid's, as here)
    while (std::scanf("%15s %d %d %d %d %d %d %d %d %d %d %d %d %d", mask, &sq, &sk, &bm, &bn, &batch, &heads, &heads_k,
                      &grid, &group, &sched, &left, &right, &fold) == 14) {
        bool const causal = std::strcmp(mask, "causal") == 0;
        Schedule const policy = static_cast<Schedule>(sched);
        if (mask_mismatch(policy, causal) != nullptr) { std::printf("mismatch\n"); continue; }
        SchedShape s{};
        s.batch = batch; s.heads = heads; s.heads_k = heads_k;
        s.seqlen_q = sq; s.seqlen_k = sk; s.block_m = bm; s.block_n = bn;
        s.num_m = (sq + bm - 1) / bm; s.num_n = (sk + bn - 1) / bn;
        s.causal = causal; s.grid = grid; s.claim_group = group;
        s.window_left = left < 0 ? kUnboundedWindow : left;
        s.window_right = right < 0 ? (left < 0 ? 0 : kUnboundedWindow) : right;
        if (!tile_count_fits((long long)batch * (fold ? heads_k : heads) * s.num_n, grid)) { std::printf("toobig\n"); continue; }
        bool const f = fold != 0;
        switch (policy) {
            case Schedule::kAscending: run<Ascending>(s, f); break;
            case Schedule::kDescending: run<Descending>(s, f); break;
            case Schedule::kShift: run<Shift>(s, f); break;
            case Schedule::kSplit: run<Split>(s, f); break;
            case Schedule::kDiagonal: run<Diagonal>(s, f); break;
            case Schedule::kSymmetricShift:
                switch (bn / bm) {
                    case 1: run<SymmetricShift<1>>(s, f); break;
                    case 2: run<SymmetricShift<2>>(s, f); break;
                    case 3: run<SymmetricShift<3>>(s, f); break;
                    case 4: run<SymmetricShift<4>>(s, f); break;
                    default: std::printf("unsupported pair step %d\n", bn / bm); break;
                }
                break;
        }
    }
    return 0;
}
"""

DYNAMIC = tuple(s.name for s in variants.SCHEDULES if s.grid == "dynamic")
GRIDS = (1, 7, 78, 114, 132)
KERNEL_TILES = tuple(variants.bwd_tile(h.qk) for h in variants.HEAD_DIMS)
MODEL_TILES = KERNEL_TILES + ((64, 64), (80, 128), (64, 96), (96, 128))


@pytest.fixture(scope="module")
def mirror_binary(tmp_path_factory):
    return build_host_program(tmp_path_factory, "mirror", MIRROR_CPP)


def _plan(case, heads_kv: int | None = None, fold: bool = False):
    """The model's plan of a case (either mode: both claim in the same groups)."""
    mask, sq, sk, bm, bn, batch, heads, num_sms, schedule, *window = case
    return build_plan(mask, sq, sk, bm, bn, batch, heads, num_sms, schedule, heads_kv=heads_kv,
                      window=tuple(window[0]) if window else (-1, -1), fold=fold)


def _group(plan) -> int:
    if plan.schedule_used not in DYNAMIC:
        return 1
    grid_heads = plan.heads_kv if plan.fold > 1 else plan.heads
    return claim_group(plan.grid.num_m, plan.batch * grid_heads, plan.num_ctas)


def _run(exe: Path, lines: list[str]) -> list:
    res = subprocess.run([str(exe)], input="".join(lines), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    out = res.stdout.split("\n")
    results, i = [], 0
    for _ in lines:
        head = out[i]
        i += 1
        if head in ("mismatch", "toobig") or head.startswith("unsupported"):
            results.append(head)
            continue
        count = int(head)
        body = np.array(out[i].split(), dtype=np.int64).reshape(count, 6) if count else np.zeros((0, 6), np.int64)
        i += 1
        results.append(body)
    return results


def _line(mask, sq, sk, bm, bn, batch, heads, grid, group, schedule, window=(-1, -1), heads_k=None,
          fold=False) -> str:
    """One case; ``mask`` and ``window`` are the model's, the kernels get the causal kernels for any window."""
    kernel_mask = "causal" if mask == "causal" or tuple(window) != (-1, -1) else "full"
    heads_k = heads if heads_k is None else heads_k
    return (f"{kernel_mask} {sq} {sk} {bm} {bn} {batch} {heads} {heads_k} {grid} {group} "
            f"{variants.schedule(schedule).id} {window[0]} {window[1]} {int(fold)}\n")


def _assert_steps_match(case, plan, body) -> None:
    """The kernel's step list (``_run``'s rows) equals the model plan's, CTA-major, or in claim order with CTA -1 on
    the dynamic grid."""
    assert not isinstance(body, str), (case, body)
    expect = np.stack([plan.step_cta, plan.step_b, plan.step_h, plan.step_n, plan.step_m, plan.step_rank], axis=1)
    if plan.schedule_used in DYNAMIC:  # claim order (= the dynamic grid's round), CTA unknown (module docstring)
        expect = expect[np.argsort(plan.step_round, kind="stable")]
        expect[:, 0] = -1
    assert body.shape == expect.shape, (case, body.shape, expect.shape)
    if not np.array_equal(body, expect):
        bad = int(np.argmax((body != expect).any(axis=1)))
        raise AssertionError(f"{case}: step {bad} (cta, b, h, n, m, rank): kernel {body[bad].tolist()} "
                             f"model {expect[bad].tolist()}")


def _check_cases(exe: Path, cases: list[tuple], heads_kv: int | None = None, fold: bool = False) -> None:
    """Walk the policy the model plans for each case (what the launch decides) and compare every step."""
    plans = [_plan(c, heads_kv, fold) for c in cases]
    lines = [_line(*c[:7], p.num_ctas, _group(p), p.schedule_used, p.grid.window, p.heads_kv, fold)
             for c, p in zip(cases, plans)]
    for case, plan, body in zip(cases, plans, _run(exe, lines)):
        _assert_steps_match(case, plan, body)
        # The GPU test compares the trace; the same step list gives the same trace.
        trace = np.full(plan.shape, -1, dtype=np.int32)
        trace[body[:, 1], body[:, 2], body[:, 4], body[:, 5]] = body[:, 3]
        assert np.array_equal(trace, plan.trace_array()), case


def _cases_fixed() -> list[tuple]:
    cases = [
        # shift: R > M fallback (M = 2, N = 128, G = 132), straddling heads, many rounds
        ("full", 128, 16384, 64, 128, 1, 2, 132, "shift"),
        ("full", 256, 16384, 64, 128, 1, 2, 132, "shift"),
        ("full", 128, 16384, 128, 128, 2, 3, 114, "shift"),
        ("full", 8192, 8192, 64, 128, 2, 16, 132, "shift"),
        ("full", 8192, 8192, 64, 128, 2, 16, 114, "shift"),
        ("full", 8192, 8192, 128, 128, 1, 16, 78, "shift"),
        ("full", 1000, 3000, 128, 128, 2, 3, 1, "shift"),
        ("full", 113, 2000, 64, 128, 1, 4, 115, "shift"),
        ("full", 2000, 113, 64, 128, 2, 2, 132, "shift"),
        ("full", 5 * 64, 4 * 64, 64, 64, 1, 1, 132, "shift"),
        # symmetric shift: the pair grid
        ("causal", 8192, 8192, 64, 128, 2, 16, 132, "symmetric_shift"),
        ("causal", 8192, 8192, 64, 128, 2, 16, 114, "symmetric_shift"),
        ("causal", 8192, 8192, 64, 128, 2, 16, 78, "symmetric_shift"),
        ("causal", 8192, 8192, 128, 128, 2, 32, 132, "symmetric_shift"),
        ("causal", 1024, 1024, 64, 128, 1, 1, 132, "symmetric_shift"),
        ("causal", 4224, 4224, 64, 128, 1, 2, 32, "symmetric_shift"),
        ("causal", 8100, 8100, 64, 128, 1, 2, 132, "symmetric_shift"),  # M = 127 < N*s = 128
        ("causal", 8100, 8100, 128, 128, 1, 3, 7, "symmetric_shift"),
        ("causal", 2048, 2048, 64, 128, 3, 5, 1, "symmetric_shift"),
        ("causal", 1000, 1000, 64, 128, 3, 5, 1, "symmetric_shift"),
        ("causal", 129, 129, 64, 128, 2, 3, 5, "symmetric_shift"),  # N = 2, M = 3
        ("causal", 1024, 1024, 64, 128, 2, 8, 78, "symmetric_shift"),
        # symmetric shift fallbacks (the whole call runs descending)
        ("causal", 2048, 1024, 64, 128, 1, 3, 78, "symmetric_shift"),  # sq != sk
        ("causal", 1024, 2048, 64, 128, 2, 3, 132, "symmetric_shift"),
        ("causal", 1920, 1920, 64, 128, 1, 3, 78, "symmetric_shift"),  # N = 15 odd
        ("causal", 4224, 4224, 128, 128, 1, 2, 132, "symmetric_shift"),  # N = 33 odd
        ("causal", 1, 1, 64, 128, 1, 1, 132, "symmetric_shift"),  # N = 1
        ("causal", 2048, 2048, 64, 96, 1, 3, 78, "symmetric_shift"),  # block_n % block_m
        ("causal", 2048, 2048, 96, 128, 1, 3, 78, "symmetric_shift"),
        ("causal", 2000, 900, 64, 128, 1, 3, 114, "symmetric_shift"),
        # split: even and odd N, N = 1, seqlen_q != seqlen_k, a partial last tile, one CTA
        ("causal", 8192, 8192, 64, 128, 2, 16, 132, "split"),
        ("causal", 8192, 8192, 128, 128, 2, 32, 114, "split"),
        ("causal", 1920, 1920, 64, 128, 1, 3, 78, "split"),
        ("causal", 8100, 8100, 128, 128, 1, 3, 7, "split"),
        ("causal", 2048, 1024, 64, 128, 1, 3, 78, "split"),
        ("causal", 1000, 3000, 128, 128, 2, 2, 1, "split"),
        ("causal", 1, 1, 64, 128, 1, 1, 132, "split"),
        ("causal", 129, 129, 64, 128, 2, 3, 5, "split"),
        # ascending / descending unchanged
        ("causal", 300, 500, 64, 128, 2, 3, 7, "descending"),
        ("causal", 2000, 113, 64, 128, 2, 2, 132, "ascending"),
        ("full", 799, 3, 128, 128, 3, 2, 127, "descending"),
    ]
    # Emulated GPUs: sm_margin 18 (114 SMs) and 54 (78 SMs) on a 132-SM H200, and the GPU-test shapes.
    for margin in (0, 5, 17, 18, 54, 100, 131):
        g = 132 - margin
        for bm, bn in KERNEL_TILES:
            cases.append(("full", 4224, 4224, bm, bn, 1, 2, g, "shift"))
            cases.append(("full", 1024, 1024, bm, bn, 2, 3, g, "shift"))
            cases.append(("causal", 4224, 4224, bm, bn, 1, 2, g, "symmetric_shift"))
            cases.append(("causal", 1024, 1024, bm, bn, 2, 3, g, "symmetric_shift"))
            cases.append(("causal", 2048, 2048, bm, bn, 2, 4, g, "symmetric_shift"))
    return cases


def _cases_random(count: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        bm, bn = rng.choice(MODEL_TILES if rng.random() < 0.3 else KERNEL_TILES)
        batch, heads, grid = rng.randint(1, 3), rng.randint(1, 6), rng.choice(GRIDS + (rng.randint(1, 132),))
        if rng.random() < 0.5:
            sq, sk = rng.randint(1, 6000), rng.randint(1, 6000)
            if rng.random() < 0.15:
                sq = rng.randint(1, 300)  # R > M territory
                sk = rng.randint(4000, 20000)
            cases.append(("full", sq, sk, bm, bn, batch, heads, grid, "shift"))
        else:
            r = rng.random()
            if r < 0.5:
                sq = sk = 2 * bn * rng.randint(1, 40)  # the symmetric-shift case proper
            elif r < 0.8:
                sq = sk = rng.randint(1, 8000)  # partial last tile, odd or even N
            else:
                sq, sk = rng.randint(1, 6000), rng.randint(1, 6000)
            cases.append(("causal", sq, sk, bm, bn, batch, heads, grid, rng.choice(("symmetric_shift", "split"))))
    return cases


def test_mirror_fixed_shapes(mirror_binary):
    _check_cases(mirror_binary, _cases_fixed())


@pytest.mark.parametrize("seed", range(4))
def test_mirror_random_shapes(mirror_binary, seed):
    _check_cases(mirror_binary, _cases_random(20, seed))


def test_mirror_all_schedules_small(mirror_binary):
    """Every applicable schedule on small shapes and every grid size (incl. G > #tiles)."""
    cases = []
    for mask, sq, sk in (("full", 333, 777, ), ("full", 64, 64), ("causal", 512, 512), ("causal", 640, 640),
                         ("causal", 700, 300)):
        for bm, bn in KERNEL_TILES:
            for g in (1, 2, 3, 5, 7, 13, 78, 114, 132, 1000):
                for schedule in variants.schedules_for(mask):
                    cases.append((mask, sq, sk, bm, bn, 2, 3, g, schedule))
    _check_cases(mirror_binary, cases)


WINDOWS = ((128, 0), (64, 64), (0, 0), (300, -1), (1, 200), (-1, 100), (2000, 0), (1990, 0))


def test_mirror_windows(mirror_binary):
    """Sliding windows (the causal kernels with a band): every order the kernels run on a window (ascending,
    descending, and symmetric_shift where the window removes no tile of the causal triangle, else its fallback)
    walks, visits and ranks exactly as the model; bands that remove tiles included (rank = n - n_min(m))."""
    cases = []
    for sq, sk in ((1024, 1024), (2048, 2048), (4224, 4224), (700, 1300), (1300, 700), (8192, 8192), (129, 129)):
        for bm, bn in KERNEL_TILES:
            for window in WINDOWS:
                for schedule in ("ascending", "descending", "symmetric_shift"):
                    grid = TileGrid("full", sq, sk, bm, bn, window)
                    if schedule == "symmetric_shift" and grid.mask != "causal":
                        continue  # the full mask's bands: the launch runs descending (test_schedule_used_...)
                    for g in (1, 7, 132):
                        cases.append((grid.mask, sq, sk, bm, bn, 2, 3, g, schedule, window))
    _check_cases(mirror_binary, cases)


def test_window_tile_ranges_match_the_model(mirror_binary):
    """m_min(n), m_end(n) (visited Q tiles), n_min(m) (the rank offset) and whether a window removes causal tiles,
    the C++ of policies.hpp against TileGrid, on random shapes and windows (through the descending walk: its steps
    of tile n are m_end(n)-1 .. m_min(n), ranked n - n_min(m))."""
    rng = random.Random(11)
    cases = []
    for _ in range(60):
        bm, bn = rng.choice(KERNEL_TILES)
        sq, sk = rng.randint(1, 3000), rng.randint(1, 3000)
        window = (rng.choice((-1, rng.randint(0, 2000))), rng.choice((-1, 0, rng.randint(0, 2000))))
        if window == (-1, -1):
            window = (rng.randint(0, 500), 0)
        mask = TileGrid("full", sq, sk, bm, bn, window).mask
        cases.append((mask, sq, sk, bm, bn, 1, 2, rng.choice(GRIDS), "descending", window))
    _check_cases(mirror_binary, cases)


@pytest.mark.parametrize("heads_kv", [1, 2, 4])
def test_mirror_gqa_heads_take_sibling_major_slots(mirror_binary, heads_kv):
    """GQA: every grid places query head hk * (H / Hk) + s on slot s * Hk + hk (orders.slot_heads, policies.hpp
    slot_head), so siblings sharing a dK/dV tile are Hk slots apart; kernel and model agree step for step, and each
    plan passes its deadlock check (every sibling's dK/dV predecessor in an earlier or the same round)."""
    cases = []
    for bm, bn in KERNEL_TILES:
        for g in (1, 7, 132):
            cases += [("full", 2048, 2048, bm, bn, 2, 8, g, s) for s in ("shift", "ascending", "descending")]
            cases += [("causal", 2048, 2048, bm, bn, 2, 8, g, s)
                      for s in ("symmetric_shift", "ascending", "descending", "split")]
            cases.append(("causal", 4096, 4096, bm, bn, 1, 8, g, "descending", (127, 0)))
    _check_cases(mirror_binary, cases, heads_kv=heads_kv)
    for case in cases:
        plan = _plan(case, heads_kv=heads_kv)
        plan.check()
        assert np.unique(plan.step_h).tolist() == list(range(8))


def test_gqa_siblings_are_heads_k_slots_apart():
    from flash_attn_dash.schedule.orders import slot_heads
    slot = np.arange(8)
    assert slot_heads(slot, 8, 8).tolist() == list(range(8))  # MHA: the identity
    assert slot_heads(slot, 8, 1).tolist() == list(range(8))  # MQA: every head a sibling of the one K/V head
    assert slot_heads(slot, 8, 2).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert slot_heads(slot, 8, 4).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_mirror_mask_mismatch_rejected(mirror_binary):
    """The generated mask rule refuses what variants.SCHEDULES does not define for the mask."""
    lines = [_line(mask, 256, 256, 64, 128, 1, 1, 4, 1, s.name) for s in variants.SCHEDULES for mask in variants.MASKS]
    got = _run(mirror_binary, lines)
    for (s, mask), result in zip([(s, m) for s in variants.SCHEDULES for m in variants.MASKS], got):
        assert (isinstance(result, str) and result == "mismatch") == (mask not in s.masks), (s.name, mask)


def test_policy_preconditions_match_the_models_fallbacks(mirror_binary):
    """A policy refuses a shape (the launcher's check of the Python decision) exactly when the model falls back:
    symmetric_shift on the causal mask's shapes, split (and symmetric_shift) on windows, banded or not."""
    rng = random.Random(3)
    shapes = [(sq, sq) for sq in (128, 256, 1920, 2048, 4224, 8100)] + \
             [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(40)]
    windows = ((-1, -1),) + WINDOWS + ((5000, 0), (rng.randint(0, 3000), 0))
    for bm, bn in KERNEL_TILES:
        cases = [(sq, sk, window, schedule) for sq, sk in shapes for window in windows
                 for schedule in ("symmetric_shift", "split")]
        lines, expect = [], []
        for sq, sk, window, schedule in cases:
            grid = TileGrid("causal" if window == (-1, -1) else "full", sq, sk, bm, bn, window)
            if grid.mask != "causal":
                continue  # the full mask's bands run neither (mask_mismatch: test_mirror_mask_mismatch_rejected)
            lines.append(_line("causal", sq, sk, bm, bn, 1, 2, 1, 1, schedule, window))
            expect.append(((sq, sk, window, schedule), fallback_reason(schedule, grid)))
        for (case, why), got in zip(expect, _run(mirror_binary, lines)):
            assert isinstance(got, str) == (why is not None), (case, bm, bn, why, got)


def test_mirror_nondeterministic_walk(mirror_binary):
    """Non-deterministic launches (what flash_attn_dash.launch decides for the kernels' tiles: the walk, its grid,
    its claim groups) step exactly like the model's plan of that walk, whatever schedule was requested."""
    cases = []
    for h in variants.HEAD_DIMS:
        bm, bn = variants.bwd_tile(h.qk)
        for mask, sq, sk in (("causal", 8192, 8192), ("causal", 1024, 1024), ("causal", 1920, 1920),
                             ("causal", 2048, 1024), ("causal", 1, 1), ("full", 2048, 2048), ("full", 113, 203)):
            for g in (1, 78, 132):
                for requested in variants.schedules_for(mask):
                    launch = bwd_launch(mask == "causal", h.qk, sq, sk, 2, 3, g, False, requested)
                    plan = _plan((mask, sq, sk, bm, bn, 2, 3, g, launch.schedule))
                    assert (plan.schedule_used, plan.num_ctas) == (launch.schedule, launch.grid)
                    assert _group(plan) == launch.claim_group
                    cases.append((mask, sq, sk, bm, bn, 2, 3, g, launch.schedule))
    _check_cases(mirror_binary, cases)


def _fold_cases(group: int) -> list[tuple]:
    """Every schedule of both masks, windows and several grid sizes, 8 query heads in groups of ``group``."""
    cases = []
    for bm, bn in KERNEL_TILES:
        for g in (1, 7, 78, 132):
            for mask, sq, sk in (("full", 2048, 2048), ("full", 333, 777), ("causal", 2048, 2048),
                                 ("causal", 1000, 1000), ("causal", 700, 1300)):
                cases += [(mask, sq, sk, bm, bn, 2, 8, g, s) for s in variants.schedules_for(mask)]
            for window in ((128, 0), (64, 64), (300, -1)):
                for s in ("ascending", "descending", "symmetric_shift"):
                    grid = TileGrid("full", 4096, 4096, bm, bn, window)
                    if s == "symmetric_shift" and grid.mask != "causal":
                        continue
                    cases.append((grid.mask, 4096, 4096, bm, bn, 1, 8, g, s, window))
    return cases


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_mirror_gqa_fold(mirror_binary, group):
    """GQA sibling fold: the kernel's folded grid (folded_grid + SiblingWalk, as every role walks it) steps exactly
    like the model's folded plan (build_plan(..., fold=True)), every schedule, windows, several grids; each plan
    passes Plan.check. Group 1 (no siblings): the fold's walk is the plain one."""
    heads_kv = 8 // group
    cases = _fold_cases(group)
    plans = [_plan(c, heads_kv=heads_kv, fold=group > 1) for c in cases]
    lines = [_line(*c[:7], p.num_ctas, _group(p), p.schedule_used, p.grid.window, heads_kv, fold=True)
             for c, p in zip(cases, plans)]
    for case, plan, body in zip(cases, plans, _run(mirror_binary, lines)):
        _assert_steps_match(case, plan, body)
    for plan in plans[::7]:
        plan.check()


@pytest.mark.parametrize("group", [2, 4, 8])
def test_gqa_fold_ranks_are_the_kv_grids(group):
    """Each sibling's dQ tiles get exactly the ranks of the plain plan over the K/V heads (ranks do not depend on the
    head), the folded grid has B * Hk * N tiles, and no dK/dV waits are left (Plan.check passes)."""
    for mask, schedule in (("full", "shift"), ("full", "ascending"), ("causal", "symmetric_shift"),
                           ("causal", "descending"), ("causal", "split")):
        for g in (5, 132):
            folded = build_plan(mask, 2048, 2048, 64, 128, 2, 8, g, schedule, heads_kv=8 // group, fold=True)
            kv = build_plan(mask, 2048, 2048, 64, 128, 2, 8 // group, g, schedule)
            folded.check()
            assert folded.num_ctas == kv.num_ctas and folded.fold == group
            assert sum(len(t) for t in folded.cta_tiles) == 2 * (8 // group) * folded.grid.num_n
            trace, kv_trace = folded.trace_array(), kv.trace_array()
            for s in range(group):
                assert np.array_equal(trace[:, s::group][:, :], kv_trace), (mask, schedule, g, s)


def test_gqa_fold_launch_decision():
    """flash_attn_dash.launch decides the fold in one place: GQA calls on narrow bands fold, MHA never; the grid and
    claim group are those of the K/V heads' grid, as the model's folded plan has them (the rule itself:
    test_schedule_auto.test_gqa_fold_runs_on_narrow_bands_only)."""
    from flash_attn_dash.launch import bwd_launch, model_mask
    for window in ((128, 0), (64, 64)):
        for det in (True, False):
            launch = bwd_launch(True, 64, 8192, 8192, 1, 64, 132, det, "auto", window, 8)
            assert launch.gqa_fold
            plan = build_plan(model_mask(True, window), 8192, 8192, 128, 128, 1, 64, 132, launch.schedule,
                              heads_kv=8, claim_heads=launch.claim_group, window=window, fold=True)
            assert (plan.schedule_used, plan.num_ctas) == (launch.schedule, launch.grid)
            if launch.schedule in DYNAMIC:
                assert launch.claim_group == _group(plan)
            assert not bwd_launch(True, 64, 8192, 8192, 1, 64, 132, det, "auto", window, 64).gqa_fold
    with pytest.raises(ValueError, match="heads_k"):
        bwd_launch(True, 64, 1024, 1024, 1, 6, 132, True, "auto", (-1, -1), 4)
