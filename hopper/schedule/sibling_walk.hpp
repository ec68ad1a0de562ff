// GQA sibling fold: the (sibling, step) sequence of one backward tile, the same for every role of the kernel.
// A folded kernel's tile is (b, K/V head hk, n); it walks its policy's Q-tile steps once for each query head sharing
// hk (siblings s = 0 .. G-1, h = hk * G + s, G = H / Hk) and keeps dK/dV in registers over all of them. The policies
// walk the folded grid (`folded_grid`: Hk heads, so TileCtx::h is hk), and each sibling's steps take the ranks the
// policy gives (n, m): ranks do not depend on the head (policies.hpp has the deadlock-freedom argument).
// Unfolded kernels (kFold false) run each tile for its one query head, as before. In the folded varlen kernels each
// tile folds or not as its sequence does (`folds`, VarlenSeq::folded): an unfolded tile of such a kernel walks its
// one query head like an unfolded kernel's. Plain C++: the mirror test walks it on the CPU.
#pragma once
#include "common/host_device.hpp"
#include "schedule/policies.hpp"

namespace flash_dash {
namespace bwd {

template <bool kFold>
struct SiblingWalk {
    int group;           // G = H / Hk (1 without GQA)
    bool folds = kFold;  // this tile (or grid) walks the siblings: never in unfolded kernels

    FLASH_DASH_HD bool folded() const { return kFold && folds; }
    // Query heads H, from the shape the policies walk (the folded grid has Hk).
    FLASH_DASH_HD int query_heads(SchedShape const& s) const { return folded() ? s.heads * group : s.heads; }
    // The K/V head of tile c.
    FLASH_DASH_HD int kv_head(TileCtx const& c) const { return folded() ? c.h : c.h / group; }

    // Calls body(head(h), step) for every step of tile c (`steps` from the policy) and every sibling head h in walk
    // order; head(h) builds what a role needs per query head (its tensors and pointers). Folded: one flat loop that
    // rebuilds it per step (a loop over the siblings around the step loop made ptxas spill: 12 -> 32 B in the
    // producer at hdim 64). Unfolded: head(c.h) once, then the step loop, as before. Not unrolled: the producer and
    // dQ-store warps that walk it spill their 24 registers (hdim 64) when it unrolls.
    template <class Head, class Body>
    FLASH_DASH_HD void for_each_step(TileCtx const& c, int steps, Head&& head, Body&& body) const {
        if constexpr (kFold) {
            int h = folded() ? c.h * group : c.h, step = 0;
#if defined(__CUDA_ARCH__)
            #pragma unroll 1
#endif
            for (int left = num_steps(steps); left > 0; --left) {
                body(head(h), step);
                if (++step == steps) { step = 0; ++h; }
            }
        } else {
            auto const per_head = head(c.h);
#if defined(__CUDA_ARCH__)
            #pragma unroll 1
#endif
            for (int step = 0; step < steps; ++step) { body(per_head, step); }
        }
    }

    // The same sequence for a role that needs no head (the MMA warpgroups), as a plain loop k = 0 .. num_steps(steps)
    // - 1 whose step is cursor.step(k), advanced at the end of each iteration: k itself unfolded, k mod steps folded
    // (the step loop inside for_each_step's lambda made ptxas spill in the MMA warpgroups at hdim 128; a loop over
    // the siblings around it, 12 -> 68 B at hdim 64).
    FLASH_DASH_HD int num_steps(int steps) const { return folded() ? group * steps : steps; }
    struct Cursor {
        int wrap = 0;
        FLASH_DASH_HD int step(int k) const { return kFold ? wrap : k; }
        FLASH_DASH_HD void advance(int steps) {
            if constexpr (kFold) { wrap = wrap + 1 == steps ? 0 : wrap + 1; }
        }
    };
};

// The shape a folded kernel's policies walk: one head of the grid per K/V head (and slot_head the identity).
FLASH_DASH_HD SchedShape folded_grid(SchedShape s) {
    s.heads = s.heads_k;
    return s;
}

}  // namespace bwd
}  // namespace flash_dash
