// Persistent tile schedulers of the forward kernel: which (m block, head, batch) tile a CTA runs next. The producer
// thread walks the CTA's tiles with next_tile (or claims them), the other roles with read_next.
//  * Full masks: CTA i takes tiles i, i + grid, ...; the m blocks of one (b, h) are neighbours, so the
//    tiles running at once share K/V in L2.
//  * Causal: longest tiles (largest m) first, within groups of head_group (b, h) pairs (the last group
//    holds the rest): a group's tiles run m-level by m-level, so the ~grid tiles in flight
//    read the K/V of ~grid/4 heads, each from L2 about 4 times (ordering every (b, h) of an m-level
//    before the next makes the tiles in flight read up to `grid` heads' K/V from HBM).
//    head_group * num_m_blocks is a multiple of grid where possible, so every round of `grid` tiles
//    lies inside one group and is sorted longest first; rounds are dealt in alternating directions,
//    so the CTA that took a round's longest tile takes the next round's shortest (a plain round robin
//    would hand CTA 0 the longest tile of every round).
//  * Varlen (FwdVarlenScheduler): the pack's tile table (common/varlen.hpp) by dynamic claims (schedule/tile_ring.hpp),
//    the next entry to the CTA that frees up first. The table's tiles cost unlike amounts (sequences' lengths, causal
//    blocks), which a static round robin over it spread unevenly (research/varlen_fwd_balance.py); claims keep every
//    CTA busy to the end. The table lists each sequence's tiles longest first on causal masks, and the tiles in
//    flight at once are a window of it: a few sequences' heads, each head's K/V read by several of them from L2.
#pragma once
#include "common/host_device.hpp"
#include "common/varlen.hpp"
#if defined(__CUDACC__)
#include "schedule/tile_ring.hpp"
#endif

namespace flash_dash {

struct FwdTile {
    int m_block, head, batch;
};

struct FwdTileScheduler {
    int num_m_blocks;
    int num_heads;
    int num_bh;      // batch * num_heads
    int total;       // num_m_blocks * num_bh
    int grid;        // CTAs launched
    int head_group;  // causal: (b, h) pairs per group
    int num_groups;  // causal: round(num_bh / head_group) >= 1; the last group holds the rest (0.5-1.5 groups)
    bool lpt;        // causal: heaviest m-blocks (largest m) first

    FLASH_DASH_HD FwdTileScheduler(int num_m_blocks_, int num_heads_, int batch, bool lpt_, int grid_)
        : num_m_blocks(num_m_blocks_), num_heads(num_heads_), num_bh(num_heads_ * batch),
          total(num_m_blocks_ * num_heads_ * batch), grid(grid_),
          head_group(head_group_of(num_m_blocks_, grid_)), lpt(lpt_) {
        int const rounded = (num_bh + head_group / 2) / head_group;
        num_groups = rounded > 1 ? rounded : 1;
    }

    // CTAs to launch for `total` tiles on `num_sms` SMs (>= 1): one per SM at most; with equal tiles (full
    // masks) the fewest that still finish in the same number of rounds (2048 tiles on 132 SMs: 128 CTAs x 16
    // instead of 68 x 16 + 64 x 15, so no CTA waits for a last partial round).
    FLASH_DASH_HD static int grid_size(int total, int num_sms, bool equal_tiles) {
        int grid = total < num_sms ? total : num_sms;
        if (grid < 1) { return 1; }
        if (equal_tiles) {
            int const rounds = (total + grid - 1) / grid;
            grid = (total + rounds - 1) / rounds;
        }
        return grid;
    }

    // The largest multiple of grid / gcd(M, grid) (the fewest heads whose M tiles fill whole rounds)
    // that is <= grid / 4, or that unit itself when it is larger.
    FLASH_DASH_HD static int head_group_of(int num_m, int grid) {
        int a = num_m, b = grid;
        while (b != 0) { int const r = a % b; a = b; b = r; }
        int const unit = grid / a;
        int const cap = grid / 4 > 0 ? grid / 4 : 1;
        return unit <= cap ? cap / unit * unit : unit;
    }

