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
#include "bwd/roles.hpp"
#include "common/sm90_limits.hpp"
#include "common/utils.hpp"
#include "schedule/tile_ring.hpp"

namespace flash_dash {
namespace bwd {

using namespace cute;

// kBlockM x kBlockN tiles (Q rows x K/V rows; the schedule model reads the same shape from the table).
// Two layouts of the MMA warpgroups' GEMMs (kSwapdKV, from the table's BwdTile.swap_dkv):
// - plain (head dims up to 128): S and dP are computed transposed (S^T = K Q^T, WGs split the K/V rows), so P^T and
//   dS^T are already the register A operands of dV += P^T dO and dK += dS^T Q (RS wgmma); each WG holds dK/dV of its
//   64 K/V rows (2 x 64 x d fp32 per WG: too many registers beyond d = 128).
// - swapped dK/dV (larger head dims): S = Q K^T and dP = dO V^T (WGs split the keys), P and dS go to shared memory
//   and dV^T += dO^T P, dK^T += Q^T dS read them there (SS wgmma, head dim on the M axis): the WGs split the head
//   dim (a multiple of 128) or else the keys, so each holds half of dK^T and dV^T.
// dQ = dS K reads dS from smem (MN-major); kBlockM == 128 splits dQ's M over the WGs, else its N.
// kStagesQ / kStagesdO: shared-memory stages of Q+LSE and of dO+dPsum.
// kHeadDim: Q, K, dQ and dK columns; kHeadDimV: V, O, dO and dV columns (e.g. 192 / 128 for DeepSeek's MLA).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kProducerRegs_, int kMmaRegs_,
          int kStagesQ_ = 2, int kStagesdO_ = 2, bool kSwapdKV_ = false, int kHeadDimV_ = kHeadDim_>
struct BwdTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr bool kSwapdKV = kSwapdKV_;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= (kSwapdKV ? 256 : 128) && kHeadDimV % 32 == 0 &&
                      kHeadDimV <= (kSwapdKV ? 256 : 128),
                  "head dims: multiples of 32, up to 128 (up to 256 with swapped dK/dV)");
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static_assert(kSwapdKV || kBlockN == 128, "S^T tiles: two MMA warpgroups of 64 K/V rows");
    static_assert(kBlockM == 64 || kBlockM == 128, "one 64-row GMMA or one per MMA warpgroup for dQ");
    static_assert(!kSwapdKV || (kBlockM == 64 && kBlockN % 16 == 0),
                  "swapped dK/dV: one 64-row S GMMA, its keys split into halves of a multiple of 8");
    static constexpr int kStagesQ = kStagesQ_;   // Q/LSE
    static constexpr int kStagesdO = kStagesdO_;  // dO/dPsum
    static_assert(kStagesQ >= 1 && kStagesdO >= 1);
    // Shared P/dS buffers. Plain: dS^T alternates between two, so a WG writes the next step's while the other may
    // still read this one. Swapped: buffer 0 holds P, 1 holds dS (every WG's dK/dV GEMMs read all of both).
    static constexpr int kStagesdS = 2;
    static constexpr int kBufP = 0, kBufdS = 1;  // swapped
    static constexpr int kFirstBufdS = kSwapdKV ? kBufdS : 0;  // the buffer of the first step's dS
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
    using TileDV = Int<kHeadDimV>;
    // The S / dP accumulator's (rows, cols): (keys, queries) plain, (queries, keys) swapped; the dK / dV
    // accumulators' likewise (keys, d) or (d, keys), each with its own head dim.
    using ShapeS = std::conditional_t<kSwapdKV, Shape<TileM, TileN>, Shape<TileN, TileM>>;
    template <class TileX>
    using ShapedX = std::conditional_t<kSwapdKV, Shape<TileX, TileN>, Shape<TileN, TileX>>;
    using ShapedK = ShapedX<TileD>;
    using ShapedV = ShapedX<TileDV>;
    static constexpr int kKeyMode = kSwapdKV ? 1 : 0;  // the mode of ShapeS, ShapedK and ShapedV that counts keys
    // Swapped: whether the WGs split dK^T/dV^T's rows (the head dims, in 64-row GMMAs) or else their keys.
    static constexpr bool kdKVSplitD = kSwapdKV && kHeadDim % 128 == 0 && kHeadDimV % 128 == 0;
    static constexpr int kdKVN = kdKVSplitD ? kBlockN : kBlockN / 2;  // swapped: GMMA N of one WG's dK^T/dV^T

