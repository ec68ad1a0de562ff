// Static persistent tile scheduler for the forward kernel: CTA i takes tiles i, i + grid, ...
// The producer warp and the consumer warpgroups walk the same sequence independently.
#pragma once
#include <cute/config.hpp>

// Variant knob (default 0): causal rounds alternate direction (odd rounds j*grid + grid-1-i), so the CTA
// that took a round's longest tile takes the next round's shortest. Plain round-robin hands CTA 0 the
// longest tile of every LPT round; its excess accumulates over the rounds.
#ifndef FLASH_DASH_FWD_SNAKE
#define FLASH_DASH_FWD_SNAKE 0
#endif

namespace flash_dash {

struct FwdTile {
    int m_block, head, batch;
};

struct FwdTileScheduler {
    int num_m_blocks;
    int num_heads;
    int num_bh;  // batch * num_heads
    int total;   // num_m_blocks * num_bh
    bool lpt;    // causal: heaviest m-blocks (largest m) first

    CUTE_HOST_DEVICE FwdTileScheduler(int num_m_blocks_, int num_heads_, int batch, bool lpt_)
        : num_m_blocks(num_m_blocks_), num_heads(num_heads_), num_bh(num_heads_ * batch),
          total(num_m_blocks_ * num_heads_ * batch), lpt(lpt_) {}

    // This CTA's tile after t (>= total: done). Round-robin: t + grid. Snake: t sits at offset
    // o = t % grid of its round; the next round's offset is grid-1-o, i.e. t + 2*grid - 1 - 2*o
    // (still increasing in t).
    CUTE_DEVICE int next_tile(int t) const {
        int const grid = int(gridDim.x);
        if (FLASH_DASH_FWD_SNAKE && lpt) { return t + 2 * grid - 1 - 2 * (t % grid); }
        return t + grid;
    }

    CUTE_DEVICE FwdTile decode(int t) const {
        int m, bh;
        if (lpt) {
            // Wave order: every (b, h) at the last m-block, then the one before, ...
            m = num_m_blocks - 1 - t / num_bh;
            bh = t - (t / num_bh) * num_bh;
        } else {
            // All m-blocks of one (b, h) are neighbours: they share K/V in L2.
            bh = t / num_m_blocks;
            m = t - bh * num_m_blocks;
        }
        int const b = bh / num_heads;
        return {m, bh - b * num_heads, b};
    }
};

}  // namespace flash_dash
