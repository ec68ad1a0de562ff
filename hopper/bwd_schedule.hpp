// Backward schedule policies: which K/V tiles a CTA processes, in which order a K/V tile visits
// its Q tiles, and the rank (position in the deterministic dQ accumulation order) of every
// (n, m) contribution. One policy = one compile-time template parameter of the backward kernel.
//
// Contract shared with flash_attn_dash/schedule (Python model; a GPU test compares the two):
//  * M = ceil(sq / kBlockM), N = ceil(sk / kBlockN); causal is aligned bottom-right: query row i
//    sees key j iff j <= i + (sk - sq).
//  * K/V tile n is visited by the Q tiles m in [m_min(n), M), with
//      m_min(n) = max(0, floor((n*kBlockN - (sk - sq)) / kBlockM))   (floor, also for negatives)
//    for causal and m_min = 0 for full masks.
//  * Static persistent grid: linear tile t in [0, B*H*N), n = t % N, h = (t / N) % H,
//    b = t / (N*H). G = min(num_sms, B*H*N) CTAs; CTA g processes t = g, g+G, g+2G, ...
//  * Ascending walks m = m_min .. M-1, Descending walks m = M-1 .. m_min.
//  * rank(n, m) = #{ n' < n : tile n' touches m }.
//    Proof that this equals n for the full and causal masks: m_min(n') is non-decreasing in n'
//    (floor of a non-decreasing argument), so if n touches m (m_min(n) <= m < M) then every
//    n' < n has m_min(n') <= m_min(n) <= m and touches m too. Hence the count is exactly n, and the
//    ranks of one Q tile m are {0 .. K_m - 1} with no gaps or duplicates.
//  Deadlock freedom (rank = n, any m order): contribution (n, m) waits only for (n-1, m), which
//  belongs to a tile with a smaller linear index. All G CTAs are resident (1 CTA/SM, G <= #SMs),
//  each CTA processes its tiles in increasing t, so the unfinished tile with the smallest t never
//  waits on anything unfinished: the system always makes progress.
//
// Adding a policy (e.g. Shift / SymmetricShift): derive from StaticPersistentGrid (or provide the
// same static members) and implement State init(ctx), num_steps, m_block(step), rank(m). The
// TileCtx gives the linear tile index, grid size and the problem shape, and wave_info() derives the
// persistent round of the tile and how many tiles of the same (b, h) run in that round.
#pragma once
#include <cstdint>

#ifndef FLASH_DASH_HD
#if defined(__CUDACC__)
#define FLASH_DASH_HD __host__ __device__ __forceinline__
#else
#define FLASH_DASH_HD inline
#endif
#endif

namespace flash_dash {
namespace bwd {

// Problem shape as the schedule sees it (all 32-bit; products that can exceed 2^31 use int64).
struct SchedShape {
    int batch, heads, heads_k;   // B, H (query heads), Hk
    int seqlen_q, seqlen_k;      // sq, sk
    int block_m, block_n;        // kBlockM, kBlockN
    int num_m, num_n;            // M, N
    int grid;                    // G (persistent CTAs)
    bool causal;
    FLASH_DASH_HD int num_tiles() const { return batch * heads * num_n; }
};

FLASH_DASH_HD int floor_div(int a, int b) {  // b > 0
    int q = a / b;
    return (q * b > a) ? q - 1 : q;
}

// First Q tile that K/V tile n touches (M if none).
FLASH_DASH_HD int m_min_of(SchedShape const& s, int n) {
    if (!s.causal) return 0;
    int v = floor_div(n * s.block_n - (s.seqlen_k - s.seqlen_q), s.block_m);
    v = v < 0 ? 0 : v;
    return v > s.num_m ? s.num_m : v;
}

// Everything a policy may need about one K/V tile.
struct TileCtx {
    int t;          // linear tile index
    int n, h, b;    // decoded coordinates
    int m_min, m_end;  // visited Q tiles: [m_min, m_end)
};

// Wave (persistent round) information of a tile, for shift-type schedules.
struct WaveInfo {
    int round;      // t / G
    int running;    // R: tiles of the same (b, h) processed in this round
    int finished;   // F: tiles of the same (b, h) processed in earlier rounds
    int slot;       // k = n - F, in [0, R)
};

FLASH_DASH_HD WaveInfo wave_info(SchedShape const& s, TileCtx const& c) {
    WaveInfo w;
    w.round = c.t / s.grid;
    int const wave_start = w.round * s.grid;
    int const wave_end = wave_start + s.grid;              // exclusive
    int const head_start = c.t - c.n;                      // linear index of (b, h, n=0)
    int const head_end = head_start + s.num_n;             // exclusive
    int const lo = wave_start > head_start ? wave_start : head_start;
    int const hi = wave_end < head_end ? wave_end : head_end;
    w.running = hi - lo;
    w.finished = lo - head_start;
    w.slot = c.n - w.finished;
    return w;
}

// CTA -> tile assignment of the static persistent grid. Shared by the shipped policies.
struct StaticPersistentGrid {
    FLASH_DASH_HD static int first_tile(SchedShape const&, int cta) { return cta; }
    FLASH_DASH_HD static int next_tile(SchedShape const& s, int t) { return t + s.grid; }
    FLASH_DASH_HD static TileCtx make_ctx(SchedShape const& s, int t) {
        TileCtx c;
        c.t = t;
        c.n = t % s.num_n;
        int const bh = t / s.num_n;
        c.h = bh % s.heads;
        c.b = bh / s.heads;
        c.m_min = m_min_of(s, c.n);
        c.m_end = s.num_m;
        return c;
    }
    // General rank formula: number of n' < n whose tile touches m. For the full and causal masks it
    // is exactly n (see the proof at the top of this file), which is what the kernel uses.
    FLASH_DASH_HD static int rank_naive(SchedShape const&, TileCtx const& c, int /*m*/) { return c.n; }
};

struct Ascending : StaticPersistentGrid {
    static constexpr const char* kName = "ascending";
    struct State {};
    FLASH_DASH_HD static State init(SchedShape const&, TileCtx const&) { return {}; }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;
    }
    FLASH_DASH_HD static int m_block(SchedShape const&, TileCtx const& c, State const&, int step) {
        return c.m_min + step;
    }
    FLASH_DASH_HD static int rank(SchedShape const& s, TileCtx const& c, State const&, int m) {
        return rank_naive(s, c, m);
    }
};

struct Descending : StaticPersistentGrid {
    static constexpr const char* kName = "descending";
    struct State {};
    FLASH_DASH_HD static State init(SchedShape const&, TileCtx const&) { return {}; }
    FLASH_DASH_HD static int num_steps(SchedShape const&, TileCtx const& c, State const&) {
        return c.m_end > c.m_min ? c.m_end - c.m_min : 0;
    }
    FLASH_DASH_HD static int m_block(SchedShape const&, TileCtx const& c, State const&, int step) {
        return c.m_end - 1 - step;
    }
    FLASH_DASH_HD static int rank(SchedShape const& s, TileCtx const& c, State const&, int m) {
        return rank_naive(s, c, m);
    }
};

}  // namespace bwd
}  // namespace flash_dash
