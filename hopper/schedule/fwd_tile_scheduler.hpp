// Static persistent tile scheduler for the forward kernel: which (m block, head, batch) tile a CTA
// runs next. The producer warp and the consumer warpgroups walk the same sequence independently.
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
//  * Varlen (FwdVarlenScheduler): the pack's tile table (common/varlen.hpp) round robin, tile t on CTA t % grid; the
//    table lists each sequence's tiles longest first on causal masks.
#pragma once
#include "common/host_device.hpp"
#include "common/varlen.hpp"

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

// The varlen grid: FwdTile::batch is the tile's sequence (an index into the prepare CTA's views).
struct FwdVarlenScheduler {
    VarlenTile const* tiles;
    int total;  // the table's tiles (written by the prepare CTA; the grid is sized from an upper bound)
    int heads;
    int grid;

    FLASH_DASH_HD int next_tile(int t) const { return t + grid; }

    FLASH_DASH_HD FwdTile decode(int t) const {
        VarlenTile const e = tiles[t];
        int const m = e.block_head / heads;
        return {m, e.block_head - m * heads, e.seq};
    }
};

}  // namespace flash_dash
