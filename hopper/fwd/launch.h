// Host side of the forward: builds the TMA descriptors and the kernel's parameters, and launches the kernel of the
// call's mask (the configurations come from the generated translation units, hopper/generated/).
//
// Requirements the binding must check (TMA): q/k/v/out base pointers 16-byte aligned; every
// batch/row/head stride (in elements) a multiple of 8 for 16-bit types (16 bytes); last dim
// contiguous; q/k head_dim == kHeadDim, v/out head_dim == kHeadDimV; num_heads % num_heads_k == 0;
// lse contiguous (b, h, sq) fp32; all strides < 2^40 bytes and seqlens/heads/batch < 2^31 (TMA global dims are 32-bit).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <cuda_runtime.h>

#include "common/flash_params.h"
#include "common/launch_utils.h"
#include "common/softcap.hpp"
#include "fwd/kernel.h"
#include "fwd/traits.h"

namespace flash_dash {

// The prepare CTA of a packed launch (common/varlen.hpp), before the kernel on the same stream: the forward's tiles
// are the sequences' query blocks, longest first on causal masks; it also resets the kernel's claim counter.
template <class Traits>
void launch_varlen_prepare(FwdParams const& p, cudaStream_t stream) {
    static_assert(Traits::kBlockM >= kVarlenMinRows, "the binding sizes the tile table for kVarlenMinRows-row blocks");
    VarlenTiling const tiling{Traits::kBlockM, p.num_heads, p.num_heads_k, /*key_blocks=*/false,
                              p.is_causal ? kVarlenLongestFirst : kVarlenHeadsOuter, Traits::kBlockM, Traits::kBlockN,
                              /*grid=*/1};
    varlen_prepare_kernel<kVarlenPrepareThreads><<<1, kVarlenPrepareThreads, 0, stream>>>(p.varlen, p.batch, p.seqlen_q, p.seqlen_k, tiling);
    check_launch("varlen prepare kernel");
}

template <class Traits, bool kWindow, bool kSink, bool kSoftcap>
void launch_fwd_kernel(FwdParams const& p, cudaStream_t stream, bool l2_prefetch) {
    using namespace cute;
    using Element = typename Traits::Element;
    using GmemLayoutT = typename Traits::GmemLayoutT;
    bool const varlen = p.varlen.cu_seqlens_q != nullptr;
    int const batch = varlen ? 1 : p.batch;  // the descriptors' batch: a pack is one batch of packed rows

    auto gmem_layout = [](int seqlen, int head_dim, int heads, int batch, TensorStrides const& s) {
        return make_layout(make_shape(int32_t(seqlen), int32_t(head_dim), int32_t(heads), int32_t(batch)),
                           make_stride(int64_t(s.row), _1{}, int64_t(s.head), int64_t(s.batch)));
    };
    // seqlen_k == 0 still needs a valid K/V descriptor (no block is ever loaded): use 1 row.
    int const sk_desc = std::max(p.seqlen_k, 1);
    constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
    GmemLayoutT const lq = gmem_layout(p.seqlen_q, kHeadDim, p.num_heads, batch, p.q_stride);
    GmemLayoutT const lk = gmem_layout(sk_desc, kHeadDim, p.num_heads_k, batch, p.k_stride);
    GmemLayoutT const lv = gmem_layout(sk_desc, kHeadDimV, p.num_heads_k, batch, p.v_stride);
    GmemLayoutT const lo = gmem_layout(p.seqlen_q, kHeadDimV, p.num_heads, batch, p.o_stride);

    typename Traits::Params kp{
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutQStage, Traits::kBlockM, kHeadDim>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.q), lq),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutKStage, Traits::kBlockN, kHeadDim>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.k), lk),
        Traits::template make_tma<SM90_TMA_LOAD, typename Traits::SmemLayoutVStage, Traits::kBlockN, kHeadDimV>(
            SM90_TMA_LOAD{}, static_cast<Element const*>(p.v), lv),
        Traits::template make_tma<SM90_TMA_STORE, typename Traits::SmemLayoutOStage, Traits::kORows, kHeadDimV>(
            SM90_TMA_STORE{}, static_cast<Element*>(p.out), lo),
        p.lse,
        p.seqlen_q,
        p.seqlen_k,
        p.num_heads,
        p.num_heads_k,
        batch,
        std::max(1, p.num_heads / std::max(1, p.num_heads_k)),
        (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM,
        // The softcap kernels' softmax sees tanh(S * softcap_prescale): its units are softcap's (Traits::Params).
        kSoftcap ? p.softcap : p.softmax_scale,
        float(double(kSoftcap ? p.softcap : p.softmax_scale) * 1.4426950408889634),  // log2(e)
        p.is_causal,
        p.window_left,
        p.window_right,
        p.sink,
        static_cast<Element*>(p.out),
        int64_t(p.o_stride.row),
        int64_t(p.o_stride.head),
        int64_t(p.o_stride.batch),
        0,
        Traits::kL2Prefetch && l2_prefetch,
        kSoftcap ? float(double(p.softmax_scale) / double(p.softcap)) : 0.f,
        nullptr,  // the varlen views, table, count and claim counter: set below for a packed launch
        nullptr,
        nullptr,
        nullptr,
    };
    // A multiple of the O store's row block, so that no TMA store box starts at a negative row: the
    // first H200 test of this option, with m_offset = 191 and so a box at row -63, died with an illegal
    // instruction. Blocks of the first tile are now wholly below row 0 (skipped) or start at row >= 0.
    // (Packed sequences take theirs on the device, Traits::seq_of.)
    if (p.is_causal) { kp.m_offset = Traits::causal_m_offset(p.seqlen_q); }

    if (varlen) {
        VarlenWorkspace const w = varlen_workspace(p.varlen.workspace, p.batch);
        kp.varlen_seqs = w.seqs;
        kp.varlen_tiles = w.tiles;
        kp.varlen_num_tiles = w.num_tiles;
        kp.varlen_claims = w.claims;
        launch_varlen_prepare<Traits>(p, stream);
        // The table's size is known on the device only: launch for its upper bound (idle CTAs exit at once; the
        // others claim the tiles after the first grid's).
        int64_t const capacity = varlen_tile_capacity(p.seqlen_q, p.batch, Traits::kBlockM, p.num_heads);
        int const grid = int(std::max<int64_t>(1, std::min<int64_t>(capacity, p.num_sms)));
        constexpr auto kernel = &flash_fwd_kernel_sm90<Traits, kWindow, kSink, kSoftcap, true>;
        allow_dynamic_smem<kernel>(Traits::kSmemBytes);
        kernel<<<grid, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(kp);
        check_launch("varlen forward kernel");
        return;
    }
    int const total_tiles = kp.num_m_blocks * p.num_heads * p.batch;
    int const grid = FwdTileScheduler::grid_size(total_tiles, p.num_sms, /*equal_tiles=*/!p.is_causal);

    constexpr auto kernel = &flash_fwd_kernel_sm90<Traits, kWindow, kSink, kSoftcap, false>;
    allow_dynamic_smem<kernel>(Traits::kSmemBytes);
    kernel<<<grid, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(kp);
    check_launch("forward kernel");
}

