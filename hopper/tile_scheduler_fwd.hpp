// Static persistent tile scheduler for the forward kernel. Full masks: CTA i takes tiles i, i + grid, ...
// Causal (longest tiles first): rounds of `grid` tiles are dealt in alternating directions, so the CTA
// that took a round's longest tile takes the next round's shortest (plain round-robin hands CTA 0 the
// longest tile of every round: +6-11% at hdim 128 causal 4k-16k on the H200,
// benchmarks/results/2026-11-30-session4-gpu-tests-419a1ea.txt).
// The producer warp and the consumer warpgroups walk the same sequence independently.
#pragma once
#include <cute/config.hpp>

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

    // This CTA's tile after t (>= total: done). Causal: t sits at offset o = t % grid of its round; the
    // next round's offset is grid-1-o, i.e. t + 2*grid - 1 - 2*o (still increasing in t).
    CUTE_DEVICE int next_tile(int t) const {
        int const grid = int(gridDim.x);
        if (lpt) { return t + 2 * grid - 1 - 2 * (t % grid); }
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
