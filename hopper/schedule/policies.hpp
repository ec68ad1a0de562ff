// Backward schedule policies: which K/V tiles a CTA processes, in which order a K/V tile visits
// its Q tiles, and the rank (position in the deterministic dQ accumulation order) of every
// (n, m) contribution. One policy = one compile-time template parameter of the backward kernel.
//
// Contract shared with flash_attn_dash/schedule (Python model, orders.py docstring = the spec; a GPU
// test compares the dQ arrival trace, tests/test_schedule_kernel_mirror.py compiles this header as
// host code and compares every CTA's task list (static grids) or every tile's walk (dynamic grid)
// with the model). Which policy runs, on how many CTAs and with which claim group is decided once, on the
// Python side (flash_attn_dash/launch.py); the launcher checks the decision against each policy's
// `unsupported` before launching:
//  * M = ceil(sq / kBlockM), N = ceil(sk / kBlockN); causal is aligned bottom-right: query row i
//    sees key j iff j <= i + (sk - sq).
//  * K/V tile n is visited by the Q tiles m in [m_min(n), m_end(n)): for full masks [0, M); for causal masks
//    and sliding windows (the causal kernels, row i sees keys [i + sk - sq - left, i + sk - sq + right], the
//    causal mask being left unbounded, right 0; floors also for negatives, clamped to [0, M])
//      m_min(n) = floor((n*kBlockN - (sk - sq) - right) / kBlockM),
//      m_end(n) = floor((min((n+1)*kBlockN, sk) - 1 - (sk - sq) + left) / kBlockM) + 1  (>= m_min(n)),
//    and dQ tile m receives from the K/V tiles [n_min(m), ...), n_min(m) = floor(max(0, m*kBlockM + (sk - sq) -
//    left) / kBlockN) (the model's TileGrid in flash_attn_dash/schedule/tiles.py).
//  * G CTAs, at most one per SM (min(num_sms, B*H*N)). Static persistent grid (Shift): linear tile t in [0, B*H*N),
//    n = t % N, h = (t / N) % H, b = t / (N*H); CTA g processes t = g, g+G, g+2G, ...  Dynamic
//    persistent grid (Ascending, Descending, Split, Diagonal): tiles in claim order p (n-major within groups of heads,
//    see DynamicPersistentGrid); CTA g starts with p = g and then claims the next unclaimed p.
//  * Ascending walks m = m_min .. M-1, Descending walks m = M-1 .. m_min (Split, Diagonal: see the policies).
//  * rank(n, m) = #{ n' < n : tile n' touches m } = n - n_min(m) (Ascending, Descending).
//    Proof: m_min(n') and m_end(n') are non-decreasing in n' (floors of non-decreasing arguments), so the n'
//    touching m are contiguous, from n_min(m) on; for the full and causal masks n_min(m) = 0 and the rank is n.
//    The ranks of one Q tile m are {0 .. K_m - 1} with no gaps or duplicates.
//  Deadlock freedom (any m order, either grid): contribution (n, m) waits only for
//  (n-1, m) (Split, Diagonal: the tile claimed last before n among those touching m), which belongs to a tile
//  earlier in the grid's order (t, or p on the dynamic grid). All G
//  CTAs are resident (1 CTA/SM, G <= #SMs), tiles are handed out in that order and each CTA processes
//  its tiles in that order, so the unfinished tile that comes first is held by a running CTA and never
//  waits on anything unfinished: the system always makes progress.
//  * Shift (full mask only) and SymmetricShift (causal only, pair grid): see the policies below.
//  * GQA sibling fold (schedule/sibling_walk.hpp; kernels built with FLASH_DASH_GQA_FOLD): the policies walk the
//    folded grid, whose heads are the Hk K/V heads (SchedShape::heads = Hk, slot_head the identity), and each tile
//    (b, hk, n) runs its walk W once per sibling s = 0..G-1 (query head h = hk*G + s): W_0 W_1 .. W_{G-1}, step i of
//    W_s being (h, m_i) with the rank the policy gives (n, m_i). dK/dV stay in registers (no dK/dV waits at all).
//    Ranks: for each sibling s the contributions into the dQ tiles (b, hk*G + s, m) are exactly those of the
//    unfolded schedule of the Hk-head grid, so every dQ tile's ranks are 0 .. K_m - 1 as above.
//    Deadlock freedom: give each contribution the key (u, s): u = the tile's round on the static grid, (round,
//    stage) on the pair grid (stage 0 long, 1 short), the claim p on the dynamic grid; s its sibling. (1) Along
//    every CTA's program keys never decrease (tiles run in increasing u, siblings in increasing s within a tile).
//    (2) A wait is on the rank predecessor of the same dQ tile, hence the same sibling s, in a tile of the same or
//    an earlier u (the unfolded arguments: earlier rounds rank first; a round's long tiles never wait on its short
//    ones; on the dynamic grid the predecessor has a smaller p). So the contributions of the smallest unfinished key
//    wait only on contributions of that key: on the static and pair grids they are one round (or one stage of it)
//    of the unfolded schedule, run by co-resident CTAs that finished everything before it, which completes as in
//    the unfolded case; on the dynamic grid they are one tile's walk with every predecessor finished, and tile p is
//    claimed because every CTA holding a smaller p has finished it. By induction over the keys everything finishes.
//    Non-deterministic adds wait for rank 0 only, a subset of these waits. Plan.check (fold=True) checks the same.
//
// Policy interface (all roles of the kernel walk the same sequence; on the dynamic grid next_tile
// is the tile the CTA's producer claimed, passed on through shared memory):
//    for (t = first_tile(s, cta); t < s.num_tiles(); t = next_tile(s, t)) {
//        TileCtx c = make_ctx(s, t); State st = init(s, c);
//        for (step = 0; step < num_steps(s, c, st); ++step) { m = m_block(s, c, st, step); rank(s, c, st, m); }
//    }
//  kMask says which mask a policy is valid for (the kernel static_asserts it).
//  All arithmetic is 32-bit int on values < 2^31: the host guarantees B*H*N + 2*G < 2^31 (see
//  tile_count_fits); pointer offsets are formed in int64 by the kernel.
//
// This header is plain C++ (no CUDA/CUTE includes) so that it compiles as host code.
#pragma once
#include <cstdint>
#include "common/host_device.hpp"
#include "common/window.hpp"

