// Forward epilogue: LSE straight from registers, O through swizzled smem (stmatrix) + TMA store.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "kernel_traits_fwd.h"
#include "named_barrier.hpp"
#include "tile_scheduler_fwd.hpp"
#include "utils.hpp"

namespace flash_dash {

template <class Traits>
struct FwdEpilogueSm90 {
    using Element = typename Traits::Element;
    using Params = typename Traits::Params;
    using SharedStorage = typename Traits::SharedStorage;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kHeadDim = Traits::kHeadDim;
    static constexpr int kNumMmaThreads = Traits::kNumMmaThreads;

    // tOrO: normalised fp32 O fragment of the PV TiledMMA; lse: per owned row (natural log).
    // Rows >= seqlen_q are not written (lse: predicate; O: the TMA store clips the box).
    template <class TensorO, int kNRows>
    CUTE_DEVICE static void store(Params const& p, SharedStorage& ss, TensorO const& tOrO,
                                  float const (&lse)[kNRows], FwdTile const& tile, int tid) {
        using namespace cute;
        typename Traits::TiledMmaPV mma_pv;
        auto thr_pv = mma_pv.get_thread_slice(tid);

        // LSE: the 4 lanes of a quad hold the same rows after the quad reduction; lane 0 writes.
        Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
        Tensor tOcO = thr_pv.partition_C(cO);
        Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
        static_assert(decltype(size<0>(tOcO_rc))::value == kNRows);
        if (tid % 4 == 0) {
            float* lse_ptr = p.lse + (int64_t(tile.batch) * p.num_heads + tile.head) * int64_t(p.seqlen_q);
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kNRows; ++r) {
                int const row = tile.m_block * kBlockM + int(get<0>(tOcO_rc(r, 0)));
                if (row < p.seqlen_q) { lse_ptr[row] = lse[r]; }
            }
        }

        Tensor rO = make_tensor_like<Element>(tOrO);
        convert_fragment(tOrO, rO);
        if constexpr (!Traits::kStagedO) {
            // Straight from registers: columns (c, c+1) of a row are adjacent in the fragment and in
            // memory (c even), so each thread writes 4-byte pairs. Rows >= seqlen_q are skipped.
            Tensor rO_rc = make_rowcol_view(rO);
            Element* base = p.o_ptr + int64_t(tile.batch) * p.o_batch_stride + int64_t(tile.head) * p.o_head_stride;
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kNRows; ++r) {
                int const row = tile.m_block * kBlockM + int(get<0>(tOcO_rc(r, 0)));
                if (row < p.seqlen_q) {
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
        } else if constexpr (Traits::kWgEpilogue) {
            // Each consumer WG stages and stores its own 64 rows; WG c's thread 0 issues the store.
            int const wg = tid / 128, t = tid % 128;
            auto const barrier = uint32_t(FwdNamedBarrier::kEpilogueWG0) + uint32_t(wg);
            Tensor sO = make_tensor(make_smem_ptr(ss.smem_o.data()), typename Traits::SmemLayoutO{})(_, _, wg);
            if (t == 0) { tma_store_wait<0>(); }  // this WG's previous store has read its slice
            named_barrier_sync(128, barrier);
            auto smem_copy_O = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaPVOneWG{});
            auto smem_thr_copy_O = smem_copy_O.get_thread_slice(t);
            copy(smem_copy_O, smem_thr_copy_O.retile_S(rO), smem_thr_copy_O.partition_D(as_position_independent_swizzle_tensor(sO)));
            cutlass::arch::fence_view_async_shared();
            named_barrier_sync(128, barrier);
            int const row0 = tile.m_block * kBlockM + 64 * wg;
            if (t == 0 && row0 < p.seqlen_q) {
                Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.seqlen_q, int(kHeadDim), p.num_heads, p.batch));
                Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<_64, Int<kHeadDim>>{},
                                       make_coord(tile.m_block * Traits::kNumMmaWarpGroups + wg, _0{}));
                auto [tOgO, tOsO] = tma_partition(p.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                                  group_modes<0, 2>(gO));
                copy(p.tma_o, tOsO, tOgO);
                tma_store_arrive();
            }
        } else {
            Tensor sO = make_tensor(make_smem_ptr(ss.smem_o.data()), typename Traits::SmemLayoutO{});

            // The previous tile's TMA store must have finished reading sO (the issuing thread waits).
            if (tid == 0) { tma_store_wait<0>(); }
            named_barrier_sync(kNumMmaThreads, FwdNamedBarrier::kEpilogueSmemFree);

            auto smem_copy_O = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
            auto smem_thr_copy_O = smem_copy_O.get_thread_slice(tid);
            Tensor taccOrO = smem_thr_copy_O.retile_S(rO);
            Tensor taccOsO = smem_thr_copy_O.partition_D(as_position_independent_swizzle_tensor(sO));
            copy(smem_copy_O, taccOrO, taccOsO);
            cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> async-proxy (TMA) reads
            named_barrier_sync(kNumMmaThreads, FwdNamedBarrier::kEpilogueSmemReady);

            if (tid == 0) {
                Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.seqlen_q, int(kHeadDim), p.num_heads, p.batch));
                Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                                       make_coord(tile.m_block, _0{}));
                auto [tOgO, tOsO] = tma_partition(p.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                                  group_modes<0, 2>(gO));
                copy(p.tma_o, tOsO, tOgO);
                tma_store_arrive();
            }
        }
    }

    // Before the CTA exits: the outstanding store must have read smem (one issuing thread per WG with
    // kWgEpilogue, else thread 0).
    CUTE_DEVICE static void finish(int tid) {
        if constexpr (Traits::kStagedO) {
            if ((Traits::kWgEpilogue ? tid % 128 : tid) == 0) { cute::tma_store_wait<0>(); }
        }
    }
};

}  // namespace flash_dash
