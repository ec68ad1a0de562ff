// Host side of the forward: picks the tile configuration, builds TMA descriptors and launches.
//
// Requirements the binding must check (TMA): q/k/v/out base pointers 16-byte aligned; every
// batch/row/head stride (in elements) a multiple of 8 for 16-bit types (16 bytes); last dim
// contiguous; head_dim == kHeadDim; num_heads % num_heads_k == 0; lse contiguous (b, h, sq) fp32;
// all strides < 2^40 bytes and seqlens/heads/batch < 2^31 (TMA global dims are 32-bit).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

#include "flash_fwd_kernel_sm90.h"
#include "flash_params.h"
#include "kernel_api.h"
#include "kernel_traits_fwd.h"

namespace flash_dash {

// ---------------------------------------------------------------------------------------------
// Compile-time variant knobs (all default to the production configuration). Set them with
// NVCC_APPEND_FLAGS='-DNAME=VALUE ...' when building; each applies to every forward TU.
//   FLASH_DASH_FWD_HDIM{64,128}_BLOCK_M    query rows per tile: 128 (2 consumer WGs, 240 regs)
//                                          or 192 (3 consumer WGs, 160 regs); defaults 192 / 128
//   FLASH_DASH_FWD_HDIM{64,128}_BLOCK_N    keys per K/V block; not a base GMMA N (64/96/128/192/256)
//                                          -> the instantiation TU turns on the extended shapes
//   FLASH_DASH_FWD_HDIM{64,128}_STAGES     K/V smem stages
//   FLASH_DASH_FWD_HDIM{64,128}_Q_STAGES   1 or 2 (2: next tile's Q loaded a tile ahead)
//   FLASH_DASH_FWD_HDIM{64,128}_L2_PREFETCH 0 or 1: Traits::kL2Prefetch, the producer's L2 prefetch of the
//                                          next tile (on by default for full masks only, at launch)
//   FLASH_DASH_FWD_HDIM{64,128}_CAUSAL_{BLOCK_M,BLOCK_N,STAGES,Q_STAGES}
//                                          the same for causal calls (default: the non-causal value;
//                                          a different value instantiates a second kernel)
//   FLASH_DASH_FWD_RESCALE_SKIP=0|1        (default 1) skip O *= exp2(m_old - m_new) when no row of
//                                          the warp changed its max (bitwise identical results)
//   FLASH_DASH_FWD_TMA_HINTS=1             L2 hints: K/V loads EVICT_LAST, Q loads EVICT_FIRST
//   FLASH_DASH_FWD_CAUSAL_ROW_OFFSET=0|1   (default 1) causal: the partial m-block (seqlen_q % BLOCK_M
//                                          rows) comes first, where it sees the fewest keys (m_offset)
// ---------------------------------------------------------------------------------------------
// Defaults measured on the H200 (benchmarks/results/NOTES.md, 2026-11-30): hdim 64 takes 192-row tiles
// (3 consumer warpgroups; +10-14% at 2k-8k); O rescales are skipped when no max moved (mainloop);
// hdim 128 loads the next tile's Q a tile ahead (2 Q buffers, 224 KB smem): the step loop runs across
// tiles, so a tile's first QK^T is issued with the previous tile's last PV and needs its Q by then
// (with one buffer: hdim 128 full 2k-16k 621/656/676/665 vs 642/667/678/679 TFLOP/s, session 6);
// with 2 consumer WGs (hdim 128) a WG's softmax overlaps its own PV (Traits::kOverlapPvSoftmax,
// session 7: full 2k-16k 640/673/689/696 vs 634/659/670/668).
#ifndef FLASH_DASH_FWD_HDIM64_BLOCK_M
#define FLASH_DASH_FWD_HDIM64_BLOCK_M 192
#endif
#ifndef FLASH_DASH_FWD_HDIM64_BLOCK_N
#define FLASH_DASH_FWD_HDIM64_BLOCK_N 128
#endif
#ifndef FLASH_DASH_FWD_HDIM64_STAGES
#define FLASH_DASH_FWD_HDIM64_STAGES 3
#endif
#ifndef FLASH_DASH_FWD_HDIM64_Q_STAGES
#define FLASH_DASH_FWD_HDIM64_Q_STAGES 1
#endif
#ifndef FLASH_DASH_FWD_HDIM128_BLOCK_M
#define FLASH_DASH_FWD_HDIM128_BLOCK_M 128
#endif
#ifndef FLASH_DASH_FWD_HDIM128_BLOCK_N
#define FLASH_DASH_FWD_HDIM128_BLOCK_N 128
#endif
#ifndef FLASH_DASH_FWD_HDIM128_STAGES
#define FLASH_DASH_FWD_HDIM128_STAGES 2
#endif
#ifndef FLASH_DASH_FWD_HDIM128_Q_STAGES
#define FLASH_DASH_FWD_HDIM128_Q_STAGES 2
#endif
#ifndef FLASH_DASH_FWD_HDIM64_L2_PREFETCH
#define FLASH_DASH_FWD_HDIM64_L2_PREFETCH 0
#endif
#ifndef FLASH_DASH_FWD_HDIM128_L2_PREFETCH
#define FLASH_DASH_FWD_HDIM128_L2_PREFETCH 1
#endif
#ifndef FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_M
#define FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_M FLASH_DASH_FWD_HDIM64_BLOCK_M
#endif
#ifndef FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_N
#define FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_N FLASH_DASH_FWD_HDIM64_BLOCK_N
#endif
#ifndef FLASH_DASH_FWD_HDIM64_CAUSAL_STAGES
#define FLASH_DASH_FWD_HDIM64_CAUSAL_STAGES FLASH_DASH_FWD_HDIM64_STAGES
#endif
#ifndef FLASH_DASH_FWD_HDIM64_CAUSAL_Q_STAGES
#define FLASH_DASH_FWD_HDIM64_CAUSAL_Q_STAGES FLASH_DASH_FWD_HDIM64_Q_STAGES
#endif
#ifndef FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_M
#define FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_M FLASH_DASH_FWD_HDIM128_BLOCK_M
#endif
#ifndef FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_N
#define FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_N FLASH_DASH_FWD_HDIM128_BLOCK_N
#endif
#ifndef FLASH_DASH_FWD_HDIM128_CAUSAL_STAGES
#define FLASH_DASH_FWD_HDIM128_CAUSAL_STAGES FLASH_DASH_FWD_HDIM128_STAGES
#endif
#ifndef FLASH_DASH_FWD_HDIM128_CAUSAL_Q_STAGES
#define FLASH_DASH_FWD_HDIM128_CAUSAL_Q_STAGES FLASH_DASH_FWD_HDIM128_Q_STAGES
#endif

// Tile configuration per head dim and mask: kBlockM x kBlockN, K/V stages, Q stages. The default
// 128 x 128 uses only base GMMA shapes, 2 consumer warpgroups of 64 rows. Head dims above 128 (no
// instantiation is generated for them yet, so not run on a GPU): O alone holds kHeadDim / 2 fp32
// registers per thread, so narrower K/V blocks (96 keys up to 192 columns, else 64) and one Q buffer;
// their O does not fit in smem next to Q and K/V, so the epilogue stores it from registers.
template <int kHeadDim, bool kCausal>
struct FwdTileConfig {
    static constexpr bool k64 = kHeadDim <= 64;
    static constexpr bool kWide = kHeadDim > 128;
    static constexpr int kBlockM = kWide ? 128
                                 : k64 ? (kCausal ? FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_M : FLASH_DASH_FWD_HDIM64_BLOCK_M)
                                       : (kCausal ? FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_M : FLASH_DASH_FWD_HDIM128_BLOCK_M);
    static constexpr int kBlockN = kWide ? (kHeadDim <= 192 ? 96 : 64)
                                 : k64 ? (kCausal ? FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_N : FLASH_DASH_FWD_HDIM64_BLOCK_N)
                                       : (kCausal ? FLASH_DASH_FWD_HDIM128_CAUSAL_BLOCK_N : FLASH_DASH_FWD_HDIM128_BLOCK_N);
    static constexpr int kStages = kWide ? 2
                                 : k64 ? (kCausal ? FLASH_DASH_FWD_HDIM64_CAUSAL_STAGES : FLASH_DASH_FWD_HDIM64_STAGES)
                                       : (kCausal ? FLASH_DASH_FWD_HDIM128_CAUSAL_STAGES : FLASH_DASH_FWD_HDIM128_STAGES);
    static constexpr int kQStages = kWide ? 1
                                  : k64 ? (kCausal ? FLASH_DASH_FWD_HDIM64_CAUSAL_Q_STAGES : FLASH_DASH_FWD_HDIM64_Q_STAGES)
                                        : (kCausal ? FLASH_DASH_FWD_HDIM128_CAUSAL_Q_STAGES : FLASH_DASH_FWD_HDIM128_Q_STAGES);
    static constexpr bool kL2Prefetch = !kWide && (k64 ? FLASH_DASH_FWD_HDIM64_L2_PREFETCH : FLASH_DASH_FWD_HDIM128_L2_PREFETCH);
    static_assert(kHeadDim <= 256, "forward tiles cover head dims up to 256");
};

// Whether a kL2Prefetch kernel's producer prefetches the next tile's start into L2 (Params::l2_prefetch_next):
// full masks only, where the CTAs' tile boundaries line up (session 8, hdim 128 full: per-tile overhead 1.50
// -> 1.11 block steps, 2k +1.4%). Causal tiles differ in length, so the boundaries spread out, and the next
// tile (same heads, LPT order) mostly hits L2 already (hdim 128 causal 2k-16k -0.3..-1.8% with it). Only
// hdim 128 carries it: adding the producer code moved hdim 64's consumer SASS (-1-2% at 8k/16k).
// FLASH_DASH_FWD_L2_PREFETCH=0|1 overrides the mask rule per call (A/B runs: benchmarks/fwd_variants.py).
inline bool fwd_l2_prefetch_next(bool is_causal) {
    char const* env = std::getenv("FLASH_DASH_FWD_L2_PREFETCH");
    if (env == nullptr || env[0] == '\0') { return !is_causal; }
    if ((env[0] == '0' || env[0] == '1') && env[1] == '\0') { return env[0] == '1'; }
    throw std::invalid_argument(std::string("FLASH_DASH_FWD_L2_PREFETCH must be 0 or 1 (or unset), got '") + env + "'");
}

template <class Traits>
void launch_fwd(FwdParams const& p, cudaStream_t stream) {
    using namespace cute;
    using Element = typename Traits::Element;
    using GmemLayoutT = typename Traits::GmemLayoutT;
    constexpr int kHeadDim = Traits::kHeadDim;

    auto gmem_layout = [](int seqlen, int heads, int batch, TensorStrides const& s) {
        return make_layout(make_shape(int32_t(seqlen), int32_t(kHeadDim), int32_t(heads), int32_t(batch)),
                           make_stride(int64_t(s.row), _1{}, int64_t(s.head), int64_t(s.batch)));
    };
    // seqlen_k == 0 still needs a valid K/V descriptor (no block is ever loaded): use 1 row.
    int const sk_desc = std::max(p.seqlen_k, 1);
    GmemLayoutT const lq = gmem_layout(p.seqlen_q, p.num_heads, p.batch, p.q_stride);
    GmemLayoutT const lk = gmem_layout(sk_desc, p.num_heads_k, p.batch, p.k_stride);
    GmemLayoutT const lv = gmem_layout(sk_desc, p.num_heads_k, p.batch, p.v_stride);
    GmemLayoutT const lo = gmem_layout(p.seqlen_q, p.num_heads, p.batch, p.o_stride);

    typename Traits::Params kp{
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutQStage, Traits::kBlockM>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.q), lq),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutKVStage, Traits::kBlockN>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.k), lk),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutKVStage, Traits::kBlockN>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.v), lv),
        Traits::template make_tma<SM90_TMA_STORE, typename Traits::SmemLayoutOStage, Traits::kORows>(
            SM90_TMA_STORE{}, static_cast<Element*>(p.out), lo),
        p.lse,
        p.seqlen_q,
        p.seqlen_k,
        p.num_heads,
        p.num_heads_k,
        p.batch,
        std::max(1, p.num_heads / std::max(1, p.num_heads_k)),
        (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM,
        p.softmax_scale,
        float(double(p.softmax_scale) * 1.4426950408889634),  // log2(e)
        p.is_causal,
        static_cast<Element*>(p.out),
        int64_t(p.o_stride.row),
        int64_t(p.o_stride.head),
        int64_t(p.o_stride.batch),
        0,
        fwd_l2_prefetch_next(p.is_causal),
    };
    // A multiple of the O store's row block, so that no TMA store box starts at a negative row: the
    // first H200 test of this option, with m_offset = 191 and so a box at row -63, died with an illegal
    // instruction. Blocks of the first tile are now wholly below row 0 (skipped) or start at row >= 0.
    if (Traits::kRowOffset && p.is_causal) {
        kp.m_offset = (kp.num_m_blocks * Traits::kBlockM - p.seqlen_q) / Traits::kORows * Traits::kORows;
    }

    int const total_tiles = kp.num_m_blocks * p.num_heads * p.batch;
    int num_sms = p.num_sms;
    if (num_sms <= 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
    }
    int const grid = FwdTileScheduler::grid_size(total_tiles, num_sms, /*equal_tiles=*/!p.is_causal);

    auto kernel = &flash_fwd_kernel_sm90<Traits>;
    constexpr int smem_bytes = Traits::kSmemBytes;
    // Per device context; cheap, so set on every call (multi-GPU safe).
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    kernel<<<grid, Traits::kNumThreads, smem_bytes, stream>>>(kp);
}

template <typename Tag, int kHeadDim>
void run_fwd(FwdParams const& p, cudaStream_t stream) {
    using Element = typename ElementOf<Tag>::type;
    using CfgF = FwdTileConfig<kHeadDim, false>;
    using CfgC = FwdTileConfig<kHeadDim, true>;
    using TraitsF = FwdKernelTraits<kHeadDim, CfgF::kBlockM, CfgF::kBlockN, CfgF::kStages, Element, CfgF::kQStages,
                                    CfgF::kL2Prefetch>;
    using TraitsC = FwdKernelTraits<kHeadDim, CfgC::kBlockM, CfgC::kBlockN, CfgC::kStages, Element, CfgC::kQStages,
                                    CfgC::kL2Prefetch>;

    if (p.batch <= 0 || p.seqlen_q <= 0 || p.num_heads <= 0) { return; }
    // Identical configurations are one instantiation (same Traits type).
    if (p.is_causal) {
        launch_fwd<TraitsC>(p, stream);
    } else {
        launch_fwd<TraitsF>(p, stream);
    }
}

}  // namespace flash_dash