namespace flash_dash {
namespace bwd {

// Problem shape as the schedule sees it (all 32-bit; products that can exceed 2^31 use int64).
struct SchedShape {
    int batch, heads, heads_k;   // B, H (the grid's heads: query heads, or Hk when GQA-folded), Hk
    int seqlen_q, seqlen_k;      // sq, sk
    int block_m, block_n;        // kBlockM, kBlockN
    int num_m, num_n;            // M, N
    int grid;                    // G (persistent CTAs): min(num_sms, #tiles), or min(num_sms, #pairs) on the pair grid
    int claim_group;             // dynamic grid: heads per claim group (orders.py claim_group)
    bool causal;                 // the causal kernels: the causal mask or a sliding window
    int window_left, window_right;  // causal: the band (kUnboundedWindow on an unbounded side; the causal mask: right 0)
    FLASH_DASH_HD int num_tiles() const { return batch * heads * num_n; }
};

FLASH_DASH_HD int floor_div(int a, int b) {  // b > 0
    int q = a / b;
    return (q * b > a) ? q - 1 : q;
}

FLASH_DASH_HD int clamp_tiles(int v, int count) { return v < 0 ? 0 : (v > count ? count : v); }

// First Q tile that K/V tile n touches (M if none).
FLASH_DASH_HD int m_min_of(SchedShape const& s, int n) {
    if (!s.causal) return 0;
    return clamp_tiles(floor_div(n * s.block_n - (s.seqlen_k - s.seqlen_q) - s.window_right, s.block_m), s.num_m);
}

// One past the last Q tile that K/V tile n touches (>= m_min_of(s, n)).
FLASH_DASH_HD int m_end_of(SchedShape const& s, int n) {
    if (!s.causal || s.window_left >= kUnboundedWindow) return s.num_m;
    int const last_key = ((n + 1) * s.block_n < s.seqlen_k ? (n + 1) * s.block_n : s.seqlen_k) - 1;
    int const end = clamp_tiles(floor_div(last_key - (s.seqlen_k - s.seqlen_q) + s.window_left, s.block_m) + 1,
                                s.num_m);
    int const lo = m_min_of(s, n);
    return end > lo ? end : lo;
}

// First K/V tile that adds into dQ tile m.
FLASH_DASH_HD int n_min_of(SchedShape const& s, int m) {
    if (!s.causal || s.window_left >= kUnboundedWindow) return 0;
    int const key = m * s.block_m + (s.seqlen_k - s.seqlen_q) - s.window_left;
    return clamp_tiles(floor_div(key > 0 ? key : 0, s.block_n), s.num_n);
}

// One past the last K/V tile that adds into dQ tile m (>= n_min_of(s, m)).
FLASH_DASH_HD int n_end_of(SchedShape const& s, int m) {
    if (!s.causal) return s.num_n;
    int const last_row = ((m + 1) * s.block_m < s.seqlen_q ? (m + 1) * s.block_m : s.seqlen_q) - 1;
    int const end = clamp_tiles(floor_div(last_row + (s.seqlen_k - s.seqlen_q) + s.window_right, s.block_n) + 1,
                                s.num_n);
    int const lo = n_min_of(s, m);
    return end > lo ? end : lo;
}

// Whether the window removes a tile that the causal mask alone visits (the model's TileGrid.banded): the
// pair grid's tile counts then differ from the causal triangle's.
FLASH_DASH_HD bool removes_causal_tiles(SchedShape const& s) {
    if (!s.causal) return false;
    int const d = s.seqlen_k - s.seqlen_q;
    int const first_keys = (s.block_n < s.seqlen_k ? s.block_n : s.seqlen_k) - 1;
    int const first_rows = (s.block_m < s.seqlen_q ? s.block_m : s.seqlen_q) - 1;
    bool const lower_left = s.window_left < kUnboundedWindow &&
                            first_keys < (s.num_m - 1) * s.block_m + d - s.window_left;
    bool const upper_right = s.window_right > 0 && (s.num_n - 1) * s.block_n > first_rows + d + s.window_right;
    return lower_left || upper_right;
}

// Everything a policy may need about one K/V tile.
struct TileCtx {
    int t;          // linear unit index (tile index on the static grid; 2*chunk + stage on the pair grid)
    int n, h, b;    // decoded coordinates
    int m_min, m_end;  // visited Q tiles: [m_min, m_end)
};

// Wave (persistent round) information of a unit (tile or pair), for shift-type schedules.
struct WaveInfo {
    int round;      // unit / G
    int running;    // R: units of the same (b, h) processed in this round
    int finished;   // F: units of the same (b, h) processed in earlier rounds
    int slot;       // k = (unit index within its head) - F, in [0, R)
};

// Mirrors orders.py `_waves`: `unit` is the linear index, `in_head` its index within its (b, h),
// `per_head` the units per (b, h), `grid` = G.
FLASH_DASH_HD WaveInfo wave_of(int unit, int in_head, int per_head, int grid) {
    WaveInfo w;
    w.round = unit / grid;
    int const wave_start = w.round * grid;
    int const wave_end = wave_start + grid;                // exclusive
    int const head_start = unit - in_head;
    int const head_end = head_start + per_head;            // exclusive
    int const lo = wave_start > head_start ? wave_start : head_start;
    int const hi = wave_end < head_end ? wave_end : head_end;
    w.running = hi - lo;
    w.finished = lo - head_start;
    w.slot = in_head - w.finished;
    return w;
}

// Static grid: the unit is the tile t, n its index within the head.
FLASH_DASH_HD WaveInfo wave_info(SchedShape const& s, TileCtx const& c) {
    return wave_of(c.t, c.n, s.num_n, s.grid);
}

// x mod r for x in (-r, 2r), r > 0 (one conditional add/subtract, no division).
FLASH_DASH_HD int wrap_once(int x, int r) {
    return x < 0 ? x + r : (x >= r ? x - r : x);
}

enum PolicyMask : int { kAnyMask = 0, kFullOnly = 1, kCausalOnly = 2 };

// What the one-tile-per-unit grids below share: CTA g starts with unit g, and the rank rule.
struct LinearTiles {
    static constexpr bool kPairGrid = false;
    FLASH_DASH_HD static int first_tile(SchedShape const&, int cta) { return cta; }
    // Why the policy cannot run on this shape, or nullptr (every shape, for the one-tile-per-unit grids).
    static const char* unsupported(SchedShape const&) { return nullptr; }
    // Number of n' < n whose tile touches m: n - n_min(m) (n for the full and causal masks; see the proof at the
    // top of this file).
    FLASH_DASH_HD static int rank_naive(SchedShape const& s, TileCtx const& c, int m) { return c.n - n_min_of(s, m); }
};

// The query head of head slot r in [0, H) of every grid below: sibling-major, slot r = s * Hk + hk is sibling s of
// K/V head hk, h = hk * (H / Hk) + s (the identity without GQA). Siblings add their dK/dV into one tile in
// ascending s behind one counter (epilogue.hpp); in head order they sat in adjacent slots, so a claim group or round
// ran them together and they queued on that counter. Hk slots apart, they add into different tiles, and sibling
// s - 1 still has the smaller slot, which the deadlock-freedom argument needs (orders.py slot_heads).
FLASH_DASH_HD int slot_head(SchedShape const& s, int r) {
    return (r % s.heads_k) * (s.heads / s.heads_k) + r / s.heads_k;
}

// Static persistent grid: linear tiles t = (b*H + r)*N + n (n fastest, r the head slot); CTA g runs t = g, g+G, ...
// (Shift needs the rounds this fixes).
struct StaticPersistentGrid : LinearTiles {
    static constexpr bool kDynamic = false;
    FLASH_DASH_HD static int next_tile(SchedShape const& s, int t) { return t + s.grid; }
    FLASH_DASH_HD static TileCtx make_ctx(SchedShape const& s, int t) {
        TileCtx c;
        c.t = t;
        c.n = t % s.num_n;
        int const bh = t / s.num_n;
        c.h = slot_head(s, bh % s.heads);
        c.b = bh / s.heads;
        c.m_min = m_min_of(s, c.n);
        c.m_end = m_end_of(s, c.n);
        return c;
    }
};

// Dynamic persistent grid: CTA g starts with claim p = g, then claims the next unclaimed p at run time
// (tile_ring.hpp), so CTAs that draw short tiles (causal) take more of them. Claims go n-major within
// groups of claim_group heads: p -> group p / (Hg*N), then n, then the head within the group. A head's
// tiles n-1 and n are then Hg claims apart, so a tile's rank predecessor (n-1, m) has usually started
// when it is claimed, instead of chaining the claims of one head one after another; groups bound the
// heads whose Q/dO/dQ are in flight (L2). Every rank predecessor (n-1, same head) and every GQA dK/dV
// predecessor (same n, previous sibling: a smaller head slot) has a smaller p, tiles are claimed in
// increasing p and every CTA runs its tiles in that order, so the deadlock-freedom proof at the top of this file holds (with p for
// t) for every assignment the hardware produces; the ranks do not depend on it.
struct DynamicPersistentGrid : LinearTiles {
    static constexpr bool kDynamic = true;
    FLASH_DASH_HD static TileCtx make_ctx(SchedShape const& s, int p) {
        int const per_group = s.claim_group * s.num_n;
        int const group = p / per_group;
        int const q0 = group * s.claim_group;
        int const left = s.batch * s.heads - q0;
        int const size = left < s.claim_group ? left : s.claim_group;
        int const in_group = p - group * per_group;
        TileCtx c;
        c.t = p;
        c.n = in_group / size;
        int const q = q0 + (in_group - c.n * size);
        c.h = slot_head(s, q % s.heads);
        c.b = q / s.heads;
        c.m_min = m_min_of(s, c.n);
        c.m_end = m_end_of(s, c.n);
        return c;
    }
    // The K/V tile at a head's claim position j (the varlen tile table holds positions: bwd/tiles.hpp).
    FLASH_DASH_HD static int claimed_n(SchedShape const&, int j) { return j; }
};

// Every visible Q tile of the K/V tile once, rank = n; Ascending and Descending differ only in direction.
template <bool kDescending>
struct MonotoneWalk : DynamicPersistentGrid {
    static constexpr const char* kName = kDescending ? "descending" : "ascending";
    static constexpr int kMask = kAnyMask;
    struct State {};
    FLASH_DASH_HD static State init(SchedShape const&, TileCtx const&) { return {}; }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;
    }
    FLASH_DASH_HD static int m_block(SchedShape const&, TileCtx const& c, State const&, int step) {
        return kDescending ? c.m_end - 1 - step : c.m_min + step;
    }
    FLASH_DASH_HD static int rank(SchedShape const& s, TileCtx const& c, State const&, int m) {
        return rank_naive(s, c, m);
    }
};

struct Ascending : MonotoneWalk<false> {};
struct Descending : MonotoneWalk<true> {};

// Split and Diagonal (causal only; on a band the host falls back to Descending, like the model): a head's tiles
// n < P are claimed first in ascending n and walk down from M-1 (Descending's walk), then the others from n = N-1
// down to P, walking up from m_min(n): claim position j (DynamicPersistentGrid's n-major decode) is n = j < P ? j :
// N-1-(j-P). rank = n for n < P, P + n_end(m) - 1 - n for n >= P: the place of n in that claim order among the tiles
// touching m (n_min(m) = 0 on the causal mask). Ranks and walks are functions of (n, m, N, M), so the bits do not
// depend on the grid; every rank predecessor has a smaller claim p, so the proof at the top of this file holds. Why
// the up walk: tile n then reaches row m kS steps after tile n+1 (claimed before it) instead of as soon as its claim
// allows, so the reduce hand-offs of a head's tiles do not queue on one row (docs/portable-orders.md).
//   Split: P = N/2 (the long half keeps the longest tiles first, for balance).
//   Diagonal: P = 0 (every rank predecessor ran a step earlier; a head's longest tile is claimed last, which a
//   pack's shorter sequences fill in behind).
template <bool kHalf>
struct SplitWalk : DynamicPersistentGrid {
    static constexpr const char* kName = kHalf ? "split" : "diagonal";
    static constexpr int kMask = kCausalOnly;
    struct State {};
    static const char* unsupported(SchedShape const& s) {
        if (s.window_right != 0 || removes_causal_tiles(s)) {
            return kHalf ? "split needs the causal mask (not a band)" : "diagonal needs the causal mask (not a band)";
        }
        return nullptr;
    }
    FLASH_DASH_HD static int split(SchedShape const& s) { return kHalf ? s.num_n >> 1 : 0; }
    FLASH_DASH_HD static int claimed_n(SchedShape const& s, int j) {
        int const half = split(s);
        return j < half ? j : s.num_n - 1 - (j - half);
    }
    FLASH_DASH_HD static TileCtx make_ctx(SchedShape const& s, int p) {
        TileCtx c = DynamicPersistentGrid::make_ctx(s, p);
        c.n = claimed_n(s, c.n);
        c.m_min = m_min_of(s, c.n);
        c.m_end = m_end_of(s, c.n);
        return c;
    }
    FLASH_DASH_HD static State init(SchedShape const&, TileCtx const&) { return {}; }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;
    }
    FLASH_DASH_HD static int m_block(SchedShape const& s, TileCtx const& c, State const&, int step) {
        return c.n < split(s) ? c.m_end - 1 - step : c.m_min + step;
    }
    FLASH_DASH_HD static int rank(SchedShape const& s, TileCtx const& c, State const&, int m) {
        int const half = split(s);
        return c.n < half ? c.n : half + n_end_of(s, m) - 1 - c.n;
    }
};

