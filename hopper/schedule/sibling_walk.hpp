// GQA sibling fold: the (sibling, step) sequence of one backward tile, the same for every role of the kernel.
// A folded kernel's tile is (b, K/V head hk, n); it walks its policy's Q-tile steps once for each query head sharing
// hk (siblings s = 0 .. G-1, h = hk * G + s, G = H / Hk) and keeps dK/dV in registers over all of them. The policies
// walk the folded grid (`folded_grid`: Hk heads, so TileCtx::h is hk), and each sibling's steps take the ranks the
// policy gives (n, m): ranks do not depend on the head (policies.hpp has the deadlock-freedom argument).
// Unfolded kernels (kFold false) run each tile for its one query head, as before. Plain C++: the mirror test walks it
// on the CPU.
#pragma once
#include "common/host_device.hpp"
#include "schedule/policies.hpp"

namespace flash_dash {
namespace bwd {

template <bool kFold>
struct SiblingWalk {
    int group;  // G = H / Hk (1 without GQA)

    // Query heads H, from the shape the policies walk (the folded grid has Hk).
    FLASH_DASH_HD int query_heads(SchedShape const& s) const { return kFold ? s.heads * group : s.heads; }
    // The K/V head of tile c.
    FLASH_DASH_HD int kv_head(TileCtx const& c) const { return kFold ? c.h : c.h / group; }

    // Calls body(h, step) for every step of tile c (`steps` from the policy) and every sibling head h in walk order,
    // in one flat loop (a loop over the siblings around the step loop made ptxas spill, 12 -> 68 B in the MMA
    // warpgroups at hdim 64). kRolled: keep the loop rolled (#pragma unroll 1; the producer and dQ-store warps, whose
    // 24 registers spill when it unrolls); otherwise the compiler's choice (the MMA warpgroups, which ignore h).
    template <bool kRolled, class Body>
    FLASH_DASH_HD void for_each_step(TileCtx const& c, int steps, Body&& body) const {
        if constexpr (kFold) {
            int h = c.h * group, step = 0;
            if constexpr (kRolled) {
#if defined(__CUDA_ARCH__)
                #pragma unroll 1
#endif
                for (int left = group * steps; left > 0; --left) {
                    body(h, step);
                    if (++step == steps) { step = 0; ++h; }
                }
            } else {
                for (int left = group * steps; left > 0; --left) {
                    body(h, step);
                    if (++step == steps) { step = 0; ++h; }
                }
            }
        } else if constexpr (kRolled) {
#if defined(__CUDA_ARCH__)
            #pragma unroll 1
#endif
            for (int step = 0; step < steps; ++step) { body(c.h, step); }
        } else {
            for (int step = 0; step < steps; ++step) { body(c.h, step); }
        }
    }
};

// The shape a folded kernel's policies walk: one head of the grid per K/V head (and slot_head the identity).
FLASH_DASH_HD SchedShape folded_grid(SchedShape s) {
    s.heads = s.heads_k;
    return s;
}

}  // namespace bwd
}  // namespace flash_dash
