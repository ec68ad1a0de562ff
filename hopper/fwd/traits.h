// Compile-time configuration of the sm90 forward kernel: tile shapes, smem layouts, MMAs, TMA types.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/sm90_limits.hpp"
#include "common/varlen.hpp"
#include "common/utils.hpp"
#include "schedule/fwd_tile_scheduler.hpp"

namespace flash_dash {

// kQStages: Q smem buffers. 1 = the producer loads the next tile's Q only after the consumers
// released the current one; 2 = the next Q is loaded a tile ahead, while the current tile runs.
// kL2Prefetch: the kernel carries the producer's L2 prefetch of the next tile (Params::l2_prefetch_next
// switches it per launch).
// kHeadDim: Q and K columns (the QK^T contraction); kHeadDimV: V and O columns (the PV GEMM's N), e.g. 192 / 128 for
// DeepSeek's MLA.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, typename Element_, int kQStages_ = 1,
          bool kL2Prefetch_ = false, int kHeadDimV_ = kHeadDim_>
struct FwdKernelTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kStages = kStages_;
    static constexpr int kQStages = kQStages_;
    static constexpr bool kL2Prefetch = kL2Prefetch_;
    static_assert(kQStages == 1 || kQStages == 2);

    // Warp roles: warpgroup 0 = producer (one thread issues TMA), warpgroups 1.. = consumers,
    // each owning 64 query rows of the kBlockM tile.
    static constexpr int kNumMmaWarpGroups = kBlockM / 64;
    static constexpr int kNumMmaThreads = kNumMmaWarpGroups * 128;
    static constexpr int kNumThreads = kNumMmaThreads + 128;
    static_assert(kBlockM % 64 == 0 && (kNumMmaWarpGroups == 2 || kNumMmaWarpGroups == 3),
                  "register budget assumes 2 or 3 consumer WGs");
    // setmaxnreg budget: every warpgroup's registers together fit the SM (one CTA per SM).
    static constexpr uint32_t kProducerRegs = kNumMmaWarpGroups == 2 ? 24 : 32;
    static constexpr uint32_t kConsumerRegs = kNumMmaWarpGroups == 2 ? 240 : 160;
    static_assert((kProducerRegs + kNumMmaWarpGroups * kConsumerRegs) * 128 <= kRegistersPerSm);
    static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0 && kBlockN % 16 == 0);
    // Intra-warpgroup overlap: a WG's softmax runs while its own PV GEMM is in flight (the mainloop
    // pins the PV wait after the softmax). It pays with 2 consumer WGs (240 registers) and costs with
    // 3 (160 registers, hdim 64), where the other WGs' GEMMs already fill the tensor cores.
    static constexpr bool kOverlapPvSoftmax = kNumMmaWarpGroups == 2;

    using AtomLayoutMNK = cute::Layout<cute::Shape<cute::Int<kNumMmaWarpGroups>, cute::_1, cute::_1>>;
    // S = Q K^T: both operands K-major in smem (SS).
    using TiledMmaQK = decltype(cute::make_tiled_mma(
        cute::GMMA::ss_op_selector<Element, Element, float,
                                   cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>>(),
        AtomLayoutMNK{}));
    // O += P V: P from registers (K-major), V^T read MN-major from the K-major V tile (RS).
    using TiledMmaPV = decltype(cute::make_tiled_mma(
        cute::GMMA::rs_op_selector<Element, Element, float,
                                   cute::Shape<cute::_64, cute::Int<kHeadDimV>, cute::Int<kBlockN>>,
                                   cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
        AtomLayoutMNK{}));
    // ss_op_selector silently falls back to a narrower atom when kBlockN is not a base GMMA N
    // (e.g. 176 without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED): refuse that.
    static_assert(decltype(cute::size<1>(typename TiledMmaQK::AtomShape_MNK{}))::value == kBlockN,
                  "kBlockN needs -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED in this translation unit");

    using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());    // Q and K rows
    using SmemAtomV = decltype(smem_atom_k_major<Element, kHeadDimV>());  // V and O rows
    // One Q stage (the TMA box) and the staged Q buffer (M, d, kQStages).
    using SmemLayoutQStage = decltype(cute::tile_to_shape(
        SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
    using SmemLayoutQ = decltype(cute::tile_to_shape(
        SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kQStages>>{}));
    using SmemLayoutKStage = decltype(cute::tile_to_shape(
        SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
    using SmemLayoutK = decltype(cute::tile_to_shape(
        SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
    using SmemLayoutVStage = decltype(cute::tile_to_shape(
        SmemAtomV{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimV>>{}));
    using SmemLayoutV = decltype(cute::tile_to_shape(
        SmemAtomV{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimV>, cute::Int<kStages>>{}));
    // V^T view (dv, n, stage) of the (n, dv, stage) V buffer.
    using SmemLayoutVt = decltype(cute::composition(
        SmemLayoutV{},
        cute::make_layout(cute::Shape<cute::Int<kHeadDimV>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                          cute::Stride<cute::Int<kBlockN>, cute::_1, cute::Int<kBlockN * kHeadDimV>>{})));
    // O staging: one (64, d) block per consumer WG, written, fenced and TMA-stored by that WG's own
    // threads, so a WG's epilogue never waits for the other WGs (they run a GEMM apart in the round
    // robin). TiledMmaO is the register layout of one block's rows (one WG's slice of TiledMmaPV).
    static constexpr int kORows = 64;  // rows per O TMA store
    static constexpr int kOParts = kNumMmaWarpGroups;
    using SmemLayoutOStage = decltype(cute::tile_to_shape(
        SmemAtomV{}, cute::Shape<cute::Int<kORows>, cute::Int<kHeadDimV>>{}));
    using SmemLayoutO = decltype(cute::tile_to_shape(
        SmemAtomV{}, cute::Shape<cute::Int<kORows>, cute::Int<kHeadDimV>, cute::Int<kOParts>>{}));
    using TiledMmaO = decltype(cute::make_tiled_mma(
        cute::GMMA::rs_op_selector<Element, Element, float,
                                   cute::Shape<cute::_64, cute::Int<kHeadDimV>, cute::Int<kBlockN>>,
                                   cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

    using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
    using PipelineKV = cutlass::PipelineTmaAsync<kStages>;

    // O is staged through smem for a TMA store when that fits next to Q and K/V; otherwise (e.g.
    // 128 x 176 at hdim 128) the epilogue stores O straight from registers.
    // The varlen O copy warps' handoff with the consumers (fwd/o_handoff.hpp), per O part: mbarriers "the block is
    // staged" and "the buffer is free", and the consumers' phase of the latter (read by one thread per part per tile).
    struct OHandoffBarriers {
        uint64_t staged[kOParts];
        uint64_t free[kOParts];
        uint32_t free_phase[kOParts];
    };
    template <bool kStaged>
    struct SharedStorageT {
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> smem_k;
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> smem_v;
        cute::array_aligned<Element, kStaged ? cute::cosize_v<SmemLayoutO> : 8, kStaged ? 1024 : 16> smem_o;
        typename PipelineQ::SharedStorage pipeline_q;
        typename PipelineKV::SharedStorage pipeline_k;
        typename PipelineKV::SharedStorage pipeline_v;
        OHandoffBarriers o_handoff;
        FwdClaimStorage varlen_claims;  // FwdVarlenScheduler's
    };
    static constexpr bool kStagedO = sizeof(SharedStorageT<true>) <= kMaxSmemPerBlock;
    using SharedStorage = SharedStorageT<kStagedO>;
    static constexpr int kSmemBytes = int(sizeof(SharedStorage));
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "exceeds the sm90 227 KB opt-in smem limit");

    static constexpr uint32_t kTmaBytesQ = uint32_t(kBlockM * kHeadDim * sizeof(Element));
    static constexpr uint32_t kTmaBytesK = uint32_t(kBlockN * kHeadDim * sizeof(Element));
    static constexpr uint32_t kTmaBytesV = uint32_t(kBlockN * kHeadDimV * sizeof(Element));

    // Global tensors as (seqlen, head_dim, head, batch) with the head_dim stride static 1.
    using ShapeT = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
    using StrideT = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
    using GmemLayoutT = cute::Layout<ShapeT, StrideT>;

    // A TMA of (kRows, kCols) boxes (kCols: the tensor's head dim).
    template <class Op, class SmemLayout, int kRows, int kCols, class Ptr>
    static auto make_tma(Op op, Ptr ptr, GmemLayoutT layout) {
        return cute::make_tma_copy(op, cute::make_tensor(cute::make_gmem_ptr(ptr), layout), SmemLayout{},
                                   cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}, cute::_1{});
    }
    using TmaQ = decltype(make_tma<cute::SM90_TMA_LOAD, SmemLayoutQStage, kBlockM, kHeadDim>(
        cute::SM90_TMA_LOAD{}, static_cast<Element const*>(nullptr), GmemLayoutT{}));
    using TmaK = decltype(make_tma<cute::SM90_TMA_LOAD, SmemLayoutKStage, kBlockN, kHeadDim>(
        cute::SM90_TMA_LOAD{}, static_cast<Element const*>(nullptr), GmemLayoutT{}));
    using TmaV = decltype(make_tma<cute::SM90_TMA_LOAD, SmemLayoutVStage, kBlockN, kHeadDimV>(
        cute::SM90_TMA_LOAD{}, static_cast<Element const*>(nullptr), GmemLayoutT{}));
    using TmaO = decltype(make_tma<cute::SM90_TMA_STORE, SmemLayoutOStage, kORows, kHeadDimV>(
        cute::SM90_TMA_STORE{}, static_cast<Element*>(nullptr), GmemLayoutT{}));

    struct Params {
        TmaQ tma_q;
        TmaK tma_k;
        TmaV tma_v;
        TmaO tma_o;
        float* lse;
        int seqlen_q, seqlen_k, num_heads, num_heads_k, batch, head_ratio;
        int num_m_blocks;
        // Natural-log and log2 units per unit of the scores the softmax sees: softmax_scale and softmax_scale * log2 e,
        // or in the softcap kernels (whose softmax sees tanh(S * softcap_prescale)) softcap and softcap * log2 e.
        float softmax_scale, scale_log2;
        bool is_causal;
        int window_left, window_right;  // is_causal: row i sees keys [i + sk - sq - left, i + sk - sq + right]
        float const* sink;              // (heads,) learnable sink logits, read by the kSink kernels
        // Direct (unstaged) O store only: the output tensor and its element strides.
        Element* o_ptr;
        int64_t o_row_stride, o_head_stride, o_batch_stride;
        // m-block i covers rows [i * kBlockM - m_offset, ...) (0 for full masks). Causal tiles cost in
        // proportion to their last row, so a partial tile is cheapest as the first one: with 192-row
        // tiles at seqlen 2k/4k a partial last tile is ~6% extra work. A multiple of kORows (the launch
        // rounds it down), so O store blocks never straddle row 0.
        int m_offset;
        // kL2Prefetch kernels: the producer prefetches the next tile's Q and first two K/V blocks into L2 a
        // tile ahead (see FwdMainloopSm90::load).
        bool l2_prefetch_next;
        // Softcap kernels: softmax_scale / softcap (after the others, so their parameter offsets do not move).
        float softcap_prescale;
        // Varlen kernels: the prepare CTA's sequence views, tile table, tile count and claim counter
        // (common/varlen.hpp); the tensors are then one batch of seqlen_q / seqlen_k packed rows.
        VarlenSeq const* varlen_seqs;
        VarlenTile const* varlen_tiles;
        int const* varlen_num_tiles;
        int* varlen_claims;
    };

    // The causal launches' shift (Params::m_offset) of a sequence of seqlen_q rows: its partial block goes first.
    CUTE_HOST_DEVICE static int causal_m_offset(int seqlen_q) {
        int const blocks = (seqlen_q + kBlockM - 1) / kBlockM;
        return (blocks * kBlockM - seqlen_q) / kORows * kORows;
    }

    // Where a tile's sequence lies: the dense call's (rows from 0, the tile's batch; read from the parameters where
    // used, as the kernels did before packs) or, in the varlen kernels, a packed sequence's (rows from its first
    // one, batch 0; the tile's `batch` is the sequence's index).
    struct DenseSeq {
        Params const& p;
        int b;
        CUTE_HOST_DEVICE int q_start() const { return 0; }
        CUTE_HOST_DEVICE int k_start() const { return 0; }
        CUTE_HOST_DEVICE int seqlen_q() const { return p.seqlen_q; }
        CUTE_HOST_DEVICE int seqlen_k() const { return p.seqlen_k; }
        CUTE_HOST_DEVICE int m_offset() const { return p.m_offset; }
        CUTE_HOST_DEVICE int batch() const { return b; }
    };
    struct PackedSeq {
        VarlenSeq s;
        int shift;  // the sequence's m_offset
        CUTE_HOST_DEVICE int q_start() const { return s.q_start; }
        CUTE_HOST_DEVICE int k_start() const { return s.k_start; }
        CUTE_HOST_DEVICE int seqlen_q() const { return s.len_q; }
        CUTE_HOST_DEVICE int seqlen_k() const { return s.len_k; }
        CUTE_HOST_DEVICE int m_offset() const { return shift; }
        CUTE_HOST_DEVICE int batch() const { return 0; }
    };
    template <bool kVarlen>
    using Seq = cute::conditional_t<kVarlen, PackedSeq, DenseSeq>;
    template <bool kVarlen>
    CUTE_DEVICE static Seq<kVarlen> seq_of(Params const& p, int batch) {
        if constexpr (kVarlen) {
            VarlenSeq const s = p.varlen_seqs[batch];
            return PackedSeq{s, p.is_causal ? causal_m_offset(s.len_q) : 0};
        } else {
            return DenseSeq{p, batch};
        }
    }
    // First query row of m-block m of the sequence (negative for the first block of a shifted causal call).
    template <class S>
    CUTE_HOST_DEVICE static int first_row(S const& s, int m_block) { return m_block * kBlockM - s.m_offset(); }
    // The (seqlen, d) view of a Q/O tensor whose row 0 is the sequence's m-block 0's first row, for local_tile.
    template <class S, class TensorX>
    CUTE_HOST_DEVICE static auto rows_from_first_block(S const& s, TensorX const& mX) {
        return cute::domain_offset(cute::make_coord(s.q_start() - s.m_offset(), cute::_0{}), mX);
    }
    // The (seqlen_k, d) view of a K/V tensor whose row 0 is the sequence's first key.
    template <class S, class TensorX>
    CUTE_HOST_DEVICE static auto keys_of(S const& s, TensorX const& mX) {
        if constexpr (cute::is_same_v<S, DenseSeq>) {
            return mX;
        } else {
            return cute::domain_offset(cute::make_coord(s.k_start(), cute::_0{}), mX);
        }
    }
};

}  // namespace flash_dash
