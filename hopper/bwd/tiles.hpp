// The backward's tiles as every role reads them: on a dense call's grid (the policy decodes tile t over (b, h, n),
// every tile walks params.sched) or, in the varlen kernels, from the pack's tile table (common/varlen.hpp): tile t is
// key block n of head h of sequence c.b, walked on that sequence's own grid (its lengths, tiles and mask), so its
// Q-tile order and dQ ranks are the ones the sequence has alone. The varlen kernels run the dynamic-grid policies
// (claims in table order: a sequence's key-block claim positions within groups of heads, common/varlen.hpp
// kVarlenKeyClaims, each position the policy's K/V tile (claimed_n), so a rank predecessor and a GQA sibling
// predecessor (same n, head h - 1) come earlier, as the deadlock-freedom argument of policies.hpp needs).
// GqaFold varlen kernels: a folded sequence's tiles are (key block, K/V head) on its folded grid, the others' (key
// block, query head) as in the unfolded kernels (VarlenSeq::folded, decided by the prepare CTA).
#pragma once
#include <cute/tensor.hpp>

#include "common/varlen.hpp"
#include "schedule/policies.hpp"
#include "schedule/sibling_walk.hpp"

namespace flash_dash {
namespace bwd {

template <bool Varlen, bool GqaFold = false>
struct BwdTiles {
    // The sibling walk of the kernel's parameters (params.sched: the folded grid in dense folded kernels, every query
    // head in a pack's) and of a tile of sequence `seq` (dense: the kernel's).
    CUTLASS_DEVICE static SiblingWalk<GqaFold> grid_siblings(int group) { return {group, GqaFold && !Varlen}; }
    CUTLASS_DEVICE static SiblingWalk<GqaFold> tile_siblings(int group, VarlenSeq const& seq) {
        return {group, Varlen ? GqaFold && seq.folded != 0 : GqaFold};
    }

    // Tile t's context; returns the shape its policy walks (params.sched, or `local` filled with the sequence's
    // grid), and fills `seq` with the sequence's view (varlen only).
    template <class Policy, class KP>
    CUTLASS_DEVICE static SchedShape const& at(KP const& params, int t, TileCtx& c, SchedShape& local,
                                              VarlenSeq& seq) {
        if constexpr (Varlen) {
            static_assert(Policy::kDynamic && !Policy::kPairGrid, "varlen backwards run the dynamic-grid orders");
            VarlenTile const e = params.varlen_tiles[t];
            seq = params.varlen_seqs[e.seq];
            local = params.sched;
            if (GqaFold && seq.folded) { local = folded_grid(local); }
            local.seqlen_q = seq.len_q;
            local.seqlen_k = seq.len_k;
            local.num_m = (seq.len_q + local.block_m - 1) / local.block_m;
            local.num_n = (seq.len_k + local.block_n - 1) / local.block_n;
            c.t = t;
            c.n = Policy::claimed_n(local, e.block_head / local.heads);
            c.h = e.block_head - (e.block_head / local.heads) * local.heads;
            c.b = e.seq;
            c.m_min = m_min_of(local, c.n);
            c.m_end = m_end_of(local, c.n);
            return local;
        } else {
            c = Policy::make_ctx(params.sched, t);
            return params.sched;
        }
    }

    // The tiles the grid walks.
    template <class KP>
    CUTLASS_DEVICE static int count(KP const& params) {
        if constexpr (Varlen) { return *params.varlen_num_tiles; }
        else { return params.sched.num_tiles(); }
    }

    // The (rows, d) view of head h of a (rows, d, heads, batch) TMA tensor whose row 0 is the tile's first row: batch
    // b of a dense call, or the packed row row0 (one batch of packed rows).
    template <class TensorX>
    CUTLASS_DEVICE static auto rows(TensorX const& mX, int h, int b, int row0) {
        if constexpr (Varlen) { return cute::domain_offset(cute::make_coord(row0, cute::_0{}), mX(cute::_, cute::_, h, 0)); }
        else { return mX(cute::_, cute::_, h, b); }
    }
};

}  // namespace bwd
}  // namespace flash_dash
