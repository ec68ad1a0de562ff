// Forward epilogue: LSE straight from registers, O through swizzled smem (stmatrix) + TMA store.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "common/utils.hpp"
#include "fwd/barriers.hpp"
#include "fwd/o_handoff.hpp"
#include "fwd/traits.h"
#include "schedule/fwd_tile_scheduler.hpp"

namespace flash_dash {

// kVarlen: tiles of packed sequences (Traits::Seq), whose O blocks may straddle their sequence's ends.
template <class Traits, bool kVarlen>
struct FwdEpilogueSm90 {
    using Element = typename Traits::Element;
    using Params = typename Traits::Params;
    using SharedStorage = typename Traits::SharedStorage;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kHeadDimV = Traits::kHeadDimV;  // O's columns
    // Staged O is written and stored in one row block per consumer WG, by that WG's threads.
    static constexpr int kPartThreads = 128;
    using Seq = typename Traits::template Seq<kVarlen>;
    // Whether rows [row, row + n) meet [0, seqlen_q) of the sequence (rows < 0 exist in the first tile of a causal
    // call).
    CUTE_DEVICE static bool in_rows(Seq const& seq, int row, int n = 1) { return row < seq.seqlen_q() && row + n > 0; }

    // rO: normalised O fragment of the PV TiledMMA, already in the output type; lse: per owned row
    // (natural log). Rows outside the sequence are not written (lse: predicate; O: the TMA store clips the box at
    // the tensor's end; a packed sequence's block that straddles its ends is copied row by row, by a warp of the
    // producer warpgroup where OHandoff::kUsed, else by the part's threads).
    template <class TensorO, int kNRows>
    CUTE_DEVICE static void store(Params const& p, SharedStorage& ss, TensorO const& rO,
                                  float const (&lse)[kNRows], FwdTile const& tile, Seq const& seq, int tid) {
        using namespace cute;
        typename Traits::TiledMmaPV mma_pv;
        auto thr_pv = mma_pv.get_thread_slice(tid);

        // LSE: the 4 lanes of a quad hold the same rows after the quad reduction; lane 0 writes.
        Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{});
        Tensor tOcO = thr_pv.partition_C(cO);
        Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
        static_assert(decltype(size<0>(tOcO_rc))::value == kNRows);
        if (tid % 4 == 0) {
            float* lse_ptr = p.lse + (int64_t(seq.batch()) * p.num_heads + tile.head) * int64_t(p.seqlen_q) + seq.q_start();
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kNRows; ++r) {
                int const row = Traits::first_row(seq, tile.m_block) + int(get<0>(tOcO_rc(r, 0)));
                if (in_rows(seq, row)) { lse_ptr[row] = lse[r]; }
            }
        }

        if constexpr (!Traits::kStagedO) {
            // Straight from registers: columns (c, c+1) of a row are adjacent in the fragment and in
            // memory (c even), so each thread writes 4-byte pairs. Rows outside the sequence are skipped.
            Tensor rO_rc = make_rowcol_view(rO);
            Element* base = p.o_ptr + int64_t(seq.batch()) * p.o_batch_stride + int64_t(tile.head) * p.o_head_stride +
                            int64_t(seq.q_start()) * p.o_row_stride;
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kNRows; ++r) {
                int const row = Traits::first_row(seq, tile.m_block) + int(get<0>(tOcO_rc(r, 0)));
                if (in_rows(seq, row)) {
                    Element* dst_row = base + int64_t(row) * p.o_row_stride;
                    CUTLASS_PRAGMA_UNROLL
                    for (int c = 0; c < size<1>(rO_rc); c += 2) {
                        int const col = int(get<1>(tOcO_rc(r, c)));
                        cutlass::Array<Element, 2> pair;
                        pair[0] = rO_rc(r, c);
                        pair[1] = rO_rc(r, c + 1);
                        *reinterpret_cast<cutlass::Array<Element, 2>*>(dst_row + col) = pair;
                    }
                }
            }
        } else {
            // This WG's block (`part`) of the O tile: its threads wait until their previous TMA store has
            // read the block, write it (stmatrix), fence the generic-proxy writes for the async proxy,
            // and one of them stores it.
            int const part = tid / kPartThreads;
            int const t = tid % kPartThreads;
            auto const bar_id = uint32_t(FwdNamedBarrier::kEpilogueWG0) + uint32_t(part);
            // Varlen with copy warps: the part's copy warp reads the staged block too (fwd/o_handoff.hpp).
            constexpr bool kCopyWarps = kVarlen && OHandoff<Traits>::kUsed;
            Tensor sO = make_tensor(make_smem_ptr(ss.smem_o.data()), typename Traits::SmemLayoutO{})(_, _, part);

            if (t == 0) {
                tma_store_wait<0>();
                if constexpr (kCopyWarps) { OHandoff<Traits>::wait_free(ss.o_handoff, part); }
            }
            named_barrier_sync(kPartThreads, bar_id);

            auto smem_copy_O = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaO{});
            auto smem_thr_copy_O = smem_copy_O.get_thread_slice(t);
            Tensor taccOrO = smem_thr_copy_O.retile_S(rO);
            Tensor taccOsO = smem_thr_copy_O.partition_D(as_position_independent_swizzle_tensor(sO));
            copy(smem_copy_O, taccOrO, taccOsO);
            cutlass::arch::fence_view_async_shared();
            named_barrier_sync(kPartThreads, bar_id);
            if constexpr (kCopyWarps) {
                if (t == 0) { OHandoff<Traits>::signal_staged(ss.o_handoff, part); }
            }

            // A block wholly outside [0, seqlen_q) is not stored; one that straddles a packed sequence's ends is the
            // copy warp's, or copied here by the part's threads.
            if constexpr (kVarlen) {
                int const block_row = Traits::first_row(seq, tile.m_block) + part * Traits::kORows;
                if (OHandoff<Traits>::straddles(block_row, seq.seqlen_q())) {
                    if constexpr (!kCopyWarps) {
                        // The part's threads read what its barrier made visible; the next tile's first barrier keeps
                        // their writes to the staging buffer behind these reads.
                        OHandoff<Traits>::template copy_rows<kPartThreads>(
                            sO, p.o_ptr + int64_t(tile.head) * p.o_head_stride + int64_t(seq.q_start()) * p.o_row_stride,
                            p.o_row_stride, block_row, seq.seqlen_q(), t);
                    }
                    return;
                }
            }
            if (t == 0 && in_rows(seq, Traits::first_row(seq, tile.m_block) + part * Traits::kORows, Traits::kORows)) {
                Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.seqlen_q, int(kHeadDimV), p.num_heads, p.batch));
                Tensor gO = local_tile(Traits::rows_from_first_block(seq, mO(_, _, tile.head, seq.batch())),
                                       Shape<Int<Traits::kORows>, Int<kHeadDimV>>{},
                                       make_coord(tile.m_block * Traits::kOParts + part, _0{}));
                auto [tOgO, tOsO] = tma_partition(p.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                                  group_modes<0, 2>(gO));
                copy(p.tma_o, tOsO, tOgO);
                tma_store_arrive();
            }
        }
    }

    // Before the CTA exits: the outstanding store must have read smem (the issuing thread of each part).
    CUTE_DEVICE static void finish(int tid) {
        if constexpr (Traits::kStagedO) {
            if (tid % kPartThreads == 0) { cute::tma_store_wait<0>(); }
        }
    }
};

}  // namespace flash_dash
