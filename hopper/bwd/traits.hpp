// Backward kernel traits: tile shapes, register split, MMAs, smem layouts and shared storage. The configuration
// comes from the variant table (flash_attn_dash/variants.py, BwdTile) through the generated translation units.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/array.h>
#include <cutlass/pipeline/pipeline.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "bwd/dq_handoff.hpp"
#include "common/sm90_limits.hpp"
#include "common/utils.hpp"
#include "schedule/tile_ring.hpp"

namespace flash_dash {
namespace bwd {

using namespace cute;

// kBlockM x kBlockN tiles (Q rows x K/V rows; the schedule model reads the same shape from the table).
// S and dP are computed transposed (SdP_swapAB: S^T = K Q^T, WGs split the K/V rows), so P^T and
// dS^T are already the register A operands of dV += P^T dO and dK += dS^T Q (RS wgmma).
// dQ = dS K reads dS from smem (MN-major); hdim 64 splits dQ's M over the WGs, hdim 128 its N.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kProducerRegs_, int kMmaRegs_>
struct BwdTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 128, "head dims up to 128, multiples of 32");
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static_assert(kBlockN == 128, "S^T tiles: two MMA warpgroups of 64 K/V rows");
    static_assert(kBlockM == 64 || kBlockM == 128, "one 64-row GMMA or one per MMA warpgroup for dQ");
    static constexpr int kStages = 2;     // Q/LSE and dO/dPsum
    static constexpr int kStagesdS = 2;
    static constexpr int NumMmaWG = 2;
    static constexpr int NumMmaThreads = NumMmaWG * 128;
    static constexpr int NumThreads = NumMmaThreads + 128;  // + the producer / dQ-store warpgroup
    // Registers per thread at launch under __launch_bounds__(NumThreads, 1): the SM's registers shared by
    // NumThreads, in the allocation granularity of 8 (168 for 384 threads).
    static constexpr int kLaunchRegs = kRegistersPerSm / NumThreads / 8 * 8;
    // The dQ tile (kBlockM x d) is split over the two MMA warpgroups by rows when it has 64 per warpgroup, else by
    // columns (each warpgroup a d/2-wide half).
    static constexpr bool dQ_split_M = kBlockM == 128;
    static constexpr int kdQN = dQ_split_M ? kHeadDim : kHeadDim / 2;  // GMMA N of one warpgroup's dQ
    // setmaxnreg split. The CTA owns what it launched with (kLaunchRegs x NumThreads), and setmaxnreg.inc
    // waits forever for registers the CTA does not own, so the split must fit in that.
    static constexpr int kProducerRegs = kProducerRegs_;
    static constexpr int kMmaRegs = kMmaRegs_;
    static_assert((kProducerRegs + NumMmaWG * kMmaRegs) * 128 <= kLaunchRegs * NumThreads,
                  "setmaxnreg split exceeds the launch allocation");

    using TileN = Int<kBlockN>;
    using TileM = Int<kBlockM>;
    using TileD = Int<kHeadDim>;

    using TiledMmaSdP = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, TileM, TileD>>(), Layout<Shape<_2, _1, _1>>{}));
    using TiledMmadKV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, TileD, TileM>, GMMA::Major::K, GMMA::Major::MN>(),
        Layout<Shape<_2, _1, _1>>{}));
    using AtomLayoutdQ = std::conditional_t<dQ_split_M, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _2, _1>>>;
    using TiledMmadQ = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kdQN>, TileN>, GMMA::Major::MN, GMMA::Major::MN>(),
        AtomLayoutdQ{}));
    static constexpr int kdQFragSize = kBlockM * kHeadDim / NumMmaThreads;  // fp32 per thread
    static_assert(kdQFragSize % 4 == 0);
    using DqHandoffT = DqHandoff<NumMmaWG, kdQFragSize>;
    static constexpr int kdQSliceFloats = DqHandoffT::kSliceFloats;  // per WG

    // The widest swizzle that divides a warpgroup's dQ columns (which divide d): the dQ GEMM reads K^T in column
    // slices of kdQN (128 B for hdim 64 and 128; 32 B for hdim 96, whose 48-column halves cut a 64 B atom).
    using SmemAtom = decltype(smem_atom_k_major<Element, kdQN>());
    using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<TileM, TileD, Int<kStages>>{}));
    using SmemLayoutdO = SmemLayoutQ;
    using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<TileN, TileD>{}));
    using SmemLayoutV = SmemLayoutK;
    using SmemLayoutQt = decltype(composition(
        SmemLayoutQ{}, make_layout(Shape<TileD, TileM, Int<kStages>>{}, Stride<TileM, _1, Int<kBlockM * kHeadDim>>{})));
    using SmemLayoutdOt = SmemLayoutQt;
    using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<TileD, TileN>{}, Stride<TileN, _1>{})));
    using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<TileM, TileN, Int<kStagesdS>>{}));
    using SmemLayoutdSt = decltype(composition(
        SmemLayoutdS{}, make_layout(Shape<TileN, TileM, Int<kStagesdS>>{}, Stride<TileM, _1, Int<kBlockM * kBlockN>>{})));

    using PipelineQ = cutlass::PipelineTmaAsync<kStages>;

    struct SharedStorage {
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>> smem_k;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>> smem_v;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> smem_q;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>> smem_do;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>> smem_ds;
        alignas(128) float smem_dqacc[NumMmaWG * kdQSliceFloats];
        alignas(128) float smem_lse[kStages * kBlockM];
        alignas(128) float smem_dpsum[kStages * kBlockM];
        alignas(16) typename PipelineQ::SharedStorage pipeline_q;
        alignas(16) typename PipelineQ::SharedStorage pipeline_do;
        alignas(8) uint64_t barrier_kv;
        alignas(8) uint64_t barrier_kv_empty;
        TileRingStorage tile_ring;
    };
    static constexpr int kSmemBytes = int(sizeof(SharedStorage));
    static_assert(sizeof(SharedStorage) <= kMaxSmemPerBlock, "exceeds the sm90 227 KB opt-in smem limit");

    static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
    static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace bwd
}  // namespace flash_dash
