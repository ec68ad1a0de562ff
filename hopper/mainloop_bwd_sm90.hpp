// Backward kernel traits (tile shapes, MMAs, smem layouts, shared storage); GEMM helpers are in utils.hpp.
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

#include "utils.hpp"
#include "tile_ring.hpp"
#include "dq_handoff.hpp"

namespace flash_dash {
namespace bwd {

using namespace cute;

// Tile shapes (contract with the Python model): hdim <= 64: 128x128, hdim <= 128: 64x128.
// S and dP are computed transposed (SdP_swapAB: S^T = K Q^T, WGs split the K/V rows), so P^T and
// dS^T are already the register A operands of dV += P^T dO and dK += dS^T Q (RS wgmma).
// dQ = dS K reads dS from smem (MN-major); hdim 64 splits dQ's M over the WGs, hdim 128 its N.
template <class Element_, int kHeadDim_>
struct BwdTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "head dim 64 or 128");
    static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;
    static constexpr int kBlockN = 128;
    static constexpr int kStages = 2;     // Q/LSE and dO/dPsum
    static constexpr int kStagesdS = 2;
    static constexpr int NumMmaWG = 2;
    static constexpr int NumMmaThreads = 256;
    static constexpr int NumThreads = 384;
    static constexpr bool dQ_split_M = kHeadDim <= 64;
    // setmaxnreg split. The CTA owns what it launched with (168 regs x 384 threads = 64512), and
    // setmaxnreg.inc waits forever for registers the CTA does not own, so the split must fit in that.
    // hdim 64's MMA warpgroups need 240 (the producer/store warps then spill a little at 24);
    // hdim 128 fits spill-free at 40/232.
    static constexpr int kProducerRegs = kHeadDim <= 64 ? 24 : 40;
    static constexpr int kMmaRegs = kHeadDim <= 64 ? 240 : 232;
    static_assert((kProducerRegs + 2 * kMmaRegs) * 128 <= 168 * 384, "setmaxnreg split exceeds the launch allocation");

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
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, _64, TileN>, GMMA::Major::MN, GMMA::Major::MN>(),
        AtomLayoutdQ{}));
    static constexpr int kdQFragSize = kBlockM * kHeadDim / NumMmaThreads;  // fp32 per thread
    static_assert(kdQFragSize % 4 == 0);
    static constexpr int kdQSliceFloats = kdQFragSize * 128;  // per WG
    using DqHandoffT = DqHandoff<NumMmaWG, kdQSliceFloats>;

    using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<TileM, TileD, Int<kStages>>{}));
    using SmemLayoutdO = SmemLayoutQ;
    using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<TileN, TileD>{}));
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
    static_assert(sizeof(SharedStorage) <= 232448, "smem");

    static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
    static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace bwd
}  // namespace flash_dash