// The kernel with or without the learnable sink's finalize (softcap kernels: with one only where the variant table
// builds it; softcap_error has refused the call otherwise).
template <class Traits, bool kWindow, bool kSoftcap>
void launch_fwd_sink(FwdParams const& p, cudaStream_t stream, bool l2_prefetch) {
    if (p.sink != nullptr) {
        if constexpr (!kSoftcap || kSoftcapWithSink) {
            launch_fwd_kernel<Traits, kWindow, true, kSoftcap>(p, stream, l2_prefetch);
        }
    } else {
        launch_fwd_kernel<Traits, kWindow, false, kSoftcap>(p, stream, l2_prefetch);
    }
}

// The kernel of the call's mask; a softcap with a sliding window only where the variant table builds it.
template <class Full, class Causal, bool kSoftcap>
void launch_fwd_mask(FwdParams const& p, cudaStream_t stream, bool l2_prefetch_full, bool l2_prefetch_causal,
                     bool sliding) {
    if (sliding) {
        if constexpr (!kSoftcap || kSoftcapWithWindow) {
            launch_fwd_sink<Causal, true, kSoftcap>(p, stream, l2_prefetch_causal);
        }
    } else if (p.is_causal) {
        launch_fwd_sink<Causal, false, kSoftcap>(p, stream, l2_prefetch_causal);
    } else {
        launch_fwd_sink<Full, false, kSoftcap>(p, stream, l2_prefetch_full);
    }
}

// The forward of one head dim and dtype: Full and Causal are the kernels of the two masks (one type when the
// variant table gives both the same configuration; sliding windows run Causal's configuration with the window's
// bounds compiled in, a softcap either mask's with the tanh compiled in); l2_prefetch_* say whether launches of that
// mask prefetch each CTA's next tile into L2 (flash_attn_dash/variants.py, FwdTile.l2_prefetch).
template <class Full, class Causal>
void launch_fwd(FwdParams const& p, cudaStream_t stream, bool l2_prefetch_full, bool l2_prefetch_causal) {
    bool const sliding = p.is_causal && is_sliding_window(p.window_left, p.window_right);
    if (char const* why = softcap_error(p.softcap, sliding, p.sink != nullptr)) { throw std::invalid_argument(why); }
    if (p.batch <= 0 || p.seqlen_q <= 0 || p.num_heads <= 0) { return; }
    if (p.softcap > 0.f) {
        launch_fwd_mask<Full, Causal, true>(p, stream, l2_prefetch_full, l2_prefetch_causal, sliding);
    } else {
        launch_fwd_mask<Full, Causal, false>(p, stream, l2_prefetch_full, l2_prefetch_causal, sliding);
    }
}

}  // namespace flash_dash