struct Split : SplitWalk<true> {};
struct Diagonal : SplitWalk<false> {};

// Shift (full mask only), static persistent grid. Per (head, round) group: R = running, F = finished,
// slot k = n - F. If R <= M the tile visits m = (k + i) mod M, i = 0..M-1, with
//   rank = F + ((min(m, R-1) - k) mod R);
// otherwise (R > M: more tiles of the head in flight than Q tiles) the group runs the descending
// order, m = M-1-i and rank = n. State: 3 ints (k = -1 marks the fallback group).
struct Shift : StaticPersistentGrid {
    static constexpr const char* kName = "shift";
    static constexpr int kMask = kFullOnly;
    struct State {
        int k;         // slot in [0, R); -1: this (head, round) group falls back to descending
        int running;   // R
        int finished;  // F
    };
    FLASH_DASH_HD static State init(SchedShape const& s, TileCtx const& c) {
        WaveInfo const w = wave_info(s, c);
        State st;
        st.k = w.running > s.num_m ? -1 : w.slot;
        st.running = w.running;
        st.finished = w.finished;
        return st;
    }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;  // full mask: M
    }
    FLASH_DASH_HD static int m_block(SchedShape const&, TileCtx const& c, State const& st, int step) {
        // k < R <= M and step < M: (k + step) mod M needs one conditional subtraction.
        int const m = st.k + step;
        return st.k < 0 ? c.m_end - 1 - step : (m >= c.m_end ? m - c.m_end : m);
    }
    FLASH_DASH_HD static int rank(SchedShape const&, TileCtx const& c, State const& st, int m) {
        if (st.k < 0) return c.n;
        int const top = st.running - 1;
        int const mm = m < top ? m : top;
        return st.finished + wrap_once(mm - st.k, st.running);  // mm - k in (-R, R)
    }
};