    // This CTA's tile after t (>= total: done). Causal: t sits at offset o = t % grid of its round; the
    // next round's offset is grid-1-o, i.e. t + 2*grid - 1 - 2*o (still increasing in t).
    FLASH_DASH_HD int next_tile(int t) const {
        if (lpt) { return t + 2 * grid - 1 - 2 * (t % grid); }
        return t + grid;
    }
    // The other roles' walk: the same; `k` (the tiles read before) is the varlen walk's.
    FLASH_DASH_HD int read_next(int t, int /*k*/) const { return next_tile(t); }

    FLASH_DASH_HD FwdTile decode(int t) const {
        int m, bh;
        if (lpt) {
            int const per_group = head_group * num_m_blocks;
            int g = t / per_group;
            if (g > num_groups - 1) { g = num_groups - 1; }
            int const r = t - g * per_group;
            int const size = g < num_groups - 1 ? head_group : num_bh - g * head_group;
            m = num_m_blocks - 1 - r / size;
            bh = g * head_group + r % size;
        } else {
            bh = t / num_m_blocks;
            m = t - bh * num_m_blocks;
        }
        int const b = bh / num_heads;
        return {m, bh - b * num_heads, b};
    }
};

#if defined(__CUDACC__)
// The varlen grid's claims in shared memory: the ring, and the producer's publications so far and the entry it
// claimed ahead (-1: none), there so that its loop carries no claim state (its 24-32 registers hold the loads').
struct FwdClaimStorage {
    TileRingStorage ring;
    int published;
    int ahead;
};

// The varlen grid: FwdTile::batch is the tile's sequence (an index into the prepare CTA's views). CTA g starts with
// entry g; its producer claims each next entry and publishes it in the ring, which every thread of the other roles
// (kReaders) reads (read_next), so every role of a CTA walks the same entries.
template <int kReaders>
struct FwdVarlenScheduler {
    using Ring = TileRing<kReaders>;
    VarlenTile const* tiles;
    int total;  // the table's tiles (written by the prepare CTA; the grid is sized from an upper bound)
    int heads;
    int grid;
    int* claims;  // the prepare CTA's claim counter (common/varlen.hpp)
    FwdClaimStorage* state;

    // One thread, before the CTA-wide sync.
    __device__ __forceinline__ static void init(FwdClaimStorage& s) {
        Ring::init(s.ring);
        s.published = 0;
        s.ahead = -1;
    }
    // Producer (lane 0 of its warp): the entry claim_next returns, claimed now if it is not yet; >= total: done.
    // Passed through a shuffle from lane 0, so that the compiler knows it warp-uniform and keeps the walk in uniform
    // registers, as with a static walk (an atomic's result is per thread: the producer spilled).
    __device__ __forceinline__ int peek_next() const {
        if (state->ahead < 0) { state->ahead = Ring::publish(state->ring, state->published++, claims, grid); }
        return __shfl_sync(1u, state->ahead, 0);
    }
    // Producer: the CTA's next entry.
    __device__ __forceinline__ int claim_next() const {
        int const t = peek_next();
        state->ahead = -1;
        return t;
    }
    // Every other role (whole warps): the entry after t, publication number k (0, 1, ... per CTA); warp-uniform
    // for the compiler too, as peek_next's.
    __device__ __forceinline__ int read_next(int /*t*/, int k) const {
        return __shfl_sync(0xffffffffu, Ring::consume(state->ring, k), 0);
    }

    FLASH_DASH_HD FwdTile decode(int t) const {
        VarlenTile const e = tiles[t];
        int const m = e.block_head / heads;
        return {m, e.block_head - m * heads, e.seq};
    }
};
#endif

}  // namespace flash_dash
