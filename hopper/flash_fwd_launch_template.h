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
#include <cuda_runtime.h>

#include "flash_fwd_kernel_sm90.h"
#include "flash_params.h"
#include "kernel_api.h"
#include "kernel_traits_fwd.h"

namespace flash_dash {

// Tile configuration per head dim: kBlockM x kBlockN, K/V stages. 128 x 128 uses only base
// GMMA shapes (no CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED), 2 consumer warpgroups of 64 rows.
template <int kHeadDim>
struct FwdTileConfig {
    static constexpr int kBlockM = 128;
    static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
    static constexpr int kStages = kHeadDim <= 64 ? 3 : 2;
};

template <typename Tag, int kHeadDim>
void run_fwd(FwdParams const& p, cudaStream_t stream) {
    using namespace cute;
    using Element = typename ElementOf<Tag>::type;
    using Cfg = FwdTileConfig<kHeadDim>;
    using Traits = FwdKernelTraits<kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Element>;
    using GmemLayoutT = typename Traits::GmemLayoutT;

    if (p.batch <= 0 || p.seqlen_q <= 0 || p.num_heads <= 0) { return; }

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
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutQ, Traits::kBlockM>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.q), lq),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutKVStage, Traits::kBlockN>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.k), lk),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutKVStage, Traits::kBlockN>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.v), lv),
        Traits::template make_tma<SM90_TMA_STORE, typename Traits::SmemLayoutO, Traits::kBlockM>(
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
    };

    int const total_tiles = kp.num_m_blocks * p.num_heads * p.batch;
    int num_sms = p.num_sms;
    if (num_sms <= 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
    }
    int const grid = std::max(1, std::min(num_sms, total_tiles));

    auto kernel = &flash_fwd_kernel_sm90<Traits>;
    constexpr int smem_bytes = Traits::kSmemBytes;
    // Per device context; cheap, so set on every call (multi-GPU safe).
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    kernel<<<grid, Traits::kNumThreads, smem_bytes, stream>>>(kp);
}

}  // namespace flash_dash