// SymmetricShift (causal only; sq == sk, kBlockN == kS * kBlockM, N even: the host falls back to
// Descending otherwise, exactly like the model). Pair grid: P = N/2 pairs per (b, h); chunk
// c = q*P + p pairs the long tile p with the short tile N-1-p. G = min(num_sms, B*H*P); CTA g runs
// chunks g, g+G, ..., each chunk long tile first. Unit u = 2*c + stage (stage 0 long, 1 short),
// so the units cover [0, B*H*N) and next_tile is u+1 within a chunk, u + 2G - 1 to the next chunk.
// Waves on chunks: R, F, k per (head, round) group. Rs = (F + R - 1)*kS, L = M - Rs:
//  * long n = F+k: L steps m = Rs + ((k+i) mod L), then the triangle m = n*kS .. Rs-1 ascending;
//    rank E(m) + ((min(m - Rs, R-1) - k) mod R) in the rectangle, E(m) + (m/kS - n) in the triangle;
//  * short n' = N-1-F-k: m = M-1 down to n'*kS; rank E(m) + R + (R-1-k);
//  * E(m) = F + max(0, m/kS + 1 - N + F).
// k < L always holds (M > (N-1)kS, F+R <= N/2), so (k+i) mod L is one conditional subtraction.
template <int kS>
struct SymmetricShift {
    static_assert(kS >= 1, "block_n must be a positive multiple of block_m");
    static constexpr const char* kName = "symmetric_shift";
    static constexpr int kMask = kCausalOnly;
    static constexpr bool kPairGrid = true;
    static constexpr bool kDynamic = false;
    struct State {
        int k;         // slot of the pair in its (head, round) group
        int running;   // R (pairs)
        int finished;  // F (pairs)
        int rs;        // long tile: first rectangle row Rs; short tile: -1
    };
    FLASH_DASH_HD static int first_tile(SchedShape const&, int cta) { return 2 * cta; }
    FLASH_DASH_HD static int next_tile(SchedShape const& s, int u) { return (u & 1) ? u + 2 * s.grid - 1 : u + 1; }
    // The model falls back to descending on these shapes (orders.py symmetric_shift_fallback); kBlockN == kS *
    // kBlockM is the instantiation's own compile-time condition.
    static const char* unsupported(SchedShape const& s) {
        if (s.seqlen_q != s.seqlen_k) return "symmetric_shift needs seqlen_q == seqlen_k";
        if (s.num_n % 2 != 0) return "symmetric_shift needs an even number of K/V tiles";
        if (s.block_n != kS * s.block_m) return "symmetric_shift: block_n must be its pair step times block_m";
        if (s.window_right != 0) return "symmetric_shift needs the causal mask (window right side 0)";
        if (removes_causal_tiles(s)) return "symmetric_shift: the window removes tiles of the causal triangle";
        return nullptr;
    }
    FLASH_DASH_HD static TileCtx make_ctx(SchedShape const& s, int u) {
        int const pairs = s.num_n >> 1;
        int const chunk = u >> 1;
        int const q = chunk / pairs;
        int const p = chunk - q * pairs;
        TileCtx c;
        c.t = u;
        c.n = (u & 1) ? s.num_n - 1 - p : p;
        c.h = slot_head(s, q % s.heads);
        c.b = q / s.heads;
        c.m_min = c.n * kS;  // == m_min_of(s, n) when sq == sk
        c.m_end = s.num_m;
        return c;
    }
    FLASH_DASH_HD static State init(SchedShape const& s, TileCtx const& c) {
        bool const is_short = (c.t & 1) != 0;
        int const p = is_short ? s.num_n - 1 - c.n : c.n;
        WaveInfo const w = wave_of(c.t >> 1, p, s.num_n >> 1, s.grid);
        State st;
        st.k = w.slot;
        st.running = w.running;
        st.finished = w.finished;
        st.rs = is_short ? -1 : (w.finished + w.running - 1) * kS;
        return st;
    }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;
    }
    FLASH_DASH_HD static int m_block(SchedShape const&, TileCtx const& c, State const& st, int step) {
        if (st.rs < 0) return c.m_end - 1 - step;          // short tile: descending
        int const len = c.m_end - st.rs;                   // L
        if (step < len) {                                  // rectangle, cyclic from Rs + k
            int const m = st.rs + st.k + step;
            return m >= c.m_end ? m - len : m;
        }
        return c.m_min + (step - len);                     // triangle, ascending
    }
    FLASH_DASH_HD static int rank(SchedShape const& s, TileCtx const& c, State const& st, int m) {
        int const mq = m / kS;                             // K/V tile index of row m's diagonal
        int const late = mq + 1 - s.num_n + st.finished;   // earlier rounds' short tiles reaching m
        int const e = st.finished + (late > 0 ? late : 0); // E(m)
        if (st.rs < 0) return e + 2 * st.running - 1 - st.k;
        if (m < st.rs) return e + mq - c.n;                // triangle
        int const top = st.running - 1;
        int const d = m - st.rs;
        return e + wrap_once((d < top ? d : top) - st.k, st.running);
    }
};

// The kernel's 32-bit unit arithmetic needs B*H*N + 2*G < 2^31.
inline bool tile_count_fits(int64_t num_tiles, int grid) {
    return num_tiles + 2 * int64_t(grid) < (int64_t(1) << 31);
}

}  // namespace bwd
}  // namespace flash_dash