    static auto make_mma_sdp() {
        if constexpr (kSwapdKV) {
            return make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN / 2>, TileD>>(),
                                  Layout<Shape<_1, _2, _1>>{});
        } else {
            return make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, TileM, TileD>>(),
                                  Layout<Shape<_2, _1, _1>>{});
        }
    }
    // dK (TileX = TileD) or dV (TileDV): the head dim is the GMMA N when plain; swapped, both are the same MMA.
    template <class TileX>
    static auto make_mma_dkv() {
        if constexpr (kSwapdKV) {
            using Split = std::conditional_t<kdKVSplitD, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _2, _1>>>;
            return make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kdKVN>, TileM>,
                                                       GMMA::Major::MN, GMMA::Major::K>(),
                                  Split{});
        } else {
            return make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<_64, TileX, TileM>,
                                                       GMMA::Major::K, GMMA::Major::MN>(),
                                  Layout<Shape<_2, _1, _1>>{});
        }
    }
    using TiledMmaSdP = decltype(make_mma_sdp());
    using TiledMmadK = decltype(make_mma_dkv<TileD>());
    using TiledMmadV = decltype(make_mma_dkv<TileDV>());
    using AtomLayoutdQ = std::conditional_t<dQ_split_M, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _2, _1>>>;
    using TiledMmadQ = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kdQN>, TileN>, GMMA::Major::MN, GMMA::Major::MN>(),
        AtomLayoutdQ{}));
    // ss_op_selector silently takes a narrower atom when an N is not a base GMMA N (the swapped layouts' key halves,
    // e.g. 24 or 48): the translation unit then needs CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (hopper/generate.py).
    static_assert(decltype(size<1>(typename TiledMmaSdP::AtomShape_MNK{}))::value == (kSwapdKV ? kBlockN / 2 : kBlockM) &&
                      (!kSwapdKV || decltype(size<1>(typename TiledMmadK::AtomShape_MNK{}))::value == kdKVN),
                  "a GMMA N of this configuration needs -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");
    static constexpr int kdQFragSize = kBlockM * kHeadDim / NumMmaThreads;  // fp32 per thread
    static_assert(kdQFragSize % 4 == 0);
    using DqHandoffT = DqHandoff<NumMmaWG, kdQFragSize>;
    static constexpr int kdQSliceFloats = DqHandoffT::kSliceFloats;  // per WG

    // The widest swizzle that divides a warpgroup's dQ columns (which divide d): the dQ GEMM reads K^T in column
    // slices of kdQN (128 B for hdim 64 and 128; 32 B for hdim 96, whose 48-column halves cut a 64 B atom).
    // dO and V take the same atom (they have no column slices of their own).
    using SmemAtom = decltype(smem_atom_k_major<Element, kdQN>());
    static_assert(kHeadDimV % decltype(size<1>(SmemAtom{}))::value == 0, "V's head dim must fill whole smem atoms");
    using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<TileM, TileD, Int<kStagesQ>>{}));
    using SmemLayoutdO = decltype(tile_to_shape(SmemAtom{}, Shape<TileM, TileDV, Int<kStagesdO>>{}));
    using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<TileN, TileD>{}));
    using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<TileN, TileDV>{}));
    using SmemLayoutQt = decltype(composition(
        SmemLayoutQ{}, make_layout(Shape<TileD, TileM, Int<kStagesQ>>{}, Stride<TileM, _1, Int<kBlockM * kHeadDim>>{})));
    using SmemLayoutdOt = decltype(composition(
        SmemLayoutdO{}, make_layout(Shape<TileDV, TileM, Int<kStagesdO>>{}, Stride<TileM, _1, Int<kBlockM * kHeadDimV>>{})));
    using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<TileD, TileN>{}, Stride<TileN, _1>{})));
    using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<TileM, TileN, Int<kStagesdS>>{}));
    using SmemLayoutdSt = decltype(composition(
        SmemLayoutdS{}, make_layout(Shape<TileN, TileM, Int<kStagesdS>>{}, Stride<TileM, _1, Int<kBlockM * kBlockN>>{})));
    // The S accumulator's view of the P/dS buffers (its (rows, cols)) and the stmatrix that writes them: the rows
    // are contiguous in smem when swapped, so the stores transpose; four 8x8 matrices per store where the WG's key
    // half allows, else two.
    using SmemLayoutPdSAcc = std::conditional_t<kSwapdKV, SmemLayoutdS, SmemLayoutdSt>;
    using R2SAtomPdS = std::conditional_t<!kSwapdKV, SM90_U32x4_STSM_N,
                                          std::conditional_t<(kBlockN / 2) % 16 == 0, SM90_U16x8_STSM_T, SM90_U16x4_STSM_T>>;

    using PipelineQ = cutlass::PipelineTmaAsync<kStagesQ>;
    using PipelinedO = cutlass::PipelineTmaAsync<kStagesdO>;

    struct SharedStorage {
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>> smem_k;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>> smem_v;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> smem_q;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>> smem_do;
        alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>> smem_ds;
        alignas(128) float smem_dqacc[NumMmaWG * kdQSliceFloats];
        alignas(128) float smem_lse[kStagesQ * kBlockM];
        alignas(128) float smem_dpsum[kStagesdO * kBlockM];
        alignas(16) typename PipelineQ::SharedStorage pipeline_q;
        alignas(16) typename PipelinedO::SharedStorage pipeline_do;
        alignas(8) uint64_t barrier_kv;
        alignas(8) uint64_t barrier_kv_empty;
        TileRingStorage tile_ring;
        alignas(8) uint64_t dq_turn[kDqStoreWarps];  // the dQ-store warps' turn barriers (dq_store.hpp)
    };
    static constexpr int kSmemBytes = int(sizeof(SharedStorage));
    static_assert(sizeof(SharedStorage) <= kMaxSmemPerBlock, "exceeds the sm90 227 KB opt-in smem limit");

    static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
    static constexpr uint32_t kTmaBytesdO = kBlockM * kHeadDimV * sizeof(Element);
    static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
    static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDimV * sizeof(Element);
};

}  // namespace bwd
}  // namespace flash_dash
